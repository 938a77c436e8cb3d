// The GPU runtime's streams and events, host functions and host flags: each a vendor call made
// under the device guard (Note [Device guard] in gpu_runtime.cpp); queries, synchronizes and
// elapsed-time reads also in thread-local capture mode (Note [Thread-local capture mode] in
// gpu_runtime_internal.hpp).
#include <memory>
#include <mutex>
#include <utility>

#include <kvoffload/error.hpp>

#include "runtime/gpu/gpu_runtime_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu {

std::uintptr_t GpuRuntime::do_create_stream() {
  Guard guard(api_, device_);
  void* stream = nullptr;
  check_vendor(api_, api_.stream_create(ctx_, &stream), "stream_create");
  return reinterpret_cast<std::uintptr_t>(stream);
}

void GpuRuntime::do_destroy_stream(std::uintptr_t stream) noexcept {
  Guard guard(api_, device_, std::nothrow);
  ThreadLocalCapture capture_mode(api_);
  // Pending work finishes first, so descriptors and buffers it reads stay valid until then.
  if (api_.stream_synchronize(ctx_, to_ptr(stream)) != 0) (void)api_.get_last_error(ctx_);
  std::unique_ptr<Ring> ring;
  {
    std::lock_guard lock(rings_mu_);
    if (auto it = rings_.find(to_ptr(stream)); it != rings_.end()) {
      ring = std::move(it->second);
      rings_.erase(it);
    }
  }
  if (ring) {
    RelaxedCapture relaxed(api_);
    destroy_ring(*ring, to_ptr(stream), /*stream_alive=*/true);
    // The stream-ordered frees of the ring's device buffers run before the stream goes away.
    if (api_.stream_synchronize(ctx_, to_ptr(stream)) != 0) (void)api_.get_last_error(ctx_);
  }
  if (api_.stream_destroy(ctx_, to_ptr(stream)) != 0) (void)api_.get_last_error(ctx_);
}

std::uintptr_t GpuRuntime::do_create_event(bool timing) {
  Guard guard(api_, device_);
  void* event = nullptr;
  // Blocking sync: the engine's waits and synchronize_event sleep instead of spinning a core.
  check_vendor(api_,
               api_.event_create(ctx_, &event, kEventBlockingSync | (timing ? kEventTiming : 0)),
               "event_create");
  return reinterpret_cast<std::uintptr_t>(event);
}

void GpuRuntime::do_destroy_event(std::uintptr_t event) noexcept {
  Guard guard(api_, device_, std::nothrow);
  if (api_.event_destroy(ctx_, to_ptr(event)) != 0) (void)api_.get_last_error(ctx_);
}

void GpuRuntime::do_record_event(std::uintptr_t event, std::uintptr_t stream) {
  Guard guard(api_, device_);  // stream 0 means the current device's legacy stream
  check_vendor(api_, api_.event_record(ctx_, to_ptr(event), to_ptr(stream)), "event_record");
}

void GpuRuntime::do_wait_event(std::uintptr_t stream, std::uintptr_t event) {
  Guard guard(api_, device_);
  check_vendor(api_, api_.stream_wait_event(ctx_, to_ptr(stream), to_ptr(event)),
               "stream_wait_event");
}

bool GpuRuntime::do_query_event(std::uintptr_t event) {
  Guard guard(api_, device_);
  ThreadLocalCapture capture_mode(api_);
  const int err = api_.event_query(ctx_, to_ptr(event));
  if (err == 0) return true;
  if (err == api_.err_not_ready) {
    (void)api_.get_last_error(ctx_);
    return false;
  }
  throw_vendor(api_, err, "event_query", "(work before the event failed)");
}

void GpuRuntime::do_synchronize_event(std::uintptr_t event) {
  Guard guard(api_, device_);
  ThreadLocalCapture capture_mode(api_);
  check_vendor(api_, api_.event_synchronize(ctx_, to_ptr(event)), "event_synchronize");
}

void GpuRuntime::do_synchronize_stream(std::uintptr_t stream) {
  Guard guard(api_, device_);
  ThreadLocalCapture capture_mode(api_);
  check_vendor(api_, api_.stream_synchronize(ctx_, to_ptr(stream)), "stream_synchronize");
}

bool GpuRuntime::do_stream_capturing(std::uintptr_t stream) {
  Guard guard(api_, device_);
  int capturing = 0;
  const int err = api_.stream_capturing(ctx_, to_ptr(stream), &capturing);
  if (err == 0) return capturing != 0;
  if (err == api_.err_capture_implicit) {  // the legacy stream, with a blocking stream capturing
    (void)api_.get_last_error(ctx_);
    return true;
  }
  throw_vendor(api_, err, "stream_capturing");
}

double GpuRuntime::do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) {
  Guard guard(api_, device_);
  ThreadLocalCapture capture_mode(api_);
  float ms = 0.0F;
  check_vendor(api_, api_.event_elapsed_ms(ctx_, &ms, to_ptr(start), to_ptr(end)),
               "event_elapsed_ms");
  return static_cast<double>(ms) / 1e3;
}

void GpuRuntime::do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) {
  Guard guard(api_, device_);
  check_vendor(api_, api_.launch_host_func(ctx_, to_ptr(stream), fn, arg), "launch_host_func");
}

void GpuRuntime::do_wait_host_flag(std::uintptr_t stream, const std::uint32_t* flag,
                                   std::uint32_t value) {
  Guard guard(api_, device_);
  check_vendor(
      api_, api_.stream_wait_value32(ctx_, to_ptr(stream), const_cast<std::uint32_t*>(flag), value),
      "stream_wait_value32");
}

std::uint32_t* GpuRuntime::do_create_host_flag() {
  Guard guard(api_, device_);
  RelaxedCapture relaxed(api_);
  std::uint32_t* flag = nullptr;
  check_vendor(api_, api_.flag_alloc(ctx_, &flag), "flag_alloc");
  std::atomic_ref<std::uint32_t>(*flag).store(0, std::memory_order_release);
  return flag;
}

void GpuRuntime::do_destroy_host_flag(std::uint32_t* flag) noexcept {
  Guard guard(api_, device_, std::nothrow);
  RelaxedCapture relaxed(api_);
  if (const int err = api_.flag_free(ctx_, flag); err != 0) {
    (void)api_.get_last_error(ctx_);
    log_noexcept(spdlog::level::err, "{}: flag_free({}) failed: {}", api_.name,
                 static_cast<void*>(flag), api_.error_name(ctx_, err));
  }
}

}  // namespace kvoffload::gpu
