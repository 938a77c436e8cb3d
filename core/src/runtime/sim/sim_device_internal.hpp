#pragma once
// What the pieces of the simulated device share (Note [Simulated device] in sim_device.hpp): its
// error codes, a stream operation, host mappings, captures and events, the device's state
// (SimDevice::Impl) and its streams (SimStream), and the helpers of the vendor-table entries.
// Internal to runtime/sim/; the device is used through sim_device.hpp.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/cpu_event.hpp"
#include "runtime/cpu_stream.hpp"
#include "runtime/sim/sim_address_range.hpp"
#include "runtime/sim/sim_device.hpp"
#include "runtime/sim/sim_kernel.hpp"

namespace kvoffload::gpu::sim {

// The CUDA runtime's numbering, so that messages read the same as on a GPU.
enum SimError : int {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kInsufficientDriver = 35,
  kDevicesUnavailable = 46,
  kInvalidDevice = 101,
  kInvalidContext = 201,
  kNoKernelImage = 209,
  kInvalidHandle = 400,
  kNotReady = 600,
  kIllegalAddress = 700,
  kLaunchOutOfResources = 701,
  kAlreadyRegistered = 712,
  kNotRegistered = 713,
  kMisalignedAddress = 716,
  kNotPermitted = 800,
  kNotSupported = 801,
  kCaptureUnsupported = 900,
  kCaptureInvalidated = 901,
  kCaptureMerge = 902,
  kCaptureUnmatched = 903,
  kCaptureUnjoined = 904,
  kCaptureIsolation = 905,
  kCaptureImplicit = 906,
  kCapturedEvent = 907,
  kCaptureWrongThread = 908,
};

using detail::CpuEvent;
using detail::Marker;

struct CopyPiece {
  void* dst;
  const void* src;
  std::size_t bytes;
};

struct Op {
  enum class Kind : std::uint8_t {
    kCopy,
    kMemset,
    kKernel,
    kBody,
    kRecord,
    kWaitEvent,
    kWaitValue,
    kHostFunc,
    kFree
  };
  Kind kind = Kind::kCopy;
  std::vector<CopyPiece> pieces;    // kCopy (already translated)
  std::vector<std::byte> snapshot;  // kCopy with source order ANY: the sources as read at the call
  void* dst = nullptr;              // kMemset, kFree
  std::size_t bytes = 0;
  int value = 0;
  const void* descs = nullptr;  // kKernel: device-visible descriptor address
  std::size_t count = 0;
  unsigned ctas = 0;
  std::shared_ptr<Marker> marker;  // kRecord, kWaitEvent
  std::uint32_t* flag = nullptr;   // kWaitValue (host address)
  std::uint32_t flag_value = 0;
  void (*fn)(void*) = nullptr;  // kHostFunc, kBody
  void* arg = nullptr;
  // kCopy: a side is memory a graph capture owns (Allocation::graph_owned); running it faults.
  const void* graph_memory = nullptr;
};

struct HostMapping {
  std::size_t bytes = 0;
  std::uintptr_t device = 0;  // device address of the first byte
  enum class Kind : std::uint8_t { kRegistered, kPinned, kSignal } kind = Kind::kRegistered;
};

struct Allocation {
  int device = 0;
  bool async = false;  // from device_malloc_async
  // Made by device_malloc_async on a capturing stream: an allocation node of that capture's
  // graph, owned by it. The simulator never launches graphs, so it never holds valid memory
  // outside one: a copy or kernel that touches it faults (illegal address).
  bool graph_owned = false;
};

// Per-thread state of the runtime API: last error, bound device, capture mode.
struct ThreadState {
  std::uint64_t device = 0;  // SimDevice::Impl::uid of the device this belongs to (never 0)
  int last_error = 0;
  int bound = -1;  // device whose context is current on this thread, -1: none
  // A non-primary context of `bound` current instead of its primary one (Impl::foreign), else
  // null: CUDA's runtime calls then operate on that context (SimDevice::make_foreign_context).
  void* foreign = nullptr;
  int capture_mode = kCaptureModeGlobal;
};
// Trivially destructible storage: runtimes destroyed during static destruction (after this
// thread's thread_locals are gone) still call into the table. Keyed by a device's unique id, not
// its address: a device made where a destroyed one lived must not inherit its threads' state.
ThreadState& thread_state(std::uint64_t uid);

// The next SimDevice::Impl::uid.
inline std::atomic<std::uint64_t> g_next_uid{1};

class SimStream;

// One stream-capture sequence (cudaStreamBeginCapture .. EndCapture).
struct Capture {
  int mode = kCaptureModeGlobal;
  std::thread::id thread;  // the thread that began it
  SimStream* origin = nullptr;
  bool invalidated = false;
  std::set<SimStream*> members;                  // origin and every stream that joined
  std::map<SimStream*, std::uint64_t> rejoined;  // member -> its node count the origin waited for
  std::uint64_t nodes = 0;
};

// An event: its CPU records, the device it belongs to, and the capture it was recorded in.
struct SimEvent {
  CpuEvent cpu;
  int device = 0;
  bool blocking_sync = false;        // kEventBlockingSync: a host wait on it sleeps
  std::shared_ptr<Capture> capture;  // recorded during this capture (then `cpu` is untouched)
  SimStream* capture_stream = nullptr;
  std::uint64_t capture_seq = 0;
};

struct DeviceState {
  std::atomic<bool> context{false};
  std::atomic<std::uint64_t> calls{0};
};

struct SimDevice::Impl {
  explicit Impl(SimOptions o);
  ~Impl();

