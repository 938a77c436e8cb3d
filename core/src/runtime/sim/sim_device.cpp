// The simulated device (Note [Simulated device] in sim_device.hpp).
//
// Note [Simulated contexts]
// CUDA keeps one primary context per device and process. cudaSetDevice creates it (since CUDA
// 12.0) and binds it to the calling thread; a thread that never chose a device binds device 0's on
// its first runtime call that needs a context (cudaFree(0) is the idiom), and cudaGetDevice
// reports 0 for it either way. A context, once created, lives until the process exits. The
// simulator keeps that state per thread (ThreadState::bound) and per device (DeviceState): every
// call that needs a context goes through Impl::context(), which binds device 0 where nothing is
// bound, creates the context on first use and counts the call for the device. In
// EXCLUSIVE_PROCESS compute mode a context is a lock that one process holds per device
// (ContextLocks: a lock file per device, held until exit, as the GPU holds the context), so a
// second process asking for that device is refused, like a real GPU in that mode.
#include "runtime/sim/sim_device.hpp"

#include "runtime/sim/sim_kernel.hpp"
#include "runtime/cpu_event.hpp"
#include "runtime/cpu_stream.hpp"

#include <kvoffload/error.hpp>
#include <kvoffload/log.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvoffload::gpu::sim {

namespace {

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
  kCaptureWrongThread = 908,
};

