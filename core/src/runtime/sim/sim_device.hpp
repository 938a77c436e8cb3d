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
//   cannot translate, or device memory of another device, is an illegal access that poisons the
//   device with a sticky error, as on a GPU. The kernel's descriptors are rewritten to host
//   addresses before its body runs.
// - The copy kernel runs from its own source (kernels/copy_kernels.cu), compiled for the host
//   through compat.hpp and executed CTA by CTA with one fiber per GPU thread and a barrier for
//   __syncthreads, so its indexing, alignment and tail logic run on the CPU. A 16-byte vector
//   access at an address that is not 16-byte aligned faults (misaligned address, sticky) and
//   stops the kernel, as on a GPU; so does an 8-, 4- or 2-byte word access at an address that is
//   not a multiple of its size (the kernel's narrow path, kvo_copy_word).
// - Batched memcpy with source order ANY may read its sources at the call, before earlier work
//   in the stream (the header allows it); the simulator does exactly that, so relying on ANY
//   where it is not allowed reads stale bytes here too.
// - A memcpy to or from pageable (unregistered) host memory synchronizes: it returns once the
//   stream's earlier work and the copy itself are done (the CUDA runtime's "API synchronization
//   behavior": pageable memory is staged, and the driver synchronizes with the stream for it).
// - Contexts are per device (Note [Simulated contexts] in sim_device.cpp): set_device creates and
//   binds one, as cudaSetDevice does since CUDA 12, and the first context-needing call on a
//   thread that never chose a device binds device 0's. A kernel launched into another device's
//   stream, or an event recorded on another device's stream, is refused (the CUDA programming
//   guide's rules for streams and events of several devices). Counters per device let a test
//   assert that a runtime never touched device 0.
// - Stream capture: a capturing stream records nodes instead of running them; an event recorded
//   during a capture pulls any stream that waits on it into that capture (CUDA's cross-stream
//   rule), and ending a capture with such a stream not joined back fails (unjoined) and
//   invalidates it. Potentially unsafe calls (register, malloc, free, and event queries and
//   synchronizes, stream synchronizes and elapsed-time reads, as PyTorch's caching allocator
//   treats cudaEventQuery) are refused and invalidate the capture, under cudaStreamCaptureMode's
//   rules: the calling thread's own capture unless that thread is in relaxed mode, and a
//   global-mode capture of another thread when the caller is in global mode; synchronizing a
//   capturing stream is refused and invalidates it; the legacy stream used while a blocking
//   stream captures is refused (implicit). Memory device_malloc_async hands out on a capturing
//   stream belongs to that capture's graph, which the simulator never launches: a copy or
//   kernel that touches it afterwards faults with an illegal address (700).
// - After a sticky error every call returns it at once (event_query included, even while earlier
//   work is still queued), no more copies or kernels run, and host functions are skipped: CUDA
//   never calls a host function after a context error (cudaLaunchHostFunc's documentation).
// - HIP's differences are knobs (SimOptions): host functions still run after an error
//   (hipStreamAddCallback passes the error to them), and hipStreamWaitValue32 accepts only
//   signal memory.
// - Stricter where a GPU is (issue 25): destroying a stream returns before its work ends (a
//   thread of its own drains it; device synchronization waits for it); a pinned free
//   (host_free, flag_free) synchronizes the device, as cudaFreeHost does; a batched copy (a
//   driver call) into another device's stream is refused (invalid handle); an event last
//   recorded in a capture that has ended cannot be waited on, queried, synchronized or timed
//   (cudaErrorCapturedEvent, 907) until it is recorded again outside a capture.
// - A host wait (event_synchronize) on an unfinished event created without blocking sync spins
//   a core on a GPU: counted (SimCounters::spinning_waits).
// - A device without memory pools (SimOptions::memory_pools false) refuses stream-ordered
//   allocation with "not supported" (801), as cudaMallocAsync does where
//   cudaDevAttrMemoryPoolsSupported is 0.
// - A driver older than the runtime's major version (CUDA's minor-version compatibility floor)
//   makes get_device_count fail with "insufficient driver", as CUDA does.
// - Fault knobs let tests refuse batches, fail launches, leave a stale error in a thread's
//   last-error slot before a launch, fail registration at piece N, fail a device-pointer query,
//   fail the Nth memcpy enqueue, fail event records, fail a flag wait with a driver code, and
//   delay every stream operation.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/gpu/vendor_api.hpp"