  // Records `err` as the thread's last error (as every failing runtime call does) and returns it.
  int fail(int err) {
    thread_state(uid).last_error = err;
    return err;
  }
  // The sticky error, if the device is poisoned.
  int sticky() const noexcept { return sticky_.load(std::memory_order_acquire); }
  void poison(int err, std::string reason) {
    int expected = 0;
    if (sticky_.compare_exchange_strong(expected, err)) {
      std::lock_guard lock(mu);
      sticky_reason = std::move(reason);
    }
    counters.illegal_accesses.fetch_add(1);
  }

  // The device whose context this call runs in (Note [Simulated contexts] in sim_device.cpp); 0
  // or an error.
  int context(int& device);
  // The one non-primary context the sim models (cuCtxCreate's): its handle is this member's
  // address, and it belongs to foreign_device.
  int foreign = 0;
  int foreign_device = -1;
  int create_context(int device);

  enum class Side : std::uint8_t { kDevice, kHost, kInvalid, kGraphMemory };
  // Where a DMA pointer lives and its host address: device memory (through the alias),
  // host memory mapped at a device address (through the mapping), or plain host memory;
  // kGraphMemory: device memory a graph capture owns (Allocation::graph_owned).
  std::pair<Side, void*> translate_dma(const void* p, std::size_t n);
  // Whether host memory [p, p + n) is registered or pinned (else pageable).
  bool host_mapped(const void* p, std::size_t n);
  // The host address a kernel on `device` reaches at device address `p`, or null (an illegal
  // access: unmapped, or another device's memory).
  void* translate_kernel(const void* p, std::size_t n, int device);

  SimStream* stream_of(void* handle, int device);
  // Enqueues on `s`, or records a node when it captures; 0 or an error code.
  int enqueue(SimStream* s, Op op);
  void synchronize_all();
  // cudaStreamDestroy returns at once, while the stream's work still runs: the stream is
  // drained and freed by a thread of its own. device_synchronize and the device's end wait for
  // every retiring stream (mu not held).
  void retire(SimStream* s);
  void wait_retired();
  // Whether a potentially unsafe call (register, malloc, free, event query and synchronize,
  // stream synchronize, elapsed time: Note [Simulated device]) is prohibited for this thread by
  // a capture in progress; invalidates the captures it would break (mu held).
  bool unsafe_prohibited(const ThreadState& t);
  void invalidate(Capture& c) {
    if (!c.invalidated) counters.captures_invalidated.fetch_add(1);
    c.invalidated = true;
  }

  const std::uint64_t uid = g_next_uid.fetch_add(1);
  SimOptions options;
  VendorApi api{};
  SimFaults faults;
  SimCounters counters;
  std::atomic<int> sticky_{0};
  std::unique_ptr<DeviceState[]> devices;
  std::string arch_text;
  std::string kernel_archs;

