#pragma once
// DeviceRuntime: the coarse, per-batch interface the transfer engine drives (docs/DESIGN.md §4).
// Backends: "host" (always built; device memory is host memory, streams are ordered worker
// threads, copies are memcpy), "sim" (always built: the GPU runtime of core/src/runtime/gpu over a
// simulated device on the CPU, for tests and CI), "cuda" and "hip" (the same GPU runtime over
// the vendor tables of the modules cuda/ and hip/ build, loaded on first use). No CUDA or HIP
// type appears here.
//
//   auto rt = kvoffload::make_runtime("auto");            // cuda, else hip, else host
//   kvoffload::Stream s = rt->create_stream();
//   kvoffload::Event done = rt->create_event();
//   rt->enqueue_copies(s.view(), descriptors, CopyKind::kDeviceToHost, CopyPath::kDma);
//   rt->record_event(done.view(), s.view());
//   rt->synchronize_event(done.view());
//
// Handles. Streams, events, host registrations and device allocations are owned by move-only RAII
// types (Stream, Event, HostRegistration, DeviceBuffer) that call back into the runtime that made
// them; the runtime must outlive them. Non-owning views (StreamView, EventView) are what the calls
// take. A caller's own stream (e.g. the engine's torch compute stream) is wrapped without taking
// ownership by StreamView::from_native(handle): for cuda/hip the handle is the cudaStream_t /
// hipStream_t value as an integer (0 = the legacy default stream), for host it is
// Stream::native() of a stream made by the same host runtime (0 = "no stream": work on it runs
// synchronously in the caller's thread).
//
// Errors. Every call throws kvoffload::Error: kDevice for an error the device runtime reported
// (message names the runtime call and its error string, Error::call() is the call), kNotAvailable
// for a backend that is not built or has no device, kInvalidArgument for bad input. Asynchronous
// copy failures surface from query_event / synchronize_event of an event recorded after the copy.
//
// Implementing a backend. Derive from DeviceRuntime and implement the protected do_* functions,
// which take and return raw handles (std::uintptr_t, never 0 for a valid created object). The
// public functions wrap them into owners. The backend factory functions are declared in
// core/src/runtime/backend_factories.hpp (add core/src to the backend's include path).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kvoffload/export.h>

namespace kvoffload {

class DeviceRuntime;

// ---- copy batches ----------------------------------------------------------------------------

// Which engine moves the bytes. kDma: the copy engines (cudaMemcpyBatchAsync or a loop of async
// memcpys). kKernel: an SM copy kernel from kernels/, which reads/writes host memory through the
// device pointer of a registration (never through an unregistered pointer).
enum class CopyPath : std::uint8_t { kDma = 0, kKernel = 1 };

// Direction of every descriptor of a batch; selects the memcpy kind and, for batched DMA, the
// source access order (STREAM for device-to-host, ANY only for host-to-device).
enum class CopyKind : std::uint8_t {
  kHostToDevice = 0,
  kDeviceToHost = 1,
  kDeviceToDevice = 2,
  kHostToHost = 3,
};

KVOFFLOAD_API std::string_view to_string(CopyPath path) noexcept;  // "dma" | "kernel"
KVOFFLOAD_API std::string_view to_string(CopyKind kind) noexcept;  // "h2d" | "d2h" | "d2d" | "h2h"

// One contiguous copy. For the kernel path the host-side pointer must be the device pointer of a
// registered range (HostRegistration::device_pointer); for DMA the host pointer itself.
struct CopyDescriptor {
  const void* src = nullptr;
  void* dst = nullptr;
  std::uint64_t bytes = 0;
};

// ---- views -----------------------------------------------------------------------------------

class KVOFFLOAD_API StreamView {
 public:
  constexpr StreamView() noexcept = default;
  StreamView(int) = delete;
  StreamView(std::nullptr_t) = delete;
  // Wraps a backend-native stream handle (see the header comment) without owning it.
  static constexpr StreamView from_native(std::uintptr_t handle) noexcept {
    return StreamView(handle);
  }
  [[nodiscard]] constexpr std::uintptr_t native() const noexcept { return handle_; }
  friend constexpr bool operator==(StreamView, StreamView) noexcept = default;