struct ErrorText {
  int code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {kSuccess, "simSuccess", "no error"},
    {kInvalidValue, "simErrorInvalidValue", "invalid argument"},
    {kOutOfMemory, "simErrorMemoryAllocation", "out of memory"},
    {kInsufficientDriver, "simErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {kDevicesUnavailable, "simErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {kInvalidDevice, "simErrorInvalidDevice", "invalid device ordinal"},
    {kInvalidContext, "simErrorInvalidContext",
     "invalid device context (no device set on this thread)"},
    {kNoKernelImage, "simErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {kInvalidHandle, "simErrorInvalidResourceHandle", "invalid resource handle"},
    {kNotReady, "simErrorNotReady", "device not ready"},
    {kIllegalAddress, "simErrorIllegalAddress", "an illegal memory access was encountered"},
    {kLaunchOutOfResources, "simErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {kAlreadyRegistered, "simErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {kNotRegistered, "simErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {kMisalignedAddress, "simErrorMisalignedAddress", "misaligned address"},
    {kNotPermitted, "simErrorNotPermitted", "operation not permitted"},
    {kNotSupported, "simErrorNotSupported", "operation not supported"},
    {kCaptureUnsupported, "simErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {kCaptureInvalidated, "simErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {kCaptureMerge, "simErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {kCaptureUnmatched, "simErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream"},
    {kCaptureUnjoined, "simErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work (a stream that joined the capture was not joined back)"},
    {kCaptureIsolation, "simErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {kCaptureImplicit, "simErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {kCaptureWrongThread, "simErrorStreamCaptureWrongThread",
     "capture not initiated in relaxed mode was ended by another thread"},
};

const ErrorText* find_error(int code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

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
};

// A range of the simulator's own address space with a first-fit allocator (page granularity).
class AddressRange {
 public:
  AddressRange() = default;
  AddressRange(std::uintptr_t base, std::size_t size) : base_(base), size_(size) {
    free_[0] = size;
  }

  // Offset of a new block of `bytes` (rounded up to pages), or SIZE_MAX.
  std::size_t allocate(std::size_t bytes) {
    const std::size_t need = round(bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      const std::size_t off = it->first;
      const std::size_t left = it->second - need;
      free_.erase(it);
      if (left > 0) free_[off + need] = left;
      used_[off] = need;
      return off;
    }
    return SIZE_MAX;
  }
  // Size of the block at offset `off`, or 0 when none starts there.
  std::size_t release(std::size_t off) {
    auto it = used_.find(off);
    if (it == used_.end()) return 0;
    const std::size_t n = it->second;
    used_.erase(it);
    auto next = free_.emplace(off, n).first;
    if (auto after = std::next(next); after != free_.end() && off + n == after->first) {
      next->second += after->second;
      free_.erase(after);
    }
    if (next != free_.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == next->first) {
        before->second += next->second;
        free_.erase(next);
      }
    }
    return n;
  }
  // The block holding [addr, addr + bytes) as (offset, block size), or {SIZE_MAX, 0}.
  [[nodiscard]] std::pair<std::size_t, std::size_t> find(std::uintptr_t addr,
                                                         std::size_t bytes) const {
    if (addr < base_ || addr >= base_ + size_) return {SIZE_MAX, 0};
    const std::size_t off = addr - base_;
    auto it = used_.upper_bound(off);
    if (it == used_.begin()) return {SIZE_MAX, 0};
    --it;
    if (off + bytes > it->first + it->second) return {SIZE_MAX, 0};
    return {it->first, it->second};
  }
  [[nodiscard]] bool contains(std::uintptr_t addr) const noexcept {
    return addr >= base_ && addr < base_ + size_;
  }
  [[nodiscard]] std::uintptr_t base() const noexcept { return base_; }

 private:
  static std::size_t round(std::size_t n) { return (n + 4095) / 4096 * 4096; }
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  std::map<std::size_t, std::size_t> free_;
  std::map<std::size_t, std::size_t> used_;
};

struct HostMapping {
  std::size_t bytes = 0;
  std::uintptr_t device = 0;  // device address of the first byte
  enum class Kind : std::uint8_t { kRegistered, kPinned, kSignal } kind = Kind::kRegistered;
};

struct Allocation {
  int device = 0;
  bool async = false;  // from device_malloc_async
};

// Per-thread state of the runtime API: last error, bound device, capture mode.
struct ThreadState {
  std::uint64_t device = 0;  // SimDevice::Impl::uid of the device this belongs to (never 0)
  int last_error = 0;
  int bound = -1;  // device whose context is current on this thread, -1: none
  int capture_mode = kCaptureModeGlobal;
};
// Trivially destructible storage: runtimes destroyed during static destruction (after this
// thread's thread_locals are gone) still call into the table. Keyed by a device's unique id, not
// its address: a device made where a destroyed one lived must not inherit its threads' state.
ThreadState& thread_state(std::uint64_t uid) {
  constexpr int kSlots = 32;
  thread_local ThreadState states[kSlots];
  thread_local int next = 0;
  for (ThreadState& s : states) {
    if (s.device == uid) return s;
  }
  ThreadState& slot = states[next];  // a new device on this thread (round robin past kSlots)
  next = (next + 1) % kSlots;
  slot = ThreadState{uid};
  return slot;
}

std::atomic<std::uint64_t> g_next_uid{1};

// Note [Simulated contexts]: the EXCLUSIVE_PROCESS lock of each device, held until exit.
class ContextLocks {
 public:
  // 0, or kDevicesUnavailable when another process holds the device.
  static int acquire(const std::string& dir, int device) {
    static std::mutex mu;
    static std::map<std::string, int> held;  // path -> fd, never closed: the context lives on
    const std::string path = (dir.empty() ? std::string("/tmp") : dir) + "/kvoffload-sim-device-" +
                             std::to_string(device) + ".lock";
    std::lock_guard lock(mu);
    if (held.contains(path)) return kSuccess;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return kDevicesUnavailable;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return kDevicesUnavailable;
    }
    held.emplace(path, fd);
    return kSuccess;
  }
};

}  // namespace

class SimStream;

namespace {

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
  std::shared_ptr<Capture> capture;  // recorded during this capture (then `cpu` is untouched)
  SimStream* capture_stream = nullptr;
  std::uint64_t capture_seq = 0;
};

struct DeviceState {
  std::atomic<bool> context{false};
  std::atomic<std::uint64_t> calls{0};
};

}  // namespace

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

  // The device whose context this call runs in (Note [Simulated contexts]); 0 or an error.
  int context(int& device);
  int create_context(int device);

  enum class Side : std::uint8_t { kDevice, kHost, kInvalid };
  // Where a DMA pointer lives and its host address: device memory (through the alias),
  // host memory mapped at a device address (through the mapping), or plain host memory.
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
  // Whether a potentially unsafe call (register, malloc, free) is prohibited for this thread by
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

  std::mutex mu;  // memory maps, streams, captures, sticky_reason
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

void SimStream::execute(Op& op) {
  const bool poisoned = dev_.sticky() != 0;  // a faulted device runs no more copies
  switch (op.kind) {
    case Op::Kind::kCopy:
      if (!poisoned) {
        for (const CopyPiece& p : op.pieces) std::memmove(p.dst, p.src, p.bytes);
      }
      break;
    case Op::Kind::kMemset:
      if (!poisoned) std::memset(op.dst, op.value, op.bytes);
      break;
    case Op::Kind::kKernel:
      if (!poisoned) run_kernel(op);
      break;
    case Op::Kind::kBody:
      if (!poisoned) run_body(op);
      break;
    case Op::Kind::kRecord:
      // After a fault the device completes nothing: the event never becomes complete (its
      // waiters are released; they see the sticky error).
      if (poisoned) {
        op.marker->abandon();
      } else {
        op.marker->complete();
      }
      break;
    case Op::Kind::kWaitEvent:
      op.marker->wait();
      break;
    case Op::Kind::kWaitValue: {
      std::atomic_ref<std::uint32_t> word(*op.flag);
      while (word.load(std::memory_order_acquire) != op.flag_value && dev_.sticky() == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      break;
    }
    case Op::Kind::kHostFunc:
      // CUDA never calls a host function after a context error (cudaLaunchHostFunc: "the
      // function will not be called in the event of an error in the CUDA context"); HIP's
      // hipStreamAddCallback still does, passing the error.
      if (poisoned && !dev_.options.host_funcs_after_error) {
        dev_.counters.host_funcs_skipped.fetch_add(1);
      } else {
        dev_.counters.host_funcs_run.fetch_add(1);
        op.fn(op.arg);
      }
      break;
    case Op::Kind::kFree: {
      std::lock_guard lock(dev_.mu);
      const std::size_t off = reinterpret_cast<std::uintptr_t>(op.dst) - dev_.device_range.base();
      if (const std::size_t n = dev_.device_range.release(off); n != 0) {
        dev_.allocations.erase(off);
        (void)::madvise(static_cast<std::byte*>(dev_.alias) + off, n, MADV_DONTNEED);
        dev_.counters.live_device_allocations.fetch_sub(1);
      }
      break;
    }
  }
}

void SimStream::report_fault(const char* what) {
  const CtaExecutor::Fault& f = executor_->fault();
  if (f.code == 0) return;
  dev_.poison(f.code, fmt::format("{}: thread {} of block {} made a 16-byte vector access at {}, "
                                  "which is not 16-byte aligned (a GPU faults here)",
                                  what, f.thread, f.block, f.address));
}

// The MMU step: read the descriptors where the device would (translating their address), rewrite
// every range to host addresses, and only then run the kernel body on them.
void SimStream::run_kernel(const Op& op) {
  const std::size_t table_bytes = op.count * sizeof(kernels::CopyDesc);
  const void* table = dev_.translate_kernel(op.descs, table_bytes, device);
  if (table == nullptr) {
    dev_.poison(kIllegalAddress,
                fmt::format("kernel read its descriptors at {} (+{} bytes), which is neither "
                            "device memory of device {} nor mapped host memory",
                            op.descs, table_bytes, device));
    return;
  }
  rewritten_.resize(op.count);
  std::memcpy(rewritten_.data(), table, table_bytes);
  for (std::size_t i = 0; i < op.count; ++i) {
    kernels::CopyDesc& d = rewritten_[i];
    if (d.bytes == 0) continue;
    void* src = dev_.translate_kernel(d.src, d.bytes, device);
    void* dst = dev_.translate_kernel(d.dst, d.bytes, device);
    if (src == nullptr || dst == nullptr) {
      dev_.poison(
          kIllegalAddress,
          fmt::format("copy kernel descriptor {} of {}: {} {} (+{} bytes) is neither "
                      "device memory of device {} nor registered host memory (a GPU "
                      "faults here)",
                      i, op.count, src == nullptr ? "source" : "destination",
                      src == nullptr ? d.src : static_cast<const void*>(d.dst), d.bytes, device));
      return;
    }
    d.src = src;
    d.dst = dst;
  }
  if (!executor_)
    executor_ = std::make_unique<CtaExecutor>(static_cast<unsigned>(kernels::kBatchCopyThreads));
  dev_.counters.kernel_ctas.fetch_add(op.ctas);
  executor_->run(rewritten_.data(), op.count, op.ctas);
  report_fault("copy kernel");
}

void SimStream::run_body(const Op& op) {
  if (!executor_)
    executor_ = std::make_unique<CtaExecutor>(static_cast<unsigned>(kernels::kBatchCopyThreads));
  dev_.counters.kernel_ctas.fetch_add(op.ctas);
  executor_->run_body(op.fn, op.arg, op.ctas);
  report_fault("kernel");
}

// ---- the device ----

SimDevice::Impl::Impl(SimOptions o) : options(std::move(o)) {
  if (options.device_count < 1 || options.device_count > 64) {
    throw_invalid("simulated device: device_count " + std::to_string(options.device_count) +
                  " is not from 1 to 64");
  }
  devices = std::make_unique<DeviceState[]>(static_cast<std::size_t>(options.device_count));
  legacy.resize(static_cast<std::size_t>(options.device_count));
  faults.fail_register_at = options.fail_register_at;
  reservation_bytes = options.device_memory_bytes;
  device_reservation = ::mmap(nullptr, reservation_bytes, PROT_NONE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (device_reservation == MAP_FAILED)
    throw_system_error("mmap", errno, "simulated device address space");
  alias = ::mmap(nullptr, reservation_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (alias == MAP_FAILED) {
    const int err = errno;
    ::munmap(device_reservation, reservation_bytes);
    throw_system_error("mmap", err, "simulated device memory alias");
  }
  device_range =
      AddressRange(reinterpret_cast<std::uintptr_t>(device_reservation), reservation_bytes);
  if (!options.unified_addressing) {
    window_reservation = ::mmap(nullptr, reservation_bytes, PROT_NONE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (window_reservation == MAP_FAILED) {
      const int err = errno;
      ::munmap(alias, reservation_bytes);
      ::munmap(device_reservation, reservation_bytes);
      throw_system_error("mmap", err, "simulated device window for host memory");
    }
    window_range =
        AddressRange(reinterpret_cast<std::uintptr_t>(window_reservation), reservation_bytes);
  }
}

SimDevice::Impl::~Impl() {
  legacy.clear();
  for (auto& [host, m] : host_maps) {
    if (m.kind != HostMapping::Kind::kRegistered) std::free(reinterpret_cast<void*>(host));
  }
  for (void* p : freed_pinned) std::free(p);
  if (window_reservation != nullptr) ::munmap(window_reservation, reservation_bytes);
  ::munmap(alias, reservation_bytes);
  ::munmap(device_reservation, reservation_bytes);
}

int SimDevice::Impl::create_context(int device) {
  DeviceState& state = devices[static_cast<std::size_t>(device)];
  if (state.context.load(std::memory_order_acquire)) return kSuccess;
  std::lock_guard lock(mu);
  if (state.context.load(std::memory_order_relaxed)) return kSuccess;
  if (options.exclusive_process) {
    if (const int err = ContextLocks::acquire(options.lock_dir, device); err != kSuccess) {
      return err;
    }
  }
  if (!options.context_log.empty()) {
    const std::string line =
        "pid " + std::to_string(::getpid()) + " device " + std::to_string(device) + "\n";
    const int fd =
        ::open(options.context_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      (void)!::write(fd, line.data(), line.size());
      ::close(fd);
    }
  }
  state.context.store(true, std::memory_order_release);
  return kSuccess;
}

int SimDevice::Impl::context(int& device) {
  ThreadState& t = thread_state(uid);
  const int want = t.bound < 0 ? 0 : t.bound;  // no context bound: device 0's, as CUDA does
  if (const int err = create_context(want); err != kSuccess) return err;
  t.bound = want;
  devices[static_cast<std::size_t>(want)].calls.fetch_add(1, std::memory_order_relaxed);
  device = want;
  return kSuccess;
}

std::pair<SimDevice::Impl::Side, void*> SimDevice::Impl::translate_dma(const void* p,
                                                                       std::size_t n) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu);
  if (device_range.contains(addr)) {
    const auto [off, size] = device_range.find(addr, n);
    if (off == SIZE_MAX) return {Side::kInvalid, nullptr};
    return {Side::kDevice, static_cast<std::byte*>(alias) + (addr - device_range.base())};
  }
  if (window_reservation != nullptr && window_range.contains(addr)) {
    for (auto& [host, m] : host_maps) {
      if (addr >= m.device && addr + n <= m.device + m.bytes) {
        return {Side::kHost, reinterpret_cast<void*>(host + (addr - m.device))};
      }
    }
    return {Side::kInvalid, nullptr};
  }
  return {Side::kHost, const_cast<void*>(p)};  // host memory, registered or pageable
}

bool SimDevice::Impl::host_mapped(const void* p, std::size_t n) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu);
  auto it = host_maps.upper_bound(addr);
  if (it == host_maps.begin()) return false;
  --it;
  return addr + n <= it->first + it->second.bytes;
}

void* SimDevice::Impl::translate_kernel(const void* p, std::size_t n, int device) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu);
  if (device_range.contains(addr)) {
    const auto [off, size] = device_range.find(addr, n);
    if (off == SIZE_MAX) return nullptr;
    // Another device's memory is not reachable from a kernel (no peer access here).
    if (auto it = allocations.find(off); it == allocations.end() || it->second.device != device) {
      return nullptr;
    }
    return static_cast<std::byte*>(alias) + (addr - device_range.base());
  }
  for (auto& [host, m] : host_maps) {
    if (addr >= m.device && addr + n <= m.device + m.bytes) {
      return reinterpret_cast<void*>(host + (addr - m.device));
    }
  }
  return nullptr;
}

SimStream* SimDevice::Impl::stream_of(void* handle, int device) {
  if (handle != nullptr) return static_cast<SimStream*>(handle);
  std::lock_guard lock(mu);
  auto& s = legacy[static_cast<std::size_t>(device)];
  if (!s) s = std::make_unique<SimStream>(*this, device, /*blocking=*/true);
  return s.get();
}

int SimDevice::Impl::enqueue(SimStream* s, Op op) {
  {
    std::lock_guard lock(mu);
    if (s->capture) {
      if (s->capture->invalidated) return kCaptureInvalidated;
      ++s->capture_seq;  // a node of the graph: recorded, never run
      ++s->capture->nodes;
      return kSuccess;
    }
    if (s == legacy[static_cast<std::size_t>(s->device)].get()) {
      // The legacy stream synchronizes with every blocking stream: one that captures would
      // make it depend on the capture.
      bool implicit = false;
      for (const auto& c : captures) {
        for (SimStream* m : c->members) {
          if (m->blocking && m->device == s->device) {
            invalidate(*c);
            implicit = true;
          }
        }
      }
      if (implicit) return kCaptureImplicit;
    }
  }
  s->push(std::move(op));
  return kSuccess;
}

bool SimDevice::Impl::unsafe_prohibited(const ThreadState& t) {
  if (t.capture_mode == kCaptureModeRelaxed) return false;
  const std::thread::id me = std::this_thread::get_id();
  bool prohibited = false;
  for (const auto& c : captures) {
    // cudaStreamCaptureModeGlobal (the thread's mode): its own non-relaxed captures and other
    // threads' global captures prohibit; ThreadLocal: its own non-relaxed captures only.
    const bool own = c->thread == me && c->mode != kCaptureModeRelaxed;
    const bool other =
        c->thread != me && c->mode == kCaptureModeGlobal && t.capture_mode == kCaptureModeGlobal;
    if (own || other) {
      invalidate(*c);
      prohibited = true;
    }
  }
  return prohibited;
}

void SimDevice::Impl::synchronize_all() {
  std::vector<SimStream*> all;
  {
    std::lock_guard lock(mu);
    all.assign(streams.begin(), streams.end());
    for (auto& s : legacy) {
      if (s) all.push_back(s.get());
    }
  }
  for (SimStream* s : all) s->synchronize();
}

// ---- the vendor table ----

namespace {

SimDevice::Impl& dev(void* ctx) {
  return *static_cast<SimDevice::Impl*>(ctx);
}

// Every call that a poisoned CUDA context refuses returns the sticky error first.
#define KVO_SIM_STICKY(d)                       \
  do {                                          \
    if (const int s_ = (d).sticky(); s_ != 0) { \
      return (d).fail(s_);                      \
    }                                           \
  } while (0)

// A call that needs a context: binds one (Note [Simulated contexts]); `cur` is its device.
#define KVO_SIM_CONTEXT(d, cur)                            \
  int cur = 0;                                             \
  do {                                                     \
    if (const int e_ = (d).context(cur); e_ != kSuccess) { \
      return (d).fail(e_);                                 \
    }                                                      \
  } while (0)

// A potentially unsafe call during a capture (Note [Registration during capture] in
// gpu_runtime.cpp): refused, and the capture it would break is invalidated.
#define KVO_SIM_CAPTURE_SAFE(d)                               \
  do {                                                        \
    std::lock_guard capture_lock_((d).mu);                    \
    if ((d).unsafe_prohibited(thread_state((d).uid))) {       \
      thread_state((d).uid).last_error = kCaptureUnsupported; \
      return kCaptureUnsupported;                             \
    }                                                         \
  } while (0)

const char* sim_error_name(void*, int err) {
  const ErrorText* e = find_error(driver_code(err));
  return e != nullptr ? e->name : "simErrorUnknown";
}
const char* sim_error_string(void*, int err) {
  const ErrorText* e = find_error(driver_code(err));
  return e != nullptr ? e->text : "unknown error";
}
int sim_get_last_error(void* ctx) {
  ThreadState& t = thread_state(dev(ctx).uid);
  const int err = t.last_error;
  t.last_error = 0;
  return err != 0 ? err : dev(ctx).sticky();
}
int sim_get_device_count(void* ctx, int* count) {
  auto& d = dev(ctx);
  // CUDA's minor-version compatibility: a runtime runs on any driver of its major version.
  if (d.options.driver_version < d.options.runtime_version / 1000 * 1000) {
    *count = 0;
    return d.fail(kInsufficientDriver);
  }
  *count = d.options.device_count;
  return kSuccess;
}
int sim_get_device(void* ctx, int* device) {
  const int bound = thread_state(dev(ctx).uid).bound;
  *device = bound < 0 ? 0 : bound;  // a thread without a context reports device 0, as CUDA does
  return kSuccess;
}
int sim_current_device(void* ctx, int* device) {
  *device = thread_state(dev(ctx).uid).bound;
  return kSuccess;
}
int sim_set_device(void* ctx, int device) {
  auto& d = dev(ctx);
  if (device < 0 || device >= d.options.device_count) return d.fail(kInvalidDevice);
  // cudaSetDevice creates the device's primary context (CUDA 12.0 and later).
  if (const int err = d.create_context(device); err != kSuccess) return d.fail(err);
  thread_state(dev(ctx).uid).bound = device;
  d.devices[static_cast<std::size_t>(device)].calls.fetch_add(1, std::memory_order_relaxed);
  return kSuccess;
}
int sim_device_synchronize(void* ctx) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  d.counters.device_syncs.fetch_add(1);
  d.synchronize_all();
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_device_describe(void* ctx, int device, char* name, std::size_t name_len, char* arch,
                        std::size_t arch_len) {
  auto& d = dev(ctx);
  if (device < 0 || device >= d.options.device_count) return d.fail(kInvalidDevice);
  (void)std::snprintf(name, name_len, "kvoffload simulated device %d (%s addressing)", device,
                      d.options.unified_addressing ? "unified" : "separate");
  (void)std::snprintf(arch, arch_len, "%s", d.options.device_arch.c_str());
  return kSuccess;
}
int sim_driver_version(void* ctx, int* version) {
  *version = dev(ctx).options.driver_version;
  return kSuccess;
}
int sim_runtime_version(void* ctx, int* version) {
  *version = dev(ctx).options.runtime_version;
  return kSuccess;
}
void sim_version_text(void*, int version, char* out, std::size_t len) {
  (void)std::snprintf(out, len, "%d.%d", version / 1000, (version % 1000) / 10);
}
int sim_exchange_capture_mode(void* ctx, int* mode, int relaxed) {
  ThreadState& t = thread_state(dev(ctx).uid);
  const int previous = t.capture_mode;
  t.capture_mode = relaxed != 0 ? kCaptureModeRelaxed : *mode;
  *mode = previous;
  return kSuccess;
}
int sim_stream_capturing(void* ctx, void* stream, int* capturing) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  *capturing = 0;
  SimStream* s = d.stream_of(stream, cur);
  std::lock_guard lock(d.mu);
  if (stream == nullptr) {
    for (const auto& c : d.captures) {
      for (SimStream* m : c->members) {
        if (m->blocking && m->device == cur) {
          thread_state(dev(ctx).uid).last_error = kCaptureImplicit;
          return kCaptureImplicit;  // cudaStreamIsCapturing(cudaStreamLegacy)
        }
      }
    }
    return kSuccess;
  }
  *capturing = s->capture ? 1 : 0;
  return kSuccess;
}

int sim_stream_create(void* ctx, void** stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  auto s = std::make_unique<SimStream>(d, cur, /*blocking=*/false);
  std::lock_guard lock(d.mu);
  d.streams.insert(s.get());
  *stream = s.release();
  return kSuccess;
}
int sim_stream_destroy(void* ctx, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  if (stream == nullptr) return d.fail(kInvalidHandle);
  auto* s = static_cast<SimStream*>(stream);
  {
    std::lock_guard lock(d.mu);
    if (d.streams.erase(s) == 0) return d.fail(kInvalidHandle);
  }
  delete s;  // drains first
  return kSuccess;
}
int sim_stream_synchronize(void* ctx, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  SimStream* s = d.stream_of(stream, cur);
  {
    std::lock_guard lock(d.mu);
    if (s->capture) {  // synchronizing a capturing stream is refused and breaks the capture
      d.invalidate(*s->capture);
      thread_state(dev(ctx).uid).last_error = kCaptureUnsupported;
      return kCaptureUnsupported;
    }
  }
  s->synchronize();
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_stream_wait_event(void* ctx, void* stream, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  if (event == nullptr) return d.fail(kInvalidHandle);
  auto* e = static_cast<SimEvent*>(event);
  SimStream* s = d.stream_of(stream, cur);  // another device's event is fine (CUDA allows it)
  std::shared_ptr<Marker> m;
  {
    std::lock_guard lock(d.mu);
    if (e->capture && d.captures.contains(e->capture)) {
      Capture& c = *e->capture;
      if (!s->capture) {
        // CUDA's cross-stream rule: waiting on an event recorded during a capture pulls this
        // stream into that capture; what it enqueues from now on is a node, never run.
        s->capture = e->capture;
        s->capture_seq = 0;
        c.members.insert(s);
        return kSuccess;
      }
      if (s->capture != e->capture) {
        d.invalidate(*s->capture);
        d.invalidate(c);
        return d.fail(kCaptureMerge);
      }
      if (s == c.origin && e->capture_stream != s) {
        std::uint64_t& joined = c.rejoined[e->capture_stream];
        joined = std::max(joined, e->capture_seq);  // joined back up to that record
      }
      ++s->capture_seq;
      ++c.nodes;
      return kSuccess;
    }
    if (s->capture) {
      // A captured stream may not depend on work outside its capture.
      d.invalidate(*s->capture);
      return d.fail(kCaptureIsolation);
    }
    m = e->cpu.current();
  }
  if (!m) return kSuccess;  // never recorded: nothing to wait for
  Op op;
  op.kind = Op::Kind::kWaitEvent;
  op.marker = std::move(m);
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  return kSuccess;
}
int sim_stream_wait_value32(void* ctx, void* stream, std::uint32_t* flag, std::uint32_t value) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  // A driver-level call (cuStreamWaitValue32): its failures are driver codes.
  if (const int code = d.faults.fail_wait_value.exchange(0); code != 0) {
    return d.fail(driver_result(code));
  }
  // The flag must be memory the device can see: registered or pinned host memory, and with HIP's
  // semantics signal memory only.
  auto* host = static_cast<std::uint32_t*>(d.translate_kernel(flag, sizeof *flag, cur));
  if (host == nullptr) return d.fail(driver_result(kInvalidValue));
  if (d.options.wait_value_needs_signal_memory) {
    std::lock_guard lock(d.mu);
    auto it = d.host_maps.find(reinterpret_cast<std::uintptr_t>(host));
    if (it == d.host_maps.end() || it->second.kind != HostMapping::Kind::kSignal) {
      thread_state(dev(ctx).uid).last_error = kInvalidValue;
      return kInvalidValue;  // hipStreamWaitValue32 on memory that is not signal memory
    }
  }
  Op op;
  op.kind = Op::Kind::kWaitValue;
  op.flag = host;
  op.flag_value = value;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}
int sim_launch_host_func(void* ctx, void* stream, void (*fn)(void*), void* arg) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  Op op;
  op.kind = Op::Kind::kHostFunc;
  op.fn = fn;
  op.arg = arg;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}
