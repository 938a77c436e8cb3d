// The simulated device (Note [Simulated device] in sim_device.hpp).
#include "gpu/sim/sim_device.hpp"

#include "gpu/sim/sim_kernel.hpp"
#include "transfer/cpu_event.hpp"
#include "transfer/cpu_stream.hpp"

#include <kvoffload/error.hpp>
#include <kvoffload/log.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
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
  kInvalidDevice = 101,
  kInvalidContext = 201,
  kInvalidHandle = 400,
  kNotReady = 600,
  kIllegalAddress = 700,
  kLaunchOutOfResources = 701,
  kAlreadyRegistered = 712,
  kNotRegistered = 713,
  kNotPermitted = 800,
  kNotSupported = 801,
  kCaptureImplicit = 906,
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
    {kInvalidDevice, "simErrorInvalidDevice", "invalid device ordinal"},
    {kInvalidContext, "simErrorInvalidContext",
     "invalid device context (no device set on this thread)"},
    {kInvalidHandle, "simErrorInvalidResourceHandle", "invalid resource handle"},
    {kNotReady, "simErrorNotReady", "device not ready"},
    {kIllegalAddress, "simErrorIllegalAddress", "an illegal memory access was encountered"},
    {kLaunchOutOfResources, "simErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {kAlreadyRegistered, "simErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {kNotRegistered, "simErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {kNotPermitted, "simErrorNotPermitted", "operation not permitted"},
    {kNotSupported, "simErrorNotSupported", "operation not supported"},
    {kCaptureImplicit, "simErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
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
  void (*fn)(void*) = nullptr;  // kHostFunc
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
  bool pinned = false;        // allocated by host_alloc_mapped (freed by host_free)
};

// Per-thread state of the runtime API: last error, bound device, capture mode.
struct ThreadState {
  const void* device = nullptr;  // the SimDevice::Impl this belongs to
  int last_error = 0;
  int bound = -1;  // device set on this thread, -1: none (no context)
  int capture_mode = 0;
};
// Trivially destructible storage: runtimes destroyed during static destruction (after this
// thread's thread_locals are gone) still call into the table.
ThreadState& thread_state(const void* impl) {
  constexpr int kSlots = 32;
  thread_local ThreadState states[kSlots];
  thread_local int next = 0;
  for (ThreadState& s : states) {
    if (s.device == impl) return s;
  }
  ThreadState& slot = states[next];  // a new device on this thread (round robin past kSlots)
  next = (next + 1) % kSlots;
  slot = ThreadState{impl};
  return slot;
}

}  // namespace

class SimStream;

struct SimDevice::Impl {
  explicit Impl(SimOptions o);
  ~Impl();

  // Records `err` as the thread's last error (as every failing runtime call does) and returns it.
  int fail(int err) {
    thread_state(this).last_error = err;
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

  enum class Side : std::uint8_t { kDevice, kHost, kInvalid };
  // Where a DMA pointer lives and its host address: device memory (through the alias),
  // host memory mapped at a device address (through the mapping), or plain host memory.
  std::pair<Side, void*> translate_dma(const void* p, std::size_t n);
  // The host address a kernel reaches at device address `p`, or null (an illegal access).
  void* translate_kernel(const void* p, std::size_t n);

  SimStream* stream_of(void* handle);
  void synchronize_all();

  SimOptions options;
  VendorApi api{};
  SimFaults faults;
  SimCounters counters;
  std::atomic<int> sticky_{0};

  std::mutex mu;  // memory maps, streams, sticky_reason
  std::string sticky_reason;
  void* device_reservation = nullptr;  // PROT_NONE: the device addresses
  void* alias = nullptr;               // read-write: what the simulator copies through
  std::size_t reservation_bytes = 0;
  AddressRange device_range;
  void* window_reservation = nullptr;  // PROT_NONE: device addresses of host memory (no UVA)
  AddressRange window_range;
  std::map<std::uintptr_t, HostMapping> host_maps;  // by host address
  std::set<SimStream*> streams;
  std::unique_ptr<SimStream> default_stream;  // the legacy stream (handle nullptr)
};

class SimStream {
 public:
  explicit SimStream(SimDevice::Impl& dev) : dev_(dev), queue_([this](Op& op) { run(op); }) {}

  void push(Op op) { queue_.push(std::move(op)); }
  void synchronize() { queue_.synchronize(); }

 private:
  void run(Op& op) {  // on the worker thread
    if (const int delay = dev_.faults.op_delay_us.load(); delay > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
    }
    execute(op);
  }
  void execute(Op& op);
  void run_kernel(const Op& op);

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
    case Op::Kind::kRecord:
      op.marker->complete();
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
      op.fn(op.arg);
      break;
    case Op::Kind::kFree: {
      std::lock_guard lock(dev_.mu);
      const std::size_t off = reinterpret_cast<std::uintptr_t>(op.dst) - dev_.device_range.base();
      if (const std::size_t n = dev_.device_range.release(off); n != 0) {
        (void)::madvise(static_cast<std::byte*>(dev_.alias) + off, n, MADV_DONTNEED);
        dev_.counters.live_device_allocations.fetch_sub(1);
      }
      break;
    }
  }
}

// The MMU step: read the descriptors where the device would (translating their address), rewrite
// every range to host addresses, and only then run the kernel body on them.
void SimStream::run_kernel(const Op& op) {
  const std::size_t table_bytes = op.count * sizeof(kernels::CopyDesc);
  const void* table = dev_.translate_kernel(op.descs, table_bytes);
  if (table == nullptr) {
    dev_.poison(kIllegalAddress,
                fmt::format("kernel read its descriptors at {} (+{} bytes), which is neither "
                            "device memory nor mapped host memory",
                            op.descs, table_bytes));
    return;
  }
  rewritten_.resize(op.count);
  std::memcpy(rewritten_.data(), table, table_bytes);
  for (std::size_t i = 0; i < op.count; ++i) {
    kernels::CopyDesc& d = rewritten_[i];
    if (d.bytes == 0) continue;
    void* src = dev_.translate_kernel(d.src, d.bytes);
    void* dst = dev_.translate_kernel(d.dst, d.bytes);
    if (src == nullptr || dst == nullptr) {
      dev_.poison(
          kIllegalAddress,
          fmt::format(
              "copy kernel descriptor {} of {}: {} {} (+{} bytes) is neither device memory nor "
              "registered host memory (a GPU faults here)",
              i, op.count, src == nullptr ? "source" : "destination",
              src == nullptr ? d.src : static_cast<const void*>(d.dst), d.bytes));
      return;
    }
    d.src = src;
    d.dst = dst;
  }
  if (!executor_)
    executor_ = std::make_unique<CtaExecutor>(static_cast<unsigned>(kernels::kBatchCopyThreads));
  dev_.counters.kernel_ctas.fetch_add(op.ctas);
  executor_->run(rewritten_.data(), op.count, op.ctas);
}

// ---- the device ----

SimDevice::Impl::Impl(SimOptions o) : options(o) {
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
  default_stream.reset();
  for (auto& [host, m] : host_maps) {
    if (m.pinned) std::free(reinterpret_cast<void*>(host));
  }
  if (window_reservation != nullptr) ::munmap(window_reservation, reservation_bytes);
  ::munmap(alias, reservation_bytes);
  ::munmap(device_reservation, reservation_bytes);
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

void* SimDevice::Impl::translate_kernel(const void* p, std::size_t n) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu);
  if (device_range.contains(addr)) {
    if (device_range.find(addr, n).first == SIZE_MAX) return nullptr;
    return static_cast<std::byte*>(alias) + (addr - device_range.base());
  }
  for (auto& [host, m] : host_maps) {
    if (addr >= m.device && addr + n <= m.device + m.bytes) {
      return reinterpret_cast<void*>(host + (addr - m.device));
    }
  }
  return nullptr;
}