namespace kvoffload::gpu::sim {

struct SimOptions {
  int device_count = 1;
  std::size_t device_memory_bytes = std::size_t{8} << 30;  // reserved address space, not RAM
  // false: registered host memory gets its own device address (as ROCm may do), so kernels must
  // use the device pointer of a registration; true: device pointer == host pointer (CUDA UVA).
  bool unified_addressing = true;
  // A batched-DMA entry point (cuMemcpyBatchAsync-like); false: the runtime has none.
  bool batch_memcpy = true;
  // Stream-ordered allocation (cudaMallocAsync / cudaFreeAsync); false: the runtime has none.
  bool async_allocator = true;
  // false: the stream-ordered calls exist but the device has no memory pools
  // (cudaDevAttrMemoryPoolsSupported 0, some vGPUs): they answer "not supported" (801).
  bool memory_pools = true;
  // Versions in CUDA's encoding (1000 * major + 10 * minor). A driver older than the runtime's
  // major (13000 for 13.x) makes get_device_count fail with "insufficient driver" (35).
  int driver_version = 13000;
  int runtime_version = 13000;
  // The architecture every device reports, and those the copy kernel was "built" for
  // (";"-separated; matched exactly, as HIP code objects are).
  std::string device_arch = "sim";
  std::string kernel_archs = "sim";
  // HIP semantics where HIP and CUDA differ (docs/DESIGN.md §4.5: CUDA's by default).
  bool host_funcs_after_error = false;          // hipStreamAddCallback runs callbacks after errors
  bool wait_value_needs_signal_memory = false;  // hipStreamWaitValue32: signal memory only
  // Compute mode EXCLUSIVE_PROCESS: a device's context can exist in one process at a time (the
  // processes of one machine coordinate through a lock file per device in `lock_dir`); another
  // process asking for it gets "devices unavailable" (46). Contexts live until the process exits.
  bool exclusive_process = false;
  std::string lock_dir;
  // When set, every context creation appends "pid <pid> device <d>" to this file.
  std::string context_log;
  // When set, every successful host registration appends "pid <pid> device <d> bytes <n>" to
  // this file (what each process registered, as the device saw it).
  std::string register_log;
  // The Nth host registration of this device fails (1-based; 0: none), as a GPU that refuses
  // registration does (SimFaults::fail_register_at, from the start). For processes a test
  // cannot reach into, such as the ranks of `kvoffload run`.
  int fail_register_at = 0;
  // Only host registrations on this device count toward fail_register_at (-1: every device's), so
  // one rank of a run can fail its bring-up while the others complete theirs.
  int fail_register_device = -1;
  // Every host registration (on fail_register_device only, when it is set) takes this long first
  // (a driver pinning memory slowly), so a test can watch a bring-up that is still under way.
  int register_delay_ms = 0;
  // Defaults from the environment: KVOFFLOAD_SIM_DEVICES (count), KVOFFLOAD_SIM_FAIL_REGISTER_AT,
  // KVOFFLOAD_SIM_FAIL_REGISTER_DEVICE, KVOFFLOAD_SIM_REGISTER_DELAY_MS,
  // KVOFFLOAD_SIM_COMPUTE_MODE (default | exclusive_process) with KVOFFLOAD_SIM_LOCK_DIR,
  // KVOFFLOAD_SIM_CONTEXT_LOG, KVOFFLOAD_SIM_DRIVER_VERSION, KVOFFLOAD_SIM_ARCH and
  // KVOFFLOAD_SIM_KERNEL_ARCHS.
  static SimOptions from_env();
  // CUDA's semantics with HIP's differences switched on.
  static SimOptions hip_semantics();
};

// Knobs tests turn while the device runs (all atomics).
struct SimFaults {
  std::atomic<int> refuse_batches{0};     // refuse the next N batch calls ...
  std::atomic<int> refuse_batch_code{1};  // ... with this code (1 invalid value, 801 not supported)
  std::atomic<int> fail_launches{0};      // the next N kernel launches fail (701)
  std::atomic<int> stale_error_before_launch{
      0};                                     // set this error in the launching thread's slot first
  std::atomic<int> fail_register_at{0};       // the Nth host_register call from now fails (1-based)
  std::atomic<int> fail_register_device{-1};  // ... counting only this device's calls (-1: all)
  std::atomic<int> register_delay_ms{0};      // every host_register call sleeps this long first
  std::atomic<int> fail_device_pointer{0};    // the next N host_device_pointer calls fail
  std::atomic<int> fail_memcpy_at{0};         // the Nth memcpy_async enqueue from now fails
  std::atomic<int> fail_event_records{0};     // the next N event records fail (invalid value)
  std::atomic<int> fail_wait_value{0};        // the next flag wait fails with this driver code
  std::atomic<int> op_delay_us{0};            // every stream operation sleeps this long first
};

// What the device saw.
struct SimCounters {
  std::atomic<std::uint64_t> batch_calls{0};
  std::atomic<std::uint64_t> batch_refused{0};
  std::atomic<std::uint64_t> memcpy_calls{0};
  std::atomic<std::uint64_t> pageable_copies{0};  // copies that synchronized (pageable memory)
  std::atomic<std::uint64_t> kernel_launches{0};
  std::atomic<std::uint64_t> kernel_ctas{0};
  // The copy kernel's bytes in flight: over every group of loads of every thread, the bytes
  // moved and the bytes the group could move (kBatchCopyLoadsInFlight 16-byte vectors). Their
  // ratio is the share of a CTA's loads in flight that carry data (1: every lane busy).
  std::atomic<std::uint64_t> kernel_group_bytes{0};
  std::atomic<std::uint64_t> kernel_group_capacity{0};
  std::atomic<std::uint64_t> host_register_calls{0};
  std::atomic<std::int64_t> live_registrations{0};
  std::atomic<std::int64_t> live_device_allocations{0};
  std::atomic<std::uint64_t> device_syncs{0};  // device-wide synchronizations (a blocking free)
  std::atomic<std::uint64_t> pinned_free_syncs{0};  // of those, by pinned frees (cudaFreeHost)
  std::atomic<std::uint64_t> illegal_accesses{0};
  std::atomic<std::uint64_t> host_funcs_run{0};
  std::atomic<std::uint64_t> host_funcs_skipped{0};  // after a sticky error (CUDA)
  // cudaFreeAsync of memory cudaMallocAsync did not allocate (refused with invalid value).
  std::atomic<std::uint64_t> mismatched_frees{0};
  std::atomic<std::uint64_t> captures_invalidated{0};
  // Records of events created with timing (kEventTiming): each writes a timestamp on a GPU.
  std::atomic<std::uint64_t> timing_records{0};
  // device_malloc_async calls made on a capturing stream (allocation nodes of its graph).
  std::atomic<std::uint64_t> graph_allocations{0};
  // Host waits (event_synchronize) on an unfinished event created without kEventBlockingSync:
  // on a GPU each spins a core until the event completes.
  std::atomic<std::uint64_t> spinning_waits{0};
  std::atomic<std::uint64_t> host_waits{0};  // every such wait, spinning or not
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