 private:
  constexpr explicit StreamView(std::uintptr_t handle) noexcept : handle_(handle) {}
  std::uintptr_t handle_ = 0;
};

class KVOFFLOAD_API EventView {
 public:
  constexpr EventView() noexcept = default;
  EventView(int) = delete;
  EventView(std::nullptr_t) = delete;
  static constexpr EventView from_native(std::uintptr_t handle) noexcept {
    return EventView(handle);
  }
  [[nodiscard]] constexpr std::uintptr_t native() const noexcept { return handle_; }
  [[nodiscard]] constexpr bool valid() const noexcept { return handle_ != 0; }
  friend constexpr bool operator==(EventView, EventView) noexcept = default;

 private:
  constexpr explicit EventView(std::uintptr_t handle) noexcept : handle_(handle) {}
  std::uintptr_t handle_ = 0;
};

// ---- owners ----------------------------------------------------------------------------------

class KVOFFLOAD_API Stream {
 public:
  Stream() noexcept = default;
  Stream(int) = delete;
  Stream(std::nullptr_t) = delete;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  [[nodiscard]] StreamView view() const noexcept { return StreamView::from_native(handle_); }
  [[nodiscard]] std::uintptr_t native() const noexcept { return handle_; }
  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != 0; }
  // Destroys the stream now (pending work is finished first by the backend). Never throws.
  void reset() noexcept;

 private:
  friend class DeviceRuntime;
  Stream(DeviceRuntime* runtime, std::uintptr_t handle) noexcept
      : runtime_(runtime), handle_(handle) {}
  DeviceRuntime* runtime_ = nullptr;
  std::uintptr_t handle_ = 0;
};

class KVOFFLOAD_API Event {
 public:
  Event() noexcept = default;
  Event(int) = delete;
  Event(std::nullptr_t) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  [[nodiscard]] EventView view() const noexcept { return EventView::from_native(handle_); }
  [[nodiscard]] std::uintptr_t native() const noexcept { return handle_; }
  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != 0; }
  void reset() noexcept;

 private:
  friend class DeviceRuntime;
  Event(DeviceRuntime* runtime, std::uintptr_t handle) noexcept
      : runtime_(runtime), handle_(handle) {}
  DeviceRuntime* runtime_ = nullptr;
  std::uintptr_t handle_ = 0;
};

// A piece of a registration and the device address of its first byte. With unified addressing
// (CUDA) the device address is the host address; on ROCm each piece registered by its own call
// may sit elsewhere on the device, with its own offset from the host address.
struct DeviceSegment {
  std::size_t offset = 0;  // from the registration's host base
  std::size_t bytes = 0;
  void* device = nullptr;
};

// A registered (page-locked, device-mapped) host range. Unregisters on destruction; unregister
// failures are logged, never thrown (teardown keeps going).
class KVOFFLOAD_API HostRegistration {
 public:
  HostRegistration() noexcept = default;
  HostRegistration(int) = delete;
  HostRegistration(std::nullptr_t) = delete;
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != 0; }
  [[nodiscard]] void* host_base() const noexcept { return host_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  // The address kernels use for host_ptr (HIP may differ from the host address, piece by
  // piece). host_ptr must lie in [host_base, host_base + bytes]; throws kInvalidArgument
  // otherwise. A range handed to a kernel must not cross a segment boundary (see segments()).
  [[nodiscard]] void* device_pointer(const void* host_ptr) const;
  [[nodiscard]] void* device_base() const noexcept { return device_; }
  // The pieces and their device addresses, in address order (one segment when the device side is
  // contiguous).
  [[nodiscard]] const std::vector<DeviceSegment>& segments() const noexcept { return segments_; }
  // Unregisters now. Returns false when the backend reported a failure (logged). Never throws.
  bool reset() noexcept;

 private:
  friend class DeviceRuntime;
  HostRegistration(DeviceRuntime* runtime, std::uintptr_t handle, void* host, std::size_t bytes,
                   std::vector<DeviceSegment> segments) noexcept
      : runtime_(runtime),
        handle_(handle),
        host_(host),
        bytes_(bytes),
        device_(segments.empty() ? nullptr : segments.front().device),
        segments_(std::move(segments)) {}
  DeviceRuntime* runtime_ = nullptr;
  std::uintptr_t handle_ = 0;
  void* host_ = nullptr;
  std::size_t bytes_ = 0;
  void* device_ = nullptr;
  std::vector<DeviceSegment> segments_;
};