int sim_event_create(void* ctx, void** event, int timing) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  auto* e = new SimEvent();
  e->cpu.timing = timing != 0;
  e->device = cur;
  *event = e;
  return kSuccess;
}
int sim_event_destroy(void* ctx, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  delete static_cast<SimEvent*>(event);
  return kSuccess;
}
int sim_event_record(void* ctx, void* event, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  if (event == nullptr) return d.fail(kInvalidHandle);
  if (int n = d.faults.fail_event_records.load();
      n > 0 && d.faults.fail_event_records.fetch_sub(1) >= 1) {
    return d.fail(kInvalidValue);
  }
  auto* e = static_cast<SimEvent*>(event);
  SimStream* s = d.stream_of(stream, cur);
  // "cudaEventRecord() will fail if the input event and input stream are associated to
  // different devices" (CUDA programming guide, multi-device system).
  if (e->device != s->device) return d.fail(kInvalidHandle);
  {
    std::lock_guard lock(d.mu);
    if (s->capture) {
      if (s->capture->invalidated) return d.fail(kCaptureInvalidated);
      e->capture = s->capture;  // a node of the capture: anyone waiting on it joins it
      e->capture_stream = s;
      e->capture_seq = s->capture_seq;
      return kSuccess;
    }
    e->capture.reset();
  }
  Op op;
  op.kind = Op::Kind::kRecord;
  op.marker = e->cpu.record();
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  return kSuccess;
}
int sim_event_query(void* ctx, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  // A sticky error is reported at once, even while earlier work is still queued: every call of
  // a faulted context returns it.
  KVO_SIM_STICKY(d);
  auto* e = static_cast<SimEvent*>(event);
  {
    std::lock_guard lock(d.mu);
    if (e->capture && d.captures.contains(e->capture)) return d.fail(kCaptureUnsupported);
  }
  std::shared_ptr<Marker> m = e->cpu.current();
  if (m && !m->is_done()) return d.fail(kNotReady);
  return kSuccess;
}
int sim_event_synchronize(void* ctx, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  auto* e = static_cast<SimEvent*>(event);
  {
    std::lock_guard lock(d.mu);
    if (e->capture && d.captures.contains(e->capture)) return d.fail(kCaptureUnsupported);
  }
  if (std::shared_ptr<Marker> m = e->cpu.current()) m->wait();
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_event_elapsed_ms(void* ctx, float* ms, void* start, void* end) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  auto* a = static_cast<SimEvent*>(start);
  auto* b = static_cast<SimEvent*>(end);
  if (a->device != b->device) return d.fail(kInvalidHandle);
  const auto ma = a->cpu.current();
  const auto mb = b->cpu.current();
  if (!a->cpu.timing || !b->cpu.timing || !ma || !mb) return d.fail(kInvalidHandle);
  if (!ma->is_done() || !mb->is_done()) return d.fail(kNotReady);
  *ms = std::chrono::duration<float, std::milli>(mb->completed_at() - ma->completed_at()).count();
  return kSuccess;
}

