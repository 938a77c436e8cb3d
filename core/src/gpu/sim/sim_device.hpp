#pragma once
// The simulated device: a vendor table (gpu/vendor_api.hpp) implemented on the CPU with a GPU's
// semantics, so that the one GPU runtime runs — and is tested — without a GPU.
//
// Note [Simulated device]
// - Streams are ordered queues run by one worker thread each; events, host functions, waits on
//   events and on host flags, async memcpy, batched memcpy and kernel launches are asynchronous,
//   ordered per stream, and ordered across streams only through events.
// - Device memory lives at addresses the host cannot dereference: a PROT_NONE reservation. The
//   simulator copies through a private read-write alias of it, so a host read or write of a
//   device pointer crashes, exactly as it would with a GPU.
// - The simulator is the MMU: its copy engine and its kernel launches translate device addresses
//   (device allocations, registered and pinned host memory) to host addresses; an address it
//   cannot translate is an illegal access that poisons the device with a sticky error, as on a
//   GPU. The kernel's descriptors are rewritten to host addresses before its body runs.
// - The copy kernel runs from its own source (kernels/copy_kernels.cu), compiled for the host
//   through compat.hpp and executed CTA by CTA with one host thread per GPU thread and a barrier
//   for __syncthreads, so its indexing, alignment and tail logic run on the CPU.
// - Batched memcpy with source order ANY may read its sources at the call, before earlier work
//   in the stream (the header allows it); the simulator does exactly that, so relying on ANY
//   where it is not allowed reads stale bytes here too.
// - The driver-level batch call needs a context bound on the calling thread (set_device), and a
//   thread that never set a device reports device 0 (as CUDA does).
// - Fault knobs let tests refuse batches, fail launches, leave a stale error in a thread's
//   last-error slot before a launch, fail registration at piece N, fail a device-pointer query,
//   fail the Nth memcpy enqueue, and delay every stream operation.
#include "gpu/vendor_api.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvoffload::gpu::sim {

struct SimOptions {
  int device_count = 1;
  std::size_t device_memory_bytes = std::size_t{8} << 30;  // reserved address space, not RAM
  // false: registered host memory gets its own device address (as ROCm may do), so kernels must
  // use the device pointer of a registration; true: device pointer == host pointer (CUDA UVA).
  bool unified_addressing = true;
  // A batched-DMA entry point (cuMemcpyBatchAsync-like); false: the runtime has none.
  bool batch_memcpy = true;
  // The Nth host registration of this device fails (1-based; 0: none), as a GPU that refuses
  // registration does (SimFaults::fail_register_at, from the start). For processes a test
  // cannot reach into, such as the ranks of `kvoffload run`.
  int fail_register_at = 0;
  // Defaults from the environment: KVOFFLOAD_SIM_DEVICES, KVOFFLOAD_SIM_FAIL_REGISTER_AT.
  static SimOptions from_env();
};

// Knobs tests turn while the device runs (all atomics).
struct SimFaults {
  std::atomic<int> refuse_batches{0};     // refuse the next N batch calls ...
  std::atomic<int> refuse_batch_code{1};  // ... with this code (1 invalid value, 801 not supported)
  std::atomic<int> fail_launches{0};      // the next N kernel launches fail (701)
  std::atomic<int> stale_error_before_launch{
      0};                                   // set this error in the launching thread's slot first
  std::atomic<int> fail_register_at{0};     // the Nth host_register call from now fails (1-based)
  std::atomic<int> fail_device_pointer{0};  // the next N host_device_pointer calls fail
  std::atomic<int> fail_memcpy_at{0};       // the Nth memcpy_async enqueue from now fails
  std::atomic<int> op_delay_us{0};          // every stream operation sleeps this long first
  std::atomic<int> legacy_capturing{0};     // the legacy stream reports a capture
};

// What the device saw.
struct SimCounters {
  std::atomic<std::uint64_t> batch_calls{0};
  std::atomic<std::uint64_t> batch_refused{0};
  std::atomic<std::uint64_t> memcpy_calls{0};
  std::atomic<std::uint64_t> kernel_launches{0};
  std::atomic<std::uint64_t> kernel_ctas{0};
  std::atomic<std::uint64_t> host_register_calls{0};
  std::atomic<std::int64_t> live_registrations{0};
  std::atomic<std::int64_t> live_device_allocations{0};
  std::atomic<std::uint64_t> device_syncs{0};  // device-wide synchronizations (a blocking free)
  std::atomic<std::uint64_t> illegal_accesses{0};
};

class SimDevice {
 public:
  explicit SimDevice(SimOptions options = {});
  ~SimDevice();
  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  // The vendor table over this device; valid while the device lives.
  [[nodiscard]] const VendorApi& api() const noexcept;
  [[nodiscard]] SimFaults& faults() noexcept;
  [[nodiscard]] const SimCounters& counters() const noexcept;
  // The sticky error (0 when none), and the text of the access that caused it.
  [[nodiscard]] int sticky_error() const noexcept;
  [[nodiscard]] std::string sticky_reason() const;
  // Whether `ptr` lies in the device address range (host code must not dereference it).
  [[nodiscard]] bool is_device_address(const void* ptr) const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The process-wide device behind make_runtime("sim") (SimOptions::from_env()).
std::shared_ptr<SimDevice> default_device();

}  // namespace kvoffload::gpu::sim