// A 32-bit word in host memory that a stream can wait on (DeviceRuntime::wait_host_flag) and the
// host sets: pinned, device-mapped memory on CUDA, signal memory on HIP (hipStreamWaitValue32 is
// documented for nothing else). Freed on destruction.
class KVOFFLOAD_API HostFlag {
 public:
  HostFlag() noexcept = default;
  HostFlag(int) = delete;
  HostFlag(std::nullptr_t) = delete;
  HostFlag(HostFlag&& other) noexcept;
  HostFlag& operator=(HostFlag&& other) noexcept;
  HostFlag(const HostFlag&) = delete;
  HostFlag& operator=(const HostFlag&) = delete;
  ~HostFlag();

  // Stores `value` with release order: work enqueued before it on the host is visible to what
  // the stream runs after its wait passes.
  void set(std::uint32_t value) noexcept;
  [[nodiscard]] std::uint32_t value() const noexcept;
  [[nodiscard]] const std::uint32_t* data() const noexcept { return word_; }
  [[nodiscard]] explicit operator bool() const noexcept { return word_ != nullptr; }
  void reset() noexcept;

 private:
  friend class DeviceRuntime;
  HostFlag(DeviceRuntime* runtime, std::uint32_t* word) noexcept : runtime_(runtime), word_(word) {}
  DeviceRuntime* runtime_ = nullptr;
  std::uint32_t* word_ = nullptr;
};

// Device memory (host memory on the host backend); for tests, benchmarks and calibration.
class KVOFFLOAD_API DeviceBuffer {
 public:
  DeviceBuffer() noexcept = default;
  DeviceBuffer(int) = delete;
  DeviceBuffer(std::nullptr_t) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  [[nodiscard]] void* data() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] explicit operator bool() const noexcept { return ptr_ != nullptr; }
  void reset() noexcept;
  // Frees in `stream` order (cudaFreeAsync): the memory is released once the work enqueued on
  // the stream so far has finished, and unlike reset() nothing waits for the whole device.
  void release_async(StreamView stream) noexcept;

 private:
  friend class DeviceRuntime;
  DeviceBuffer(DeviceRuntime* runtime, void* ptr, std::size_t bytes) noexcept
      : runtime_(runtime), ptr_(ptr), bytes_(bytes) {}
  DeviceRuntime* runtime_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// ---- options and discovery ---------------------------------------------------------------------

struct RuntimeOptions {
  int device = 0;  // device ordinal (cuda/hip); ignored by host
  // SM copy kernel grid bound (CTAs / workgroups); 0 = backend default (small: leaves the model's
  // SMs alone). On the host backend: helper threads used by the kernel path.
  unsigned kernel_max_blocks = 0;
  unsigned kernel_threads_per_block = 0;  // 0 = backend default
  // host backend: threads a large batch is split over (0 = min(4, hardware threads)), and the
  // smallest batch (bytes) worth splitting.
  unsigned host_copy_threads = 0;
  std::uint64_t host_split_min_bytes = 0;  // 0 = backend default
  bool hip_mlock_registered = false;       // hip: mlock registered ranges (ROCm page migration)
  std::uint64_t register_chunk_bytes = 0;  // cuda/hip/sim: max bytes per register call (0 = 64 GiB)
  // cuda/hip/sim kernel path: descriptor ring of each stream (0 = defaults: 64 slots of 4096
  // descriptors), and whether a launch first stages its descriptors in device memory with one
  // copy (every CTA then reads them from device memory instead of over PCIe).
  unsigned kernel_ring_slots = 0;
  unsigned kernel_ring_slot_descriptors = 0;
  bool kernel_stage_descriptors = true;
  // cuda/hip/sim: a device the module's copy kernel cannot run on (its architecture was not
  // built, e.g. gfx942 with Debian's ROCm 5.2) fails the runtime's creation, naming both; true
  // runs it with DMA only instead (KVOFFLOAD_ALLOW_MISSING_KERNEL=1 does the same).
  bool allow_missing_kernel = false;
};