// Maps [ptr, ptr + bytes) for the device; the device address is the host address with unified
// addressing, else a fresh address in the window.
int map_host(SimDevice::Impl& d, void* ptr, std::size_t bytes, HostMapping::Kind kind) {
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(d.mu);
  auto it = d.host_maps.lower_bound(begin);
  if (it != d.host_maps.end() && it->first < begin + bytes) return d.fail(kAlreadyRegistered);
  if (it != d.host_maps.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.bytes > begin) return d.fail(kAlreadyRegistered);
  }
  HostMapping m{bytes, begin, kind};
  if (d.window_reservation != nullptr) {
    // A page more than asked: mappings never abut, as ROCm gives no contiguity guarantee either.
    const std::size_t off = d.window_range.allocate(bytes + 4096);
    if (off == SIZE_MAX) return d.fail(kOutOfMemory);
    m.device = d.window_range.base() + off;
  }
  d.host_maps.emplace(begin, m);
  return kSuccess;
}

int unmap_host(SimDevice::Impl& d, void* ptr, HostMapping::Kind kind) {
  std::lock_guard lock(d.mu);
  auto it = d.host_maps.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == d.host_maps.end() || it->second.kind != kind) return d.fail(kNotRegistered);
  if (d.window_reservation != nullptr)
    (void)d.window_range.release(it->second.device - d.window_range.base());
  d.host_maps.erase(it);
  return kSuccess;
}