SimStream* SimDevice::Impl::stream_of(void* handle) {
  if (handle != nullptr) return static_cast<SimStream*>(handle);
  std::lock_guard lock(mu);
  if (!default_stream) default_stream = std::make_unique<SimStream>(*this);
  return default_stream.get();
}

void SimDevice::Impl::synchronize_all() {
  std::vector<SimStream*> all;
  {
    std::lock_guard lock(mu);
    all.assign(streams.begin(), streams.end());
    if (default_stream) all.push_back(default_stream.get());
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

const char* sim_error_name(void*, int err) {
  const ErrorText* e = find_error(err);
  return e != nullptr ? e->name : "simErrorUnknown";
}
const char* sim_error_string(void*, int err) {
  const ErrorText* e = find_error(err);
  return e != nullptr ? e->text : "unknown error";
}
int sim_get_last_error(void* ctx) {
  ThreadState& t = thread_state(ctx);
  const int err = t.last_error;
  t.last_error = 0;
  return err != 0 ? err : dev(ctx).sticky();
}
int sim_get_device_count(void* ctx, int* count) {
  *count = dev(ctx).options.device_count;
  return kSuccess;
}
int sim_get_device(void* ctx, int* device) {
  const int bound = thread_state(ctx).bound;
  *device = bound < 0 ? 0 : bound;  // a thread without a context reports device 0, as CUDA does
  return kSuccess;
}
int sim_set_device(void* ctx, int device) {
  auto& d = dev(ctx);
  if (device < 0 || device >= d.options.device_count) return d.fail(kInvalidDevice);
  thread_state(ctx).bound = device;
  return kSuccess;
}
int sim_device_describe(void* ctx, int device, char* name, std::size_t name_len, char* arch,
                        std::size_t arch_len) {
  auto& d = dev(ctx);
  if (device < 0 || device >= d.options.device_count) return d.fail(kInvalidDevice);
  (void)std::snprintf(name, name_len, "kvoffload simulated device %d", device);
  (void)std::snprintf(arch, arch_len, "sim (%s addressing)",
                      d.options.unified_addressing ? "unified" : "separate");
  return kSuccess;
}
int sim_version(void*, int* version) {
  *version = 1000;
  return kSuccess;
}
void sim_version_text(void*, int version, char* out, std::size_t len) {
  (void)std::snprintf(out, len, "%d.%d", version / 1000, (version % 1000) / 10);
}
int sim_exchange_capture_mode(void* ctx, int* mode, int relaxed) {
  ThreadState& t = thread_state(ctx);
  const int previous = t.capture_mode;
  t.capture_mode = relaxed != 0 ? 1 : *mode;
  *mode = previous;
  return kSuccess;
}
int sim_legacy_stream_capturing(void* ctx, int* capturing) {
  *capturing = dev(ctx).faults.legacy_capturing.load() != 0 ? 1 : 0;
  return kSuccess;
}

int sim_stream_create(void* ctx, void** stream) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  auto s = std::make_unique<SimStream>(d);
  std::lock_guard lock(d.mu);
  d.streams.insert(s.get());
  *stream = s.release();
  return kSuccess;
}
int sim_stream_destroy(void* ctx, void* stream) {
  auto& d = dev(ctx);
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
  d.stream_of(stream)->synchronize();
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_stream_wait_event(void* ctx, void* stream, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  if (event == nullptr) return d.fail(kInvalidHandle);
  std::shared_ptr<Marker> m = static_cast<CpuEvent*>(event)->current();
  if (!m) return kSuccess;  // never recorded: nothing to wait for
  Op op;
  op.kind = Op::Kind::kWaitEvent;
  op.marker = std::move(m);
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}
int sim_stream_wait_value32(void* ctx, void* stream, std::uint32_t* flag, std::uint32_t value) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  // The flag must be memory the device can see: registered or pinned host memory.
  auto* host = static_cast<std::uint32_t*>(d.translate_kernel(flag, sizeof *flag));
  if (host == nullptr) return d.fail(kInvalidValue);
  Op op;
  op.kind = Op::Kind::kWaitValue;
  op.flag = host;
  op.flag_value = value;
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}
int sim_launch_host_func(void* ctx, void* stream, void (*fn)(void*), void* arg) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  Op op;
  op.kind = Op::Kind::kHostFunc;
  op.fn = fn;
  op.arg = arg;
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}
int sim_event_create(void* ctx, void** event, int timing) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  auto* e = new CpuEvent();
  e->timing = timing != 0;
  *event = e;
  return kSuccess;
}
int sim_event_destroy(void*, void* event) {
  delete static_cast<CpuEvent*>(event);
  return kSuccess;
}
int sim_event_record(void* ctx, void* event, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  if (event == nullptr) return d.fail(kInvalidHandle);
  Op op;
  std::shared_ptr<Marker> m = static_cast<CpuEvent*>(event)->record();
  op.kind = Op::Kind::kRecord;
  op.marker = std::move(m);
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}
int sim_event_query(void* ctx, void* event) {
  auto& d = dev(ctx);
  std::shared_ptr<Marker> m = static_cast<CpuEvent*>(event)->current();
  if (m && !m->is_done()) return d.fail(kNotReady);
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_event_synchronize(void* ctx, void* event) {
  auto& d = dev(ctx);
  if (std::shared_ptr<Marker> m = static_cast<CpuEvent*>(event)->current()) m->wait();
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_event_elapsed_ms(void* ctx, float* ms, void* start, void* end) {
  auto& d = dev(ctx);
  auto* a = static_cast<CpuEvent*>(start);
  auto* b = static_cast<CpuEvent*>(end);
  const auto ma = a->current();
  const auto mb = b->current();
  if (!a->timing || !b->timing || !ma || !mb) return d.fail(kInvalidHandle);
  if (!ma->is_done() || !mb->is_done()) return d.fail(kNotReady);
  *ms = std::chrono::duration<float, std::milli>(mb->completed_at() - ma->completed_at()).count();
  return kSuccess;
}

// Maps [ptr, ptr + bytes) for the device; the device address is the host address with unified
// addressing, else a fresh address in the window.
int map_host(SimDevice::Impl& d, void* ptr, std::size_t bytes, bool pinned) {
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(d.mu);
  auto it = d.host_maps.lower_bound(begin);
  if (it != d.host_maps.end() && it->first < begin + bytes) return d.fail(kAlreadyRegistered);
  if (it != d.host_maps.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.bytes > begin) return d.fail(kAlreadyRegistered);
  }
  HostMapping m{bytes, begin, pinned};
  if (d.window_reservation != nullptr) {
    // A page more than asked: mappings never abut, as ROCm gives no contiguity guarantee either.
    const std::size_t off = d.window_range.allocate(bytes + 4096);
    if (off == SIZE_MAX) return d.fail(kOutOfMemory);
    m.device = d.window_range.base() + off;
  }
  d.host_maps.emplace(begin, m);
  return kSuccess;
}

int unmap_host(SimDevice::Impl& d, void* ptr, bool pinned) {
  std::lock_guard lock(d.mu);
  auto it = d.host_maps.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == d.host_maps.end() || it->second.pinned != pinned) return d.fail(kNotRegistered);
  if (d.window_reservation != nullptr)
    (void)d.window_range.release(it->second.device - d.window_range.base());
  d.host_maps.erase(it);
  return kSuccess;
}