// What a GPU runtime did, for tests and benchmarks that must know which path ran.
struct RuntimeCounters {
  std::uint64_t dma_batched_calls = 0;   // batched-DMA calls (cuMemcpyBatchAsync) accepted
  std::uint64_t dma_batch_refusals = 0;  // batched-DMA calls refused (then redone as a loop)
  std::uint64_t dma_loop_copies = 0;     // copies enqueued one by one (memcpyAsync)
  std::uint64_t kernel_launches = 0;     // copy-kernel launches
  std::uint64_t kernel_descriptors = 0;  // descriptors those launches carried
  std::uint64_t ring_waits = 0;          // launches that waited for a free descriptor slot
  bool batched_dma_enabled = false;      // whether the batched entry point is still in use
};

struct BackendInfo {
  std::string name;      // "host" | "sim" | "cuda" | "hip"
  bool built = false;    // compiled into this library
  int device_count = 0;  // devices visible (host: 1)
  std::string detail;    // driver/runtime version, device names, or why unavailable
};

// Every backend this library knows, built or not: cuda, hip, host (the order auto tries them),
// then sim (never chosen by auto).
KVOFFLOAD_API std::vector<BackendInfo> list_backends();

// What make_runtime(name) would use, without creating a runtime (so without touching any device:
// no context is created): the backend "auto" resolves to, its device count and details. A rank
// picks its device from it before it makes its runtime (`kvoffload run`). Never throws for a
// backend that is not built or has no device (device_count 0 then, detail says why);
// kInvalidArgument for an unknown name.
KVOFFLOAD_API BackendInfo probe_backend(std::string_view name);

// name: "host" | "sim" | "cuda" | "hip" | "auto" (cuda if its module loads and sees a device,
// else hip, else host; never sim).
// Throws kNotAvailable naming the backend and why (not built / no device), kInvalidArgument for
// an unknown name.
KVOFFLOAD_API std::unique_ptr<DeviceRuntime> make_runtime(std::string_view name,
                                                          const RuntimeOptions& options = {});

// ---- the interface ---------------------------------------------------------------------------

class KVOFFLOAD_API DeviceRuntime {
 public:
  DeviceRuntime() = default;
  DeviceRuntime(const DeviceRuntime&) = delete;
  DeviceRuntime& operator=(const DeviceRuntime&) = delete;
  virtual ~DeviceRuntime();

  [[nodiscard]] virtual std::string_view name() const noexcept = 0;  // "host" | "sim" | ...
  [[nodiscard]] virtual BackendInfo info() const = 0;
  // Whether CopyPath::kKernel is implemented (false: the engine only uses DMA).
  [[nodiscard]] virtual bool supports_kernel_path() const noexcept = 0;
  // Which paths ran so far (GPU runtimes; the host backend counts batches only).
  [[nodiscard]] virtual RuntimeCounters counters() const noexcept { return {}; }

  // Host memory. Registers [ptr, ptr+bytes) (cuda/hip: in row-aligned pieces of at most
  // register_chunk_bytes, sticky errors cleared). Throws kDevice on failure, leaving nothing
  // registered. `align` is the unit pieces are aligned to (the region's row stride; 0 = none).
  [[nodiscard]] HostRegistration register_host(void* ptr, std::size_t bytes, std::size_t align = 0);

  [[nodiscard]] Stream create_stream();
  // timing: the event can be used with elapsed_seconds (slightly costlier on GPUs).
  [[nodiscard]] Event create_event(bool timing = false);
  [[nodiscard]] DeviceBuffer allocate_device(std::size_t bytes);
  // A word for wait_host_flag, initially 0.
  [[nodiscard]] HostFlag create_host_flag();
  // Whether `stream` is capturing a graph (cudaStreamIsCapturing); the engine refuses to wait on
  // such a stream. Backends without graphs: false.
  [[nodiscard]] bool stream_capturing(StreamView stream) {
    return do_stream_capturing(stream.native());
  }