  // Per device: whether its (primary) context was created, and how many runtime calls ran with
  // it current. A runtime that never touched device 0 leaves both at false / 0 for it.
  [[nodiscard]] bool context_created(int device) const noexcept;
  [[nodiscard]] std::uint64_t device_calls(int device) const noexcept;
  // Makes a context of `device` that is not its primary one current on this thread, as another
  // library's cuCtxCreate does (its device's primary context is created too); returns the vendor
  // code. Until set_device binds a primary context, every call on this thread fails with 400.
  int make_foreign_context(int device);
  // Whether this thread's current context is that non-primary one.
  [[nodiscard]] bool foreign_context_current() const noexcept;

  // Stream capture as the engine's code does it (cudaStreamBeginCapture / EndCapture); return
  // the vendor code. `mode` is a CaptureMode. Capture runs nothing: its nodes are only counted.
  int begin_capture(void* stream, int mode);
  int end_capture(void* stream);
  // A blocking stream (cudaStreamCreate without cudaStreamNonBlocking) of the current device,
  // destroyed with api().stream_destroy.
  [[nodiscard]] void* create_blocking_stream();
  // Launches body(arg) as every GPU thread of `ctas` CTAs of 256 threads on `stream` (tests: a
  // kernel of their own; use vector_copy16 in it). Returns the launch's code.
  int launch_body(void* stream, void (*body)(void*), void* arg, unsigned ctas);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// In a body run by launch_body: one 16-byte vector load from `src` and store to `dst` (host
// addresses), faulting as the GPU does when either is not 16-byte aligned.
void vector_copy16(void* dst, const void* src);
// In such a body: one `bytes`-byte word (8, 4 or 2) copied, faulting when either address is not
// a multiple of `bytes`, as the GPU's narrow loads and stores do.
void word_copy(void* dst, const void* src, std::size_t bytes);

// The process-wide device behind make_runtime("sim") (SimOptions::from_env()).
std::shared_ptr<SimDevice> default_device();

}  // namespace kvoffload::gpu::sim