int sim_host_register(void* ctx, void* ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  d.counters.host_register_calls.fetch_add(1);
  if (int n = d.faults.fail_register_at.load();
      n > 0 && d.faults.fail_register_at.fetch_sub(1) == 1) {
    return d.fail(kOutOfMemory);
  }
  if (ptr == nullptr || bytes == 0) return d.fail(kInvalidValue);
  if (d.translate_dma(ptr, 1).first == SimDevice::Impl::Side::kDevice) return d.fail(kInvalidValue);
  const int err = map_host(d, ptr, bytes, HostMapping::Kind::kRegistered);
  if (err == kSuccess) d.counters.live_registrations.fetch_add(1);
  return err;
}
int sim_host_unregister(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  const int err = unmap_host(d, ptr, HostMapping::Kind::kRegistered);
  if (err == kSuccess) d.counters.live_registrations.fetch_sub(1);
  return err;
}
int sim_host_device_pointer(void* ctx, void** device, void* host) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  if (int n = d.faults.fail_device_pointer.load();
      n > 0 && d.faults.fail_device_pointer.fetch_sub(1) >= 1) {
    return d.fail(kInvalidValue);
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(host);
  std::lock_guard lock(d.mu);
  for (auto& [begin, m] : d.host_maps) {
    if (addr >= begin && addr < begin + m.bytes) {
      *device = reinterpret_cast<void*>(m.device + (addr - begin));
      return kSuccess;
    }
  }
  return d.fail(kInvalidValue);
}
int host_alloc(SimDevice::Impl& d, void** ptr, std::size_t bytes, HostMapping::Kind kind) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return d.fail(kOutOfMemory);
  if (const int err = map_host(d, p, bytes, kind); err != kSuccess) {
    std::free(p);
    return err;
  }
  *ptr = p;
  return kSuccess;
}
int sim_host_alloc_mapped(void* ctx, void** ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  return host_alloc(d, ptr, bytes, HostMapping::Kind::kPinned);
}
int sim_host_free(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  if (const int err = unmap_host(d, ptr, HostMapping::Kind::kPinned); err != kSuccess) return err;
  // Unmapped for the device at once (a kernel reading it later faults), but the bytes stay
  // allocated until the device goes: a copy queued before the free may still read them, which
  // on a GPU is a fault or stale data and in the simulator must not be a use-after-free.
  std::lock_guard lock(d.mu);
  d.freed_pinned.push_back(ptr);
  return kSuccess;
}
// CUDA: pinned mapped memory; HIP semantics: signal memory (hipMallocSignalMemory), the only kind
// hipStreamWaitValue32 takes.
int sim_flag_alloc(void* ctx, std::uint32_t** flag) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  void* p = nullptr;
  if (const int err = host_alloc(d, &p, 8, HostMapping::Kind::kSignal); err != kSuccess) return err;
  *flag = static_cast<std::uint32_t*>(p);
  return kSuccess;
}
int sim_flag_free(void* ctx, std::uint32_t* flag) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  if (const int err = unmap_host(d, flag, HostMapping::Kind::kSignal); err != kSuccess) return err;
  std::lock_guard lock(d.mu);
  d.freed_pinned.push_back(flag);  // as host_free: a queued wait may still read it
  return kSuccess;
}
int device_alloc(SimDevice::Impl& d, void** ptr, std::size_t bytes, int device, bool async) {
  if (bytes == 0) return d.fail(kInvalidValue);
  std::lock_guard lock(d.mu);
  const std::size_t off = d.device_range.allocate(bytes);
  if (off == SIZE_MAX) return d.fail(kOutOfMemory);
  d.allocations[off] = Allocation{device, async};
  d.counters.live_device_allocations.fetch_add(1);
  *ptr = reinterpret_cast<void*>(d.device_range.base() + off);
  return kSuccess;
}
int sim_device_malloc(void* ctx, void** ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  return device_alloc(d, ptr, bytes, cur, /*async=*/false);
}
int sim_device_malloc_async(void* ctx, void** ptr, std::size_t bytes, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  // Stream-ordered: the simulator hands the memory out at once (a valid, stricter-than-needed
  // reading; a GPU may reuse memory freed earlier in the same stream).
  (void)d.stream_of(stream, cur);
  return device_alloc(d, ptr, bytes, cur, /*async=*/true);
}
int release_device(SimDevice::Impl& d, void* ptr) {
  std::lock_guard lock(d.mu);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (!d.device_range.contains(addr)) return d.fail(kInvalidValue);
  const std::size_t off = addr - d.device_range.base();
  const std::size_t n = d.device_range.release(off);
  if (n == 0) return d.fail(kInvalidValue);
  d.allocations.erase(off);
  (void)::madvise(static_cast<std::byte*>(d.alias) + off, n, MADV_DONTNEED);
  d.counters.live_device_allocations.fetch_sub(1);
  return kSuccess;
}
int sim_device_free(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  bool async = false;
  {
    std::lock_guard lock(d.mu);
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    if (d.device_range.contains(addr)) {
      auto it = d.allocations.find(addr - d.device_range.base());
      async = it != d.allocations.end() && it->second.async;
    }
  }
  // cudaFree waits for the whole device, except for stream-ordered memory, which it frees at
  // once ("will not perform any implicit synchronization"): work still using it then faults.
  if (!async) {
    d.counters.device_syncs.fetch_add(1);
    d.synchronize_all();
  }
  return release_device(d, ptr);
}
int sim_device_free_async(void* ctx, void* ptr, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  {
    std::lock_guard lock(d.mu);
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    if (!d.device_range.contains(addr)) {
      thread_state(dev(ctx).uid).last_error = kInvalidValue;
      return kInvalidValue;
    }
    auto it = d.allocations.find(addr - d.device_range.base());
    if (it == d.allocations.end() || !it->second.async) {
      // The stream-ordered allocator frees what it allocated (Note [Freeing] in gpu_runtime.cpp).
      d.counters.mismatched_frees.fetch_add(1);
      thread_state(dev(ctx).uid).last_error = kInvalidValue;
      return kInvalidValue;
    }
  }
  Op op;
  op.kind = Op::Kind::kFree;
  op.dst = ptr;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}