int sim_host_register(void* ctx, void* ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  d.counters.host_register_calls.fetch_add(1);
  if (int n = d.faults.fail_register_at.load();
      n > 0 && d.faults.fail_register_at.fetch_sub(1) == 1) {
    return d.fail(kOutOfMemory);
  }
  if (ptr == nullptr || bytes == 0) return d.fail(kInvalidValue);
  if (d.translate_dma(ptr, 1).first == SimDevice::Impl::Side::kDevice) return d.fail(kInvalidValue);
  const int err = map_host(d, ptr, bytes, false);
  if (err == kSuccess) d.counters.live_registrations.fetch_add(1);
  return err;
}
int sim_host_unregister(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  const int err = unmap_host(d, ptr, false);
  if (err == kSuccess) d.counters.live_registrations.fetch_sub(1);
  return err;
}
int sim_host_device_pointer(void* ctx, void** device, void* host) {
  auto& d = dev(ctx);
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
int sim_host_alloc_mapped(void* ctx, void** ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return d.fail(kOutOfMemory);
  if (const int err = map_host(d, p, bytes, true); err != kSuccess) {
    std::free(p);
    return err;
  }
  *ptr = p;
  return kSuccess;
}
int sim_host_free(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  if (const int err = unmap_host(d, ptr, true); err != kSuccess) return err;
  std::free(ptr);
  return kSuccess;
}
int sim_device_malloc(void* ctx, void** ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  if (bytes == 0) return d.fail(kInvalidValue);
  std::lock_guard lock(d.mu);
  const std::size_t off = d.device_range.allocate(bytes);
  if (off == SIZE_MAX) return d.fail(kOutOfMemory);
  d.counters.live_device_allocations.fetch_add(1);
  *ptr = reinterpret_cast<void*>(d.device_range.base() + off);
  return kSuccess;
}
int release_device(SimDevice::Impl& d, void* ptr) {
  std::lock_guard lock(d.mu);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (!d.device_range.contains(addr)) return d.fail(kInvalidValue);
  const std::size_t off = addr - d.device_range.base();
  const std::size_t n = d.device_range.release(off);
  if (n == 0) return d.fail(kInvalidValue);
  (void)::madvise(static_cast<std::byte*>(d.alias) + off, n, MADV_DONTNEED);
  d.counters.live_device_allocations.fetch_sub(1);
  return kSuccess;
}
int sim_device_free(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  // cudaFree waits for the whole device: the allocation may still be in use by any stream.
  d.counters.device_syncs.fetch_add(1);
  d.synchronize_all();
  return release_device(d, ptr);
}
int sim_device_free_async(void* ctx, void* ptr, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  if (!d.device_range.contains(reinterpret_cast<std::uintptr_t>(ptr))) return d.fail(kInvalidValue);
  Op op;
  op.kind = Op::Kind::kFree;
  op.dst = ptr;
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}
int sim_pointer_is_device(void* ctx, const void* ptr, int* is_device) {
  *is_device = dev(ctx).device_range.contains(reinterpret_cast<std::uintptr_t>(ptr)) ? 1 : 0;
  return kSuccess;
}

// Checks a DMA's two sides against `kind` and returns the translated piece, or an error.
int dma_piece(SimDevice::Impl& d, void* dst, const void* src, std::size_t bytes, int kind,
              CopyPiece& out) {
  using Side = SimDevice::Impl::Side;
  const auto [dside, dhost] = d.translate_dma(dst, bytes);
  const auto [sside, shost] = d.translate_dma(src, bytes);
  if (dside == Side::kInvalid || sside == Side::kInvalid) return kInvalidValue;
  const Side want_src =
      kind == kMemcpyHostToDevice || kind == kMemcpyHostToHost ? Side::kHost : Side::kDevice;
  const Side want_dst =
      kind == kMemcpyDeviceToHost || kind == kMemcpyHostToHost ? Side::kHost : Side::kDevice;
  if (kind != kMemcpyDefault && (sside != want_src || dside != want_dst)) return kInvalidValue;
  out = CopyPiece{dhost, shost, bytes};
  return kSuccess;
}

int sim_memcpy_async(void* ctx, void* dst, const void* src, std::size_t bytes, int kind,
                     void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  d.counters.memcpy_calls.fetch_add(1);
  if (int n = d.faults.fail_memcpy_at.load(); n > 0 && d.faults.fail_memcpy_at.fetch_sub(1) == 1) {
    return d.fail(kInvalidValue);
  }
  Op op;
  op.kind = Op::Kind::kCopy;
  op.pieces.resize(1);
  if (const int err = dma_piece(d, dst, src, bytes, kind, op.pieces[0]); err != kSuccess)
    return d.fail(err);
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}
int sim_memset_async(void* ctx, void* dst, int value, std::size_t bytes, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_STICKY(d);
  const auto [side, host] = d.translate_dma(dst, bytes);
  if (side == SimDevice::Impl::Side::kInvalid) return d.fail(kInvalidValue);
  Op op;
  op.kind = Op::Kind::kMemset;
  op.dst = host;
  op.value = value;
  op.bytes = bytes;
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}

int sim_memcpy_batch_async(void* ctx, void** dsts, const void** srcs, std::size_t* sizes,
                           std::size_t count, int source_in_stream_order, void* stream,
                           std::size_t* fail_index) {
  auto& d = dev(ctx);
  *fail_index = SIZE_MAX;
  KVO_SIM_STICKY(d);
  d.counters.batch_calls.fetch_add(1);
  // A driver-level call: it needs a context bound on this thread.
  if (thread_state(ctx).bound < 0) {
    d.counters.batch_refused.fetch_add(1);
    return kInvalidContext;
  }
  if (int n = d.faults.refuse_batches.load(); n > 0 && d.faults.refuse_batches.fetch_sub(1) >= 1) {
    d.counters.batch_refused.fetch_add(1);
    return d.faults.refuse_batch_code.load();
  }
  if (stream == nullptr || count == 0) return kInvalidValue;  // the legacy stream is refused
  Op op;
  op.kind = Op::Kind::kCopy;
  op.pieces.resize(count);
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0 ||
        dma_piece(d, dsts[i], srcs[i], sizes[i], kMemcpyDefault, op.pieces[i]) != kSuccess) {
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
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}
const char* sim_batch_error_text(void* ctx, int code) {
  return sim_error_name(ctx, code);
}
int sim_batch_error_is_permanent(void*, int code) {
  return code == kNotSupported || code == kNotPermitted ? 1 : 0;
}

int sim_kernel_check(void*) {
  return kSuccess;
}
int sim_kernel_launch(void* ctx, const VendorCopyDesc* descs, std::size_t count, int ctas,
                      void* stream) {
  auto& d = dev(ctx);
  // An unrelated earlier error left in this thread's slot (torch's, say); a launch API does not
  // clear it, and must not report it either.
  if (const int stale = d.faults.stale_error_before_launch.load(); stale != 0)
    thread_state(ctx).last_error = stale;
  KVO_SIM_STICKY(d);
  if (int n = d.faults.fail_launches.load(); n > 0 && d.faults.fail_launches.fetch_sub(1) >= 1) {
    return d.fail(kLaunchOutOfResources);
  }
  if (ctas <= 0 || ctas > 65535 || descs == nullptr) return d.fail(kInvalidValue);
  d.counters.kernel_launches.fetch_add(1);
  if (count == 0) return kSuccess;
  Op op;
  op.kind = Op::Kind::kKernel;
  op.descs = descs;
  op.count = count;
  op.ctas = static_cast<unsigned>(ctas);
  d.stream_of(stream)->push(std::move(op));
  return kSuccess;
}

#undef KVO_SIM_STICKY

}  // namespace

