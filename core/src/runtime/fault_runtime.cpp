#include "runtime/fault_runtime.hpp"

#include <utility>

#include <kvoffload/error.hpp>

namespace kvoffload {

FaultInjectingRuntime::FaultInjectingRuntime(DeviceRuntime& inner, FaultPlan plan)
    : ForwardingRuntime(inner), plan_(std::move(plan)) {}

void FaultInjectingRuntime::set_plan(const FaultPlan& plan) {
  std::lock_guard lock(mutex_);
  plan_ = plan;
  registrations_seen_ = 0;
}

DeviceRuntime::RegistrationRecord FaultInjectingRuntime::do_register_host(void* ptr,
                                                                          std::size_t bytes,
                                                                          std::size_t align) {
  {
    std::lock_guard lock(mutex_);
    const int n = registrations_seen_++;
    if (plan_.fail_registrations < 0 || n < plan_.fail_registrations ||
        n == plan_.fail_registration_at) {
      ++injected_reg_failures_;
      throw Error(ErrorCode::kDevice,
                  "injected fault: host registration " + std::to_string(n) + " refused", 0,
                  "register_host");
    }
  }
  RegistrationRecord record = ForwardingRuntime::do_register_host(ptr, bytes, align);
  std::function<void(bool, const void*, std::size_t)> observe;
  {
    std::lock_guard lock(mutex_);
    registered_[record.handle] = {ptr, bytes};
    observe = plan_.on_registration;
  }
  if (observe) observe(true, ptr, bytes);
  return record;
}

bool FaultInjectingRuntime::do_unregister_host(std::uintptr_t handle) noexcept {
  std::pair<const void*, std::size_t> range{nullptr, 0};
  std::function<void(bool, const void*, std::size_t)> observe;
  {
    std::lock_guard lock(mutex_);
    if (auto it = registered_.find(handle); it != registered_.end()) {
      range = it->second;
      registered_.erase(it);
    }
    observe = plan_.on_registration;
  }
  if (observe) observe(false, range.first, range.second);
  return ForwardingRuntime::do_unregister_host(handle);
}

void FaultInjectingRuntime::do_enqueue_copies(std::uintptr_t stream,
                                              std::span<const CopyDescriptor> batch, CopyKind kind,
                                              CopyPath path) {
  const std::uint64_t index = batches_++;
  ++(path == CopyPath::kKernel ? kernel_batches_ : dma_batches_);
  last_batch_descriptors_ = batch.size();
  bool fail = false;
  bool async = false;
  {
    std::lock_guard lock(mutex_);
    fail = plan_.fail_batch >= 0 && static_cast<std::uint64_t>(plan_.fail_batch) == index;
    if (!fail && plan_.fail_range_begin < plan_.fail_range_end) {
      auto overlaps = [&](const void* p, std::uint64_t n) {
        const auto b = reinterpret_cast<std::uintptr_t>(p);
        return b < plan_.fail_range_end && plan_.fail_range_begin < b + n;
      };
      for (const CopyDescriptor& d : batch) {
        if (overlaps(d.src, d.bytes) || overlaps(d.dst, d.bytes)) {
          fail = true;
          break;
        }
      }
    }
    async = plan_.async;
    if (fail && async) faulted_streams_.insert(stream);
  }
  if (fail) {
    ++injected_copy_failures_;
    if (!async)
      throw Error(ErrorCode::kDevice, "injected fault: copy batch launch failed", 0,
                  "enqueue_copies");
    return;  // the bytes are not copied; the next event on this stream reports the fault
  }
  ForwardingRuntime::do_enqueue_copies(stream, batch, kind, path);
}

void FaultInjectingRuntime::do_record_event(std::uintptr_t event, std::uintptr_t stream) {
  {
    std::lock_guard lock(mutex_);
    if (faulted_streams_.erase(stream) != 0) {
      poisoned_events_.insert(event);
    } else {
      poisoned_events_.erase(event);  // a new record starts clean
    }
  }
  ForwardingRuntime::do_record_event(event, stream);
}

void FaultInjectingRuntime::check_poisoned(std::uintptr_t event) {
  std::lock_guard lock(mutex_);
  if (poisoned_events_.contains(event)) {
    throw Error(ErrorCode::kDevice, "injected fault: asynchronous copy failure (illegal address)",
                0, "event_query");
  }
}

bool FaultInjectingRuntime::do_query_event(std::uintptr_t event) {
  const bool done = ForwardingRuntime::do_query_event(event);
  if (done) check_poisoned(event);
  return done;
}

void FaultInjectingRuntime::do_synchronize_event(std::uintptr_t event) {
  ForwardingRuntime::do_synchronize_event(event);
  check_poisoned(event);
}

void FaultInjectingRuntime::do_destroy_event(std::uintptr_t event) noexcept {
  {
    std::lock_guard lock(mutex_);
    poisoned_events_.erase(event);
  }
  ForwardingRuntime::do_destroy_event(event);
}

}  // namespace kvoffload