int sim_pointer_is_device(void* ctx, const void* ptr, int* is_device) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  *is_device = d.device_range.contains(reinterpret_cast<std::uintptr_t>(ptr)) ? 1 : 0;
  return kSuccess;
}

// Checks a DMA's two sides against `kind` and returns the translated piece, or an error;
// `pageable` is set when a host side is neither registered nor pinned.
int dma_piece(SimDevice::Impl& d, void* dst, const void* src, std::size_t bytes, int kind,
              CopyPiece& out, bool& pageable) {
  using Side = SimDevice::Impl::Side;
  const auto [dside, dhost] = d.translate_dma(dst, bytes);
  const auto [sside, shost] = d.translate_dma(src, bytes);
  if (dside == Side::kInvalid || sside == Side::kInvalid) return kInvalidValue;
  const Side want_src =
      kind == kMemcpyHostToDevice || kind == kMemcpyHostToHost ? Side::kHost : Side::kDevice;
  const Side want_dst =
      kind == kMemcpyDeviceToHost || kind == kMemcpyHostToHost ? Side::kHost : Side::kDevice;
  if (kind != kMemcpyDefault && (sside != want_src || dside != want_dst)) return kInvalidValue;
  if ((dside == Side::kHost && !d.host_mapped(dhost, bytes)) ||
      (sside == Side::kHost && !d.host_mapped(shost, bytes))) {
    pageable = true;
  }
  out = CopyPiece{dhost, shost, bytes};
  return kSuccess;
}

// Enqueues a copy; one from or to pageable memory synchronizes (Note [Simulated device]).
int enqueue_copy(SimDevice::Impl& d, SimStream* s, Op op, bool pageable) {
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  if (pageable) {
    d.counters.pageable_copies.fetch_add(1);
    bool capturing = false;
    {
      std::lock_guard lock(d.mu);
      capturing = static_cast<bool>(s->capture);
    }
    if (!capturing) s->synchronize();
  }
  return kSuccess;
}