SimOptions SimOptions::from_env() {
  SimOptions o;
  if (const char* env = std::getenv("KVOFFLOAD_SIM_DEVICES"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end != '\0' || n < 1 || n > 64) {
      throw_invalid(std::string("KVOFFLOAD_SIM_DEVICES='") + env +
                    "' is not a device count from 1 to 64");
    }
    o.device_count = static_cast<int>(n);
  }
  if (const char* env = std::getenv("KVOFFLOAD_SIM_FAIL_REGISTER_AT");
      env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end != '\0' || n < 0 || n > 1'000'000) {
      throw_invalid(std::string("KVOFFLOAD_SIM_FAIL_REGISTER_AT='") + env +
                    "' is not a registration number from 0 (none) to 1000000");
    }
    o.fail_register_at = static_cast<int>(n);
  }
  return o;
}

SimDevice::SimDevice(SimOptions options) : impl_(std::make_unique<Impl>(options)) {
  VendorApi& a = impl_->api;
  a.version = kVendorApiVersion;
  a.name = "sim";
  a.ctx = impl_.get();
  a.caps = options.unified_addressing ? kCapUnifiedAddressing : 0u;
  a.err_not_ready = kNotReady;
  a.err_capture_implicit = kCaptureImplicit;
  a.legacy_stream = nullptr;
  a.error_name = sim_error_name;
  a.error_string = sim_error_string;
  a.get_last_error = sim_get_last_error;
  a.get_device_count = sim_get_device_count;
  a.get_device = sim_get_device;
  a.set_device = sim_set_device;
  a.device_describe = sim_device_describe;
  a.driver_version = sim_version;
  a.runtime_version = sim_version;
  a.version_text = sim_version_text;
  a.exchange_capture_mode = sim_exchange_capture_mode;
  a.legacy_stream_capturing = sim_legacy_stream_capturing;
  a.stream_create = sim_stream_create;
  a.stream_destroy = sim_stream_destroy;
  a.stream_synchronize = sim_stream_synchronize;
  a.stream_wait_event = sim_stream_wait_event;
  a.stream_wait_value32 = sim_stream_wait_value32;
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
  a.device_free_async = sim_device_free_async;
  a.pointer_is_device = sim_pointer_is_device;
  a.memcpy_async = sim_memcpy_async;
  a.memset_async = sim_memset_async;
  a.memcpy_batch_async = options.batch_memcpy ? sim_memcpy_batch_async : nullptr;
  a.batch_error_text = sim_batch_error_text;
  a.batch_error_is_permanent = sim_batch_error_is_permanent;
  a.batch_detail = options.batch_memcpy
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