  std::mutex mu;                       // memory maps, streams, captures, sticky_reason
  std::condition_variable retired_cv;  // (mu) retiring reached 0
  std::size_t retiring = 0;            // (mu) destroyed streams whose work may still run
  std::string sticky_reason;
  void* device_reservation = nullptr;  // PROT_NONE: the device addresses
  void* alias = nullptr;               // read-write: what the simulator copies through
  std::size_t reservation_bytes = 0;
  AddressRange device_range;
  std::map<std::size_t, Allocation> allocations;  // by offset in device_range
  void* window_reservation = nullptr;  // PROT_NONE: device addresses of host memory (no UVA)
  AddressRange window_range;
  std::map<std::uintptr_t, HostMapping> host_maps;  // by host address
  std::set<SimStream*> streams;
  std::vector<std::unique_ptr<SimStream>> legacy;  // the legacy stream of each device (nullptr)
  std::set<std::shared_ptr<Capture>> captures;     // in progress
  std::vector<void*> freed_pinned;                 // host_free'd, released with the device
};

class SimStream {
 public:
  SimStream(SimDevice::Impl& dev, int device_id, bool is_blocking)
      : device(device_id), blocking(is_blocking), dev_(dev), queue_([this](Op& op) { run(op); }) {}

  void push(Op op) { queue_.push(std::move(op)); }
  void synchronize() { queue_.synchronize(); }

  const int device;
  const bool blocking;
  // Capture state (dev_.mu): the capture this stream takes part in, and its nodes so far.
  std::shared_ptr<Capture> capture;
  std::uint64_t capture_seq = 0;

 private:
  void run(Op& op) {  // on the worker thread
    if (const int delay = dev_.faults.op_delay_us.load(); delay > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
    }
    execute(op);
  }
  void execute(Op& op);
  void run_kernel(const Op& op);
  void run_body(const Op& op);
  void report_fault(const char* what);

  SimDevice::Impl& dev_;
  std::vector<kernels::CopyDesc> rewritten_;  // worker-only: descriptors as host addresses
  std::unique_ptr<CtaExecutor> executor_;     // worker-only: made at the first launch
  detail::OrderedQueue<Op> queue_;            // last: its worker stops before the members above go
};

// ---- helpers of the vendor-table entries ----

inline SimDevice::Impl& dev(void* ctx) {
  return *static_cast<SimDevice::Impl*>(ctx);
}

// Every call that a poisoned CUDA context refuses returns the sticky error first.
#define KVO_SIM_STICKY(d)                       \
  do {                                          \
    if (const int s_ = (d).sticky(); s_ != 0) { \
      return (d).fail(s_);                      \
    }                                           \
  } while (0)

// A call that needs a context: binds one (Note [Simulated contexts] in sim_device.cpp); `cur` is
// its device.
#define KVO_SIM_CONTEXT(d, cur)                            \
  int cur = 0;                                             \
  do {                                                     \
    if (const int e_ = (d).context(cur); e_ != kSuccess) { \
      return (d).fail(e_);                                 \
    }                                                      \
  } while (0)

// A potentially unsafe call during a capture (Note [Registration during capture] in
// gpu_registration.cpp): refused, and the capture it would break is invalidated.
#define KVO_SIM_CAPTURE_SAFE(d)                               \
  do {                                                        \
    std::lock_guard capture_lock_((d).mu);                    \
    if ((d).unsafe_prohibited(thread_state((d).uid))) {       \
      thread_state((d).uid).last_error = kCaptureUnsupported; \
      return kCaptureUnsupported;                             \
    }                                                         \
  } while (0)

// The entries of the vendor table, by subject; each fills its part of `a` for a device with
// `options`: errors, devices, streams and events (sim_api.cpp), memory (sim_memory.cpp), copies
// and kernel launches (sim_copy.cpp).
// Appends text and a newline to the file at path (created 0600); a failure is ignored (the logs
// are for tests: SimOptions::context_log, register_log).
void append_log_line(const std::string& path, const std::string& text);

void install_api_entries(VendorApi& a, const SimOptions& options);
void install_memory_entries(VendorApi& a, const SimOptions& options);
void install_copy_entries(VendorApi& a, const SimOptions& options);

}  // namespace kvoffload::gpu::sim