  // Enqueues one batch on `stream`; returns once the descriptors are captured (the span may be
  // reused immediately). Empty batches are allowed and do nothing.
  void enqueue_copies(StreamView stream, std::span<const CopyDescriptor> batch, CopyKind kind,
                      CopyPath path) {
    do_enqueue_copies(stream.native(), batch, kind, path);
  }
  void record_event(EventView event, StreamView stream) {
    do_record_event(event.native(), stream.native());
  }
  // Work enqueued on `stream` after this call waits for the event's latest record.
  void wait_event(StreamView stream, EventView event) {
    do_wait_event(stream.native(), event.native());
  }
  // true when the latest record has completed (an event never recorded is complete).
  [[nodiscard]] bool query_event(EventView event) { return do_query_event(event.native()); }
  void synchronize_event(EventView event) { do_synchronize_event(event.native()); }
  void synchronize_stream(StreamView stream) { do_synchronize_stream(stream.native()); }
  // Seconds between two completed timing events.
  [[nodiscard]] double elapsed_seconds(EventView start, EventView end) {
    return do_elapsed_seconds(start.native(), end.native());
  }
  // Runs fn(arg) in stream order on a runtime thread (cudaLaunchHostFunc): fn must not call the
  // runtime. After a device error CUDA never runs it (HIP does): nothing may wait for it to
  // learn that work finished; wait on an event instead.
  void launch_host_func(StreamView stream, void (*fn)(void*), void* arg) {
    do_launch_host_func(stream.native(), fn, arg);
  }
  // Work enqueued on `stream` after this call waits until the 32-bit word at `flag` equals
  // `value` (cuStreamWaitValue32 / hipStreamWaitValue32). `flag` is HostFlag::data() of a flag
  // of this runtime (HIP accepts nothing else) and stays valid until the wait passed. A gate that
  // needs no host thread: tests hold a stream with it ("compute still running") where a blocking
  // host function would be forbidden.
  void wait_host_flag(StreamView stream, const std::uint32_t* flag, std::uint32_t value) {
    do_wait_host_flag(stream.native(), flag, value);
  }
  // Synchronous copy between any two of host / device memory (tests, calibration).
  void memcpy_sync(void* dst, const void* src, std::size_t bytes) {
    do_memcpy_sync(dst, src, bytes);
  }
  void memset_sync(void* dst, int value, std::size_t bytes) { do_memset_sync(dst, value, bytes); }

 protected:
  struct RegistrationRecord {
    std::uintptr_t handle = 0;    // non-zero
    void* device_base = nullptr;  // device pointer of the first byte
    // Pieces with their own device addresses; empty: one segment at device_base.
    std::vector<DeviceSegment> segments;
  };

  virtual RegistrationRecord do_register_host(void* ptr, std::size_t bytes, std::size_t align) = 0;
  // May fail (returns false, after logging); never throws.
  virtual bool do_unregister_host(std::uintptr_t handle) noexcept = 0;
  virtual std::uintptr_t do_create_stream() = 0;
  virtual void do_destroy_stream(std::uintptr_t stream) noexcept = 0;
  virtual std::uintptr_t do_create_event(bool timing) = 0;
  virtual void do_destroy_event(std::uintptr_t event) noexcept = 0;
  virtual void* do_allocate_device(std::size_t bytes) = 0;
  virtual void do_free_device(void* ptr) noexcept = 0;
  virtual void do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                                 CopyKind kind, CopyPath path) = 0;
  virtual void do_record_event(std::uintptr_t event, std::uintptr_t stream) = 0;
  virtual void do_wait_event(std::uintptr_t stream, std::uintptr_t event) = 0;
  virtual bool do_query_event(std::uintptr_t event) = 0;
  virtual void do_synchronize_event(std::uintptr_t event) = 0;
  virtual void do_synchronize_stream(std::uintptr_t stream) = 0;
  virtual double do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) = 0;
  virtual void do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) = 0;
  virtual void do_memcpy_sync(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void do_memset_sync(void* dst, int value, std::size_t bytes) = 0;
  virtual void do_wait_host_flag(std::uintptr_t stream, const std::uint32_t* flag,
                                 std::uint32_t value) = 0;
  // Default: synchronize the stream, then free.
  virtual void do_free_device_async(void* ptr, std::uintptr_t stream) noexcept;
  // Default: a word of host memory (enough for the host backend, whose streams poll it).
  virtual std::uint32_t* do_create_host_flag();
  virtual void do_destroy_host_flag(std::uint32_t* flag) noexcept;
  // Default: false (no graph capture).
  virtual bool do_stream_capturing(std::uintptr_t stream);

 private:
  friend class Stream;
  friend class Event;
  friend class HostRegistration;
  friend class DeviceBuffer;
  friend class HostFlag;
  friend class ForwardingRuntime;  // calls another runtime's do_* functions
};