int sim_memcpy_async(void* ctx, void* dst, const void* src, std::size_t bytes, int kind,
                     void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  d.counters.memcpy_calls.fetch_add(1);
  if (int n = d.faults.fail_memcpy_at.load(); n > 0 && d.faults.fail_memcpy_at.fetch_sub(1) == 1) {
    return d.fail(kInvalidValue);
  }
  Op op;
  op.kind = Op::Kind::kCopy;
  op.pieces.resize(1);
  bool pageable = false;
  if (const int err = dma_piece(d, dst, src, bytes, kind, op.pieces[0], pageable); err != kSuccess)
    return d.fail(err);
  // A copy into another device's stream is allowed (the programming guide's multi-device rules).
  return enqueue_copy(d, d.stream_of(stream, cur), std::move(op), pageable);
}
int sim_memset_async(void* ctx, void* dst, int value, std::size_t bytes, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  const auto [side, host] = d.translate_dma(dst, bytes);
  if (side == SimDevice::Impl::Side::kInvalid) return d.fail(kInvalidValue);
  Op op;
  op.kind = Op::Kind::kMemset;
  op.dst = host;
  op.value = value;
  op.bytes = bytes;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}

int sim_memcpy_batch_async(void* ctx, void** dsts, const void** srcs, std::size_t* sizes,
                           std::size_t count, int source_in_stream_order, void* stream,
                           std::size_t* fail_index) {
  auto& d = dev(ctx);
  *fail_index = SIZE_MAX;
  KVO_SIM_STICKY(d);
  d.counters.batch_calls.fetch_add(1);
  // A driver-level call: it needs a context bound on this thread, and binds none itself.
  const int cur = thread_state(dev(ctx).uid).bound;
  if (cur < 0) {
    d.counters.batch_refused.fetch_add(1);
    return kInvalidContext;
  }
  d.devices[static_cast<std::size_t>(cur)].calls.fetch_add(1, std::memory_order_relaxed);
  if (int n = d.faults.refuse_batches.load(); n > 0 && d.faults.refuse_batches.fetch_sub(1) >= 1) {
    d.counters.batch_refused.fetch_add(1);
    return d.faults.refuse_batch_code.load();
  }
  if (stream == nullptr || count == 0) return kInvalidValue;  // the legacy stream is refused
  Op op;
  op.kind = Op::Kind::kCopy;
  op.pieces.resize(count);
  std::size_t total = 0;
  bool pageable = false;
  for (std::size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0 || dma_piece(d, dsts[i], srcs[i], sizes[i], kMemcpyDefault, op.pieces[i],
                                   pageable) != kSuccess) {
      *fail_index = i;
      d.counters.batch_refused.fetch_add(1);
      return kInvalidValue;
    }
    total += sizes[i];
  }
  if (source_in_stream_order == 0) {
    // ANY: the copy engine may read the sources now, ahead of earlier work in the stream.
    op.snapshot.resize(total);
    std::size_t off = 0;
    for (CopyPiece& p : op.pieces) {
      std::memcpy(op.snapshot.data() + off, p.src, p.bytes);
      p.src = op.snapshot.data() + off;
      off += p.bytes;
    }
  }
  const int err = enqueue_copy(d, d.stream_of(stream, cur), std::move(op), pageable);
  return err;
}
const char* sim_batch_error_text(void* ctx, int code) {
  return sim_error_name(ctx, code);
}
int sim_batch_error_is_permanent(void*, int code) {
  return code == kNotSupported || code == kNotPermitted ? 1 : 0;
}

int sim_kernel_check(void* ctx) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  // As cudaFuncGetAttributes: no image for this device's architecture in the "fat binary".
  const std::string& built = d.options.kernel_archs;
  const std::string arch = d.options.device_arch.substr(0, d.options.device_arch.find(':'));
  std::size_t pos = 0;
  while (pos <= built.size()) {
    const std::size_t end = std::min(built.find_first_of(";,", pos), built.size());
    if (built.compare(pos, end - pos, arch) == 0) return kSuccess;
    pos = end + 1;
  }
  return d.fail(kNoKernelImage);
}
int sim_kernel_launch(void* ctx, const VendorCopyDesc* descs, std::size_t count, int ctas,
                      void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  // An unrelated earlier error left in this thread's slot (torch's, say); a launch API does not
  // clear it, and must not report it either.
  if (const int stale = d.faults.stale_error_before_launch.load(); stale != 0)
    thread_state(dev(ctx).uid).last_error = stale;
  KVO_SIM_STICKY(d);
  if (int n = d.faults.fail_launches.load(); n > 0 && d.faults.fail_launches.fetch_sub(1) >= 1) {
    return d.fail(kLaunchOutOfResources);
  }
  if (ctas <= 0 || ctas > 65535 || descs == nullptr) return d.fail(kInvalidValue);
  SimStream* s = d.stream_of(stream, cur);
  // "A kernel launch will fail if it is issued to a stream that is not associated to the
  // current device" (CUDA programming guide, multi-device system).
  if (s->device != cur) return d.fail(kInvalidHandle);
  d.counters.kernel_launches.fetch_add(1);
  if (count == 0) return kSuccess;
  Op op;
  op.kind = Op::Kind::kKernel;
  op.descs = descs;
  op.count = count;
  op.ctas = static_cast<unsigned>(ctas);
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  return kSuccess;
}

#undef KVO_SIM_CAPTURE_SAFE
#undef KVO_SIM_CONTEXT
#undef KVO_SIM_STICKY

int env_int(const char* name, int lo, int hi, int fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    throw_invalid(std::string(name) + "='" + env + "' is not a number from " + std::to_string(lo) +
                  " to " + std::to_string(hi));
  }
  return static_cast<int>(n);
}

std::string env_string(const char* name, const std::string& fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? std::string(env) : fallback;
}

}  // namespace

SimOptions SimOptions::from_env() {
  SimOptions o;
  o.device_count = env_int("KVOFFLOAD_SIM_DEVICES", 1, 64, o.device_count);
  o.driver_version = env_int("KVOFFLOAD_SIM_DRIVER_VERSION", 0, 99000, o.driver_version);
  o.device_arch = env_string("KVOFFLOAD_SIM_ARCH", o.device_arch);
  o.kernel_archs = env_string("KVOFFLOAD_SIM_KERNEL_ARCHS", o.kernel_archs);
  o.context_log = env_string("KVOFFLOAD_SIM_CONTEXT_LOG", "");
  const std::string mode = env_string("KVOFFLOAD_SIM_COMPUTE_MODE", "default");
  if (mode == "exclusive_process") {
    o.exclusive_process = true;
    o.lock_dir = env_string("KVOFFLOAD_SIM_LOCK_DIR", "/tmp");
  } else if (mode != "default") {
    throw_invalid("KVOFFLOAD_SIM_COMPUTE_MODE='" + mode +
                  "' is not a compute mode (default or exclusive_process)");
  }
  o.fail_register_at = env_int("KVOFFLOAD_SIM_FAIL_REGISTER_AT", 0, 1'000'000, o.fail_register_at);
  return o;
}

SimOptions SimOptions::hip_semantics() {
  SimOptions o;
  o.host_funcs_after_error = true;
  o.wait_value_needs_signal_memory = true;
  return o;
}

