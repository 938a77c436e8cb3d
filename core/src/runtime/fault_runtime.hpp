#pragma once
// FaultInjectingRuntime: a DeviceRuntime decorator (a ForwardingRuntime) that forwards to another
// runtime and injects failures on demand, so tests drive registration and copy failures without a
// GPU. It also counts what passes through (batches per path, descriptors) for tests that check the
// engine's choices.

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <kvoffload/device_runtime.hpp>

namespace kvoffload {

struct FaultPlan {
  // Registration: the first `fail_registrations` register_host calls fail (-1: all of them).
  int fail_registrations = 0;
  // Registration: the register_host call with this 0-based index fails (a piece k of a
  // progressive bring-up); -1: none.
  int fail_registration_at = -1;
  // Called after every successful registration (true) and before every unregistration (false)
  // with the registered host range, so a test can record the order of calls and check that the
  // range is still mapped when it is unregistered. Must not throw.
  std::function<void(bool registered, const void* host, std::size_t bytes)> on_registration;
  // Copies: the batch with this 0-based index (counting every enqueue_copies call) fails; -1: none.
  std::int64_t fail_batch = -1;
  // Copies: any batch with a descriptor whose host- or device-side range overlaps [begin, end)
  // fails (a chosen job's blocks); empty range: none.
  std::uintptr_t fail_range_begin = 0;
  std::uintptr_t fail_range_end = 0;
  // false: enqueue_copies throws (a launch error). true: the enqueue succeeds and the next event
  // recorded on that stream reports the error from query/synchronize (an asynchronous fault).
  bool async = false;
  // Timing: >= 0 answers every elapsed_seconds call with this copy time (a figure a test knows
  // exactly, where the real one is a few microseconds); < 0: the inner runtime's measurement.
  double elapsed_seconds = -1;
};

class FaultInjectingRuntime final : public ForwardingRuntime {
 public:
  // `inner` must outlive this decorator.
  explicit FaultInjectingRuntime(DeviceRuntime& inner, FaultPlan plan = {});

  void set_plan(const FaultPlan& plan);

  [[nodiscard]] std::uint64_t batches() const noexcept { return batches_.load(); }
  [[nodiscard]] std::uint64_t kernel_batches() const noexcept { return kernel_batches_.load(); }
  [[nodiscard]] std::uint64_t dma_batches() const noexcept { return dma_batches_.load(); }
  [[nodiscard]] std::uint64_t last_batch_descriptors() const noexcept {
    return last_batch_descriptors_.load();
  }
  [[nodiscard]] std::uint64_t injected_copy_failures() const noexcept {
    return injected_copy_failures_.load();
  }
  [[nodiscard]] std::uint64_t injected_registration_failures() const noexcept {
    return injected_reg_failures_.load();
  }

 protected:
  RegistrationRecord do_register_host(void* ptr, std::size_t bytes, std::size_t align) override;
  bool do_unregister_host(std::uintptr_t handle) noexcept override;
  void do_destroy_event(std::uintptr_t event) noexcept override;
  void do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                         CopyKind kind, CopyPath path) override;
  void do_record_event(std::uintptr_t event, std::uintptr_t stream) override;
  bool do_query_event(std::uintptr_t event) override;
  void do_synchronize_event(std::uintptr_t event) override;
  double do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) override {
    // The inner runtime's errors stay errors.
    const double measured = ForwardingRuntime::do_elapsed_seconds(start, end);
    std::lock_guard lock(mutex_);
    return plan_.elapsed_seconds >= 0 ? plan_.elapsed_seconds : measured;
  }

 private:
  void check_poisoned(std::uintptr_t event);

  std::mutex mutex_;
  FaultPlan plan_;
  int registrations_seen_ = 0;
  // Host range of every live registration, for FaultPlan::on_registration.
  std::unordered_map<std::uintptr_t, std::pair<const void*, std::size_t>> registered_;
  std::unordered_set<std::uintptr_t> faulted_streams_;  // next record on them poisons the event
  std::unordered_set<std::uintptr_t> poisoned_events_;
  std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> kernel_batches_{0};
  std::atomic<std::uint64_t> dma_batches_{0};
  std::atomic<std::uint64_t> last_batch_descriptors_{0};
  std::atomic<std::uint64_t> injected_copy_failures_{0};
  std::atomic<std::uint64_t> injected_reg_failures_{0};
};

}  // namespace kvoffload