// A runtime over another one (a decorator: fault injection, tracing). Every function forwards to
// `inner`, which must outlive it; a subclass overrides what it changes and reaches the inner
// runtime through ForwardingRuntime's own functions (protected access does not reach another
// object's do_* functions through a DeviceRuntime&).
class KVOFFLOAD_API ForwardingRuntime : public DeviceRuntime {
 public:
  explicit ForwardingRuntime(DeviceRuntime& inner) noexcept : inner_(inner) {}
  ~ForwardingRuntime() override;

  [[nodiscard]] std::string_view name() const noexcept override { return inner_.name(); }
  [[nodiscard]] BackendInfo info() const override { return inner_.info(); }
  [[nodiscard]] bool supports_kernel_path() const noexcept override {
    return inner_.supports_kernel_path();
  }
  [[nodiscard]] RuntimeCounters counters() const noexcept override { return inner_.counters(); }

 protected:
  RegistrationRecord do_register_host(void* ptr, std::size_t bytes, std::size_t align) override {
    return inner_.do_register_host(ptr, bytes, align);
  }
  bool do_unregister_host(std::uintptr_t handle) noexcept override {
    return inner_.do_unregister_host(handle);
  }
  std::uintptr_t do_create_stream() override { return inner_.do_create_stream(); }
  void do_destroy_stream(std::uintptr_t stream) noexcept override {
    inner_.do_destroy_stream(stream);
  }
  std::uintptr_t do_create_event(bool timing) override { return inner_.do_create_event(timing); }
  void do_destroy_event(std::uintptr_t event) noexcept override { inner_.do_destroy_event(event); }
  void* do_allocate_device(std::size_t bytes) override { return inner_.do_allocate_device(bytes); }
  void do_free_device(void* ptr) noexcept override { inner_.do_free_device(ptr); }
  void do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                         CopyKind kind, CopyPath path) override {
    inner_.do_enqueue_copies(stream, batch, kind, path);
  }
  void do_record_event(std::uintptr_t event, std::uintptr_t stream) override {
    inner_.do_record_event(event, stream);
  }
  void do_wait_event(std::uintptr_t stream, std::uintptr_t event) override {
    inner_.do_wait_event(stream, event);
  }
  bool do_query_event(std::uintptr_t event) override { return inner_.do_query_event(event); }
  void do_synchronize_event(std::uintptr_t event) override { inner_.do_synchronize_event(event); }
  void do_synchronize_stream(std::uintptr_t stream) override {
    inner_.do_synchronize_stream(stream);
  }
  double do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) override {
    return inner_.do_elapsed_seconds(start, end);
  }
  void do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) override {
    inner_.do_launch_host_func(stream, fn, arg);
  }
  void do_memcpy_sync(void* dst, const void* src, std::size_t bytes) override {
    inner_.do_memcpy_sync(dst, src, bytes);
  }
  void do_memset_sync(void* dst, int value, std::size_t bytes) override {
    inner_.do_memset_sync(dst, value, bytes);
  }
  void do_wait_host_flag(std::uintptr_t stream, const std::uint32_t* flag,
                         std::uint32_t value) override {
    inner_.do_wait_host_flag(stream, flag, value);
  }
  void do_free_device_async(void* ptr, std::uintptr_t stream) noexcept override {
    inner_.do_free_device_async(ptr, stream);
  }
  std::uint32_t* do_create_host_flag() override { return inner_.do_create_host_flag(); }
  void do_destroy_host_flag(std::uint32_t* flag) noexcept override {
    inner_.do_destroy_host_flag(flag);
  }
  bool do_stream_capturing(std::uintptr_t stream) override {
    return inner_.do_stream_capturing(stream);
  }

 private:
  DeviceRuntime& inner_;
};

}  // namespace kvoffload