SimDevice::SimDevice(SimOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& im = *impl_;
  im.kernel_archs = im.options.kernel_archs;
  VendorApi& a = im.api;
  a.version = kVendorApiVersion;
  a.name = "sim";
  a.ctx = impl_.get();
  a.caps = im.options.unified_addressing ? kCapUnifiedAddressing : 0u;
  a.err_not_ready = kNotReady;
  a.err_capture_implicit = kCaptureImplicit;
  a.legacy_stream = nullptr;
  a.kernel_archs = im.kernel_archs.c_str();
  a.kernel_archs_exact = 1;
  a.min_driver_version = im.options.runtime_version / 1000 * 1000;
  a.min_driver_text = "a simulated driver of the same major version";
  a.error_name = sim_error_name;
  a.error_string = sim_error_string;
  a.get_last_error = sim_get_last_error;
  a.get_device_count = sim_get_device_count;
  a.get_device = sim_get_device;
  a.current_device = sim_current_device;
  a.set_device = sim_set_device;
  a.device_synchronize = sim_device_synchronize;
  a.device_describe = sim_device_describe;
  a.driver_version = sim_driver_version;
  a.runtime_version = sim_runtime_version;
  a.version_text = sim_version_text;
  a.exchange_capture_mode = sim_exchange_capture_mode;
  a.stream_capturing = sim_stream_capturing;
  a.stream_create = sim_stream_create;
  a.stream_destroy = sim_stream_destroy;
  a.stream_synchronize = sim_stream_synchronize;
  a.stream_wait_event = sim_stream_wait_event;
  a.stream_wait_value32 = sim_stream_wait_value32;
  a.flag_alloc = sim_flag_alloc;
  a.flag_free = sim_flag_free;
  a.launch_host_func = sim_launch_host_func;
  a.event_create = sim_event_create;
  a.event_destroy = sim_event_destroy;
  a.event_record = sim_event_record;
  a.event_query = sim_event_query;
  a.event_synchronize = sim_event_synchronize;
  a.event_elapsed_ms = sim_event_elapsed_ms;
  a.host_register = sim_host_register;
  a.host_unregister = sim_host_unregister;
  a.host_device_pointer = sim_host_device_pointer;
  a.host_alloc_mapped = sim_host_alloc_mapped;
  a.host_free = sim_host_free;
  a.device_malloc = sim_device_malloc;
  a.device_free = sim_device_free;
  a.device_malloc_async = im.options.async_allocator ? sim_device_malloc_async : nullptr;
  a.device_free_async = im.options.async_allocator ? sim_device_free_async : nullptr;
  a.pointer_is_device = sim_pointer_is_device;
  a.memcpy_async = sim_memcpy_async;
  a.memset_async = sim_memset_async;
  a.memcpy_batch_async = im.options.batch_memcpy ? sim_memcpy_batch_async : nullptr;
  a.batch_error_text = sim_batch_error_text;
  a.batch_error_is_permanent = sim_batch_error_is_permanent;
  a.batch_detail = im.options.batch_memcpy
                       ? "simulated batched memcpy (source order STREAM or ANY)"
                       : "per-copy loop: this simulated device has no batched memcpy";
  a.kernel_check = sim_kernel_check;
  a.kernel_launch = sim_kernel_launch;
  a.kernel_threads = kernels::kBatchCopyThreads;
}

SimDevice::~SimDevice() = default;

const VendorApi& SimDevice::api() const noexcept {
  return impl_->api;
}
SimFaults& SimDevice::faults() noexcept {
  return impl_->faults;
}
const SimCounters& SimDevice::counters() const noexcept {
  return impl_->counters;
}
int SimDevice::sticky_error() const noexcept {
  return impl_->sticky();
}
std::string SimDevice::sticky_reason() const {
  std::lock_guard lock(impl_->mu);
  return impl_->sticky_reason;
}
bool SimDevice::is_device_address(const void* ptr) const noexcept {
  return impl_->device_range.contains(reinterpret_cast<std::uintptr_t>(ptr));
}
bool SimDevice::context_created(int device) const noexcept {
  if (device < 0 || device >= impl_->options.device_count) return false;
  return impl_->devices[static_cast<std::size_t>(device)].context.load();
}
std::uint64_t SimDevice::device_calls(int device) const noexcept {
  if (device < 0 || device >= impl_->options.device_count) return 0;
  return impl_->devices[static_cast<std::size_t>(device)].calls.load();
}

int SimDevice::begin_capture(void* stream, int mode) {
  Impl& d = *impl_;
  int cur = 0;
  if (const int err = d.context(cur); err != kSuccess) return err;
  SimStream* s = d.stream_of(stream, cur);
  std::lock_guard lock(d.mu);
  if (stream == nullptr || s->capture) return kInvalidValue;  // the legacy stream cannot capture
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->members.insert(s);
  s->capture = c;
  s->capture_seq = 0;
  d.captures.insert(c);
  return kSuccess;
}

int SimDevice::end_capture(void* stream) {
  Impl& d = *impl_;
  int cur = 0;
  if (const int err = d.context(cur); err != kSuccess) return err;
  SimStream* s = d.stream_of(stream, cur);
  std::lock_guard lock(d.mu);
  if (!s->capture) return kInvalidValue;
  std::shared_ptr<Capture> c = s->capture;
  if (c->origin != s) return kCaptureUnmatched;
  if (c->mode != kCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return kCaptureWrongThread;
  int result = c->invalidated ? kCaptureInvalidated : kSuccess;
  if (result == kSuccess) {
    for (SimStream* m : c->members) {
      if (m == s) continue;
      auto it = c->rejoined.find(m);
      if (it == c->rejoined.end() || it->second < m->capture_seq) {
        d.invalidate(*c);
        result = kCaptureUnjoined;  // a stream that joined the capture was not joined back
        break;
      }
    }
  }
  for (SimStream* m : c->members) {
    m->capture.reset();
    m->capture_seq = 0;
  }
  d.captures.erase(c);
  return result;
}

void* SimDevice::create_blocking_stream() {
  Impl& d = *impl_;
  int cur = 0;
  if (d.context(cur) != kSuccess) return nullptr;
  auto s = std::make_unique<SimStream>(d, cur, /*blocking=*/true);
  std::lock_guard lock(d.mu);
  d.streams.insert(s.get());
  return s.release();
}

int SimDevice::launch_body(void* stream, void (*body)(void*), void* arg, unsigned ctas) {
  Impl& d = *impl_;
  int cur = 0;
  if (const int err = d.context(cur); err != kSuccess) return err;
  if (const int s = d.sticky(); s != 0) return s;
  SimStream* st = d.stream_of(stream, cur);
  if (st->device != cur) return kInvalidHandle;
  d.counters.kernel_launches.fetch_add(1);
  Op op;
  op.kind = Op::Kind::kBody;
  op.fn = body;
  op.arg = arg;
  op.ctas = ctas;
  return d.enqueue(st, std::move(op));
}

std::shared_ptr<SimDevice> default_device() {
  static std::mutex mu;
  static std::weak_ptr<SimDevice> current;
  std::lock_guard lock(mu);
  std::shared_ptr<SimDevice> d = current.lock();
  if (!d) {
    d = std::make_shared<SimDevice>(SimOptions::from_env());
    current = d;
  }
  return d;
}

}  // namespace kvoffload::gpu::sim
