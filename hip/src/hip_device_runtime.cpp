// The HIP DeviceRuntime, the twin of cuda/src/cuda_device_runtime.cpp: keep the two in step.
// Differences, all ROCm's: the device address of registered host memory may differ from the host
// address (the kernel path uses hipHostGetDevicePointer's value), registered memory is not truly
// page-locked (optional mlock, Note [mlock of registered ranges]), hipMemcpyBatchAsync takes no
// attributes, the null stream stands for the legacy default stream, and host functions go through
// hipStreamAddCallback.
//
// Note [Registration during capture]
// The twin of the CUDA note: hipHostRegister / hipHostUnregister / hipMalloc / hipFree run inside
// RelaxedCaptureMode (hipThreadExchangeStreamCaptureMode), so a HIP graph the engine captures on
// another thread stays valid; registration refuses (kState, nothing registered) while
// hipStreamIsCapturing on the null stream reports an implicit capture by a blocking stream.
//
// Note [mlock of registered ranges]
// On ROCm, hipHostRegister does not pin pages against migration (NUMA balancing, compaction);
// a migration of a registered page evicts the queues of every GPU. RuntimeOptions::
// hip_mlock_registered mlocks the range after registering it, which keeps the kernel from moving
// it. It needs RLIMIT_MEMLOCK (or CAP_IPC_LOCK) for the whole range; a refusal is a warning, not
// an error, because registration itself succeeded.
#include "hip_device_runtime.hpp"

#include "hip_check.hpp"
#include "util/clock.hpp"
#include "util/version_text.hpp"

#include <kvoffload/error.hpp>
#include <kvoffload/log.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>

namespace kvoffload::hip {

namespace {

// The transfer engine's descriptors are handed to the kernel as they are.
static_assert(sizeof(CopyDescriptor) == sizeof(kernels::CopyDesc));
static_assert(offsetof(CopyDescriptor, src) == offsetof(kernels::CopyDesc, src));
static_assert(offsetof(CopyDescriptor, dst) == offsetof(kernels::CopyDesc, dst));
static_assert(offsetof(CopyDescriptor, bytes) == offsetof(kernels::CopyDesc, bytes));

hipStream_t to_stream(std::uintptr_t handle) noexcept {
  return reinterpret_cast<hipStream_t>(handle);
}
hipEvent_t to_event(std::uintptr_t handle) noexcept {
  return reinterpret_cast<hipEvent_t>(handle);
}

hipMemcpyKind to_memcpy_kind(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::kHostToDevice: return hipMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return hipMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice: return hipMemcpyDeviceToDevice;
    case CopyKind::kHostToHost: return hipMemcpyHostToHost;
  }
  return hipMemcpyDefault;
}

std::string range_string(const void* ptr, std::size_t bytes) {
  return fmt::format("[{}, +{} bytes)", ptr, bytes);
}

}  // namespace

std::vector<std::pair<std::size_t, std::size_t>> plan_registration(std::uintptr_t base,
                                                                  std::size_t bytes,
                                                                  std::size_t align,
                                                                  std::size_t limit,
                                                                  std::size_t page) {
  std::vector<std::pair<std::size_t, std::size_t>> plan;
  if (bytes == 0) {
    return plan;
  }
  if (limit == 0 || bytes <= limit) {
    plan.emplace_back(0, bytes);
    return plan;
  }
  if (base % page != 0) {
    throw_invalid(fmt::format(
        "host registration of {} bytes needs more than one piece of at most {} bytes, and then the "
        "base address {} must be page-aligned ({} bytes)",
        bytes, limit, reinterpret_cast<const void*>(base), page));
  }
  std::size_t step = limit;
  if (align > 0 && align <= limit) {
    step = limit / align * align;  // whole rows
  }
  step = step / page * page;  // whole pages, even when a row is not a page multiple
  if (step == 0) {
    step = page;
  }
  for (std::size_t off = 0; off < bytes; off += step) {
    plan.emplace_back(off, std::min(step, bytes - off));
  }
  return plan;
}

HipRuntime::HipRuntime(const RuntimeOptions& options) : options_(options), device_(options.device) {
  DeviceGuard guard(device_);
  hipDeviceProp_t prop{};
  check_hip(hipGetDeviceProperties(&prop, device_), "hipGetDeviceProperties",
             "device " + std::to_string(device_));
  device_name_ = prop.name;
  arch_ = prop.gcnArchName;
  check_hip(hipDriverGetVersion(&driver_version_), "hipDriverGetVersion");
  check_hip(hipRuntimeGetVersion(&runtime_version_), "hipRuntimeGetVersion");

  if (options_.register_chunk_bytes != 0) {
    register_chunk_bytes_ = static_cast<std::size_t>(options_.register_chunk_bytes);
  }
  if (options_.kernel_max_blocks != 0) {
    kernel_max_ctas_ = static_cast<int>(std::min<unsigned>(options_.kernel_max_blocks, 65535u));
  }
  if (options_.kernel_threads_per_block != 0 &&
      options_.kernel_threads_per_block != static_cast<unsigned>(kernels::kBatchCopyThreads)) {
    log().warn("hip: kernel_threads_per_block={} ignored: the batch copy kernel is built for {}",
               options_.kernel_threads_per_block, kernels::kBatchCopyThreads);
  }

  batch_ = BatchMemcpy::resolve();
  batch_enabled_.store(batch_.available(), std::memory_order_relaxed);

  if (const int rc = kernels::hip::check_batch_copy(); rc == 0) {
    kernel_ok_ = true;
    kernel_detail_ = fmt::format("batch copy kernel, up to {} CTAs x {} threads", kernel_max_ctas_,
                                 kernels::kBatchCopyThreads);
  } else {
    (void)hipGetLastError();
    kernel_detail_ = "unavailable: " + describe(static_cast<hipError_t>(rc));
  }

  check_hip(hipStreamCreateWithFlags(&sync_stream_, hipStreamNonBlocking),
             "hipStreamCreateWithFlags");

  log().info("hip: device {} {} ({}), driver {}, runtime {}; dma: {}; kernel: {}", device_,
             device_name_, arch_, util::hip_version_string(driver_version_),
             util::hip_version_string(runtime_version_), batch_.detail(), kernel_detail_);
}

HipRuntime::~HipRuntime() {
  RelaxedCaptureMode relaxed;  // hipHostFree and hipHostUnregister below
  // Teardown keeps going: every step is attempted and failures are only logged. Errors such as
  // hipErrorDeinitialized at process exit are expected and harmless.
  if (std::any_of(slots_.begin(), slots_.end(), [](const DescSlot& s) { return s.retired; })) {
    // No event tells when the kernel reading a retired slot ended.
    int current = -1;
    if (hipGetDevice(&current) == hipSuccess && hipSetDevice(device_) == hipSuccess) {
      (void)hipDeviceSynchronize();
      (void)hipSetDevice(current);
    }
  }
  for (DescSlot& slot : slots_) {
    if (slot.recorded) {
      (void)hipEventSynchronize(slot.done);
    }
    (void)hipEventDestroy(slot.done);
    (void)hipHostFree(slot.host);
  }
  slots_.clear();
  for (auto& [handle, reg] : registrations_) {
    try {
      log().warn("hip: runtime destroyed with {} still registered; unregistering it",
                 range_string(reg->base, reg->bytes));
    } catch (...) {
      // logging must not stop the teardown
    }
    (void)unregister_pieces(*reg);
  }
  registrations_.clear();
  if (sync_stream_ != nullptr) {
    (void)hipStreamDestroy(sync_stream_);
  }
  (void)hipGetLastError();
}

BackendInfo HipRuntime::info() const {
  int count = 0;
  if (hipGetDeviceCount(&count) != hipSuccess) {
    (void)hipGetLastError();
  }
  return BackendInfo{
      "hip", true, count,
      fmt::format("device {} {} ({}), driver {}, runtime {}; dma: {}; kernel: {}", device_,
                  device_name_, arch_, util::hip_version_string(driver_version_),
                  util::hip_version_string(runtime_version_),
                  batch_enabled_.load(std::memory_order_relaxed) ? batch_.detail()
                                                                 : std::string("per-copy loop"),
                  kernel_detail_)};
}

// ---- host registration ----

void HipRuntime::register_pieces(Registration& reg,
                                  const std::vector<std::pair<std::size_t, std::size_t>>& plan) {
  auto* base = static_cast<std::byte*>(reg.base);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    void* p = base + plan[i].first;
    const hipError_t err =
        hipHostRegister(p, plan[i].second, hipHostRegisterPortable | hipHostRegisterMapped);
    if (err != hipSuccess) {
      (void)hipGetLastError();  // the sticky-looking error must not surface from a later call
      (void)unregister_pieces(reg);
      throw_hip(err, "hipHostRegister",
                 fmt::format("{} (piece {} of {} of {}); the engine continues on the slower "
                             "unregistered path",
                             range_string(p, plan[i].second), i + 1, plan.size(),
                             range_string(reg.base, reg.bytes)));
    }
    reg.pieces.push_back(Piece{p, plan[i].second});
  }
}

bool HipRuntime::unregister_pieces(Registration& reg) noexcept {
  bool ok = true;
  RelaxedCaptureMode relaxed;
  for (auto it = reg.pieces.rbegin(); it != reg.pieces.rend(); ++it) {
    if (const hipError_t err = hipHostUnregister(it->ptr); err != hipSuccess) {
      (void)hipGetLastError();
      ok = false;
      try {
        log().error("hip: hipHostUnregister {} failed: {}", range_string(it->ptr, it->bytes),
                    describe(err));
      } catch (...) {
        // logging must not stop the teardown
      }
    }
  }
  reg.pieces.clear();
  if (reg.mlocked) {
    if (::munlock(reg.base, reg.bytes) != 0) {
      ok = false;
      const int err = errno;
      try {
        log().error("hip: munlock {} failed: {}", range_string(reg.base, reg.bytes),
                    errno_name(err));
      } catch (...) {
      }
    }
    reg.mlocked = false;
  }
  return ok;
}

DeviceRuntime::RegistrationRecord HipRuntime::do_register_host(void* ptr, std::size_t bytes,
                                                               std::size_t align) {
  DeviceGuard guard(device_);
  RelaxedCaptureMode relaxed;  // Note [Registration during capture]

  hipStreamCaptureStatus capture = hipStreamCaptureStatusNone;
  if (const hipError_t err = hipStreamIsCapturing(nullptr, &capture);
      err != hipSuccess) {
    (void)hipGetLastError();
    if (err == hipErrorStreamCaptureImplicit) {
      throw Error(ErrorCode::kState,
                  "hip: cannot register host memory " + range_string(ptr, bytes) +
                      " while a blocking stream on device " + std::to_string(device_) +
                      " is capturing a HIP graph; register before or after the capture",
                  0, "hipStreamIsCapturing");
    }
  }

  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto reg = std::make_unique<Registration>();
  reg->base = ptr;
  reg->bytes = bytes;
  const auto start = std::chrono::steady_clock::now();
  const auto plan = plan_registration(reinterpret_cast<std::uintptr_t>(ptr), bytes, align,
                                      register_chunk_bytes_, page);
  register_pieces(*reg, plan);

  // One device address for the whole range. ROCm may map registered host memory at a device
  // address other than the host address, per registration, so the pieces' device addresses must
  // still form one contiguous span, because HostRegistration::device_pointer is base + offset.
  void* device_base = nullptr;
  bool contiguous = true;
  for (const Piece& piece : reg->pieces) {
    void* dev = nullptr;
    if (const hipError_t err = hipHostGetDevicePointer(&dev, piece.ptr, 0); err != hipSuccess) {
      (void)hipGetLastError();
      (void)unregister_pieces(*reg);
      throw_hip(err, "hipHostGetDevicePointer", range_string(piece.ptr, piece.bytes));
    }
    if (device_base == nullptr) {
      device_base = dev;
    } else if (static_cast<std::byte*>(dev) !=
               static_cast<std::byte*>(device_base) +
                   (static_cast<std::byte*>(piece.ptr) - static_cast<std::byte*>(ptr))) {
      contiguous = false;
      break;
    }
  }
  if (!contiguous) {
    log().warn("hip: device addresses of the {} registered pieces of {} are not contiguous; "
               "registering it as one piece",
               reg->pieces.size(), range_string(ptr, bytes));
    (void)unregister_pieces(*reg);
    register_pieces(*reg, {{0, bytes}});
    if (const hipError_t err = hipHostGetDevicePointer(&device_base, ptr, 0); err != hipSuccess) {
      (void)hipGetLastError();
      (void)unregister_pieces(*reg);
      throw_hip(err, "hipHostGetDevicePointer", range_string(ptr, bytes));
    }
  }

  if (options_.hip_mlock_registered) {  // Note [mlock of registered ranges]
    if (::mlock(ptr, bytes) == 0) {
      reg->mlocked = true;
    } else {
      const int err = errno;
      log().warn("hip: mlock of the registered range {} failed: {} ({}); the range stays "
                 "registered but ROCm may migrate its pages (raise RLIMIT_MEMLOCK, e.g. "
                 "`ulimit -l unlimited` or docker run --ulimit memlock=-1)",
                 range_string(ptr, bytes), std::strerror(err), errno_name(err));
    }
  }

  const double secs = util::seconds_since(start);
  log().info("hip: registered {} in {} piece(s) in {:.3f} s ({:.2f} GB/s)", range_string(ptr, bytes),
             reg->pieces.size(), secs, secs > 0 ? static_cast<double>(bytes) / secs / 1e9 : 0.0);

  const auto handle = reinterpret_cast<std::uintptr_t>(reg.get());
  try {
    std::lock_guard lock(reg_mu_);
    registrations_.emplace(handle, std::move(reg));
  } catch (...) {
    if (reg) {
      (void)unregister_pieces(*reg);
    }
    throw;
  }
  return RegistrationRecord{handle, device_base};
}

bool HipRuntime::do_unregister_host(std::uintptr_t handle) noexcept {
  std::unique_ptr<Registration> reg;
  {
    std::lock_guard lock(reg_mu_);
    if (auto it = registrations_.find(handle); it != registrations_.end()) {
      reg = std::move(it->second);
      registrations_.erase(it);
    }
  }
  if (!reg) {
    try {
      log().error("hip: unregister of an unknown registration handle {:#x}", handle);
    } catch (...) {
    }
    return false;
  }
  return unregister_pieces(*reg);
}

// ---- streams and events ----

std::uintptr_t HipRuntime::do_create_stream() {
  DeviceGuard guard(device_);
  hipStream_t stream = nullptr;
  // Non-blocking: no implicit synchronization with the legacy default stream the engine may use.
  check_hip(hipStreamCreateWithFlags(&stream, hipStreamNonBlocking), "hipStreamCreateWithFlags");
  return reinterpret_cast<std::uintptr_t>(stream);
}

void HipRuntime::do_destroy_stream(std::uintptr_t stream) noexcept {
  // Pending work finishes first, so descriptors and buffers it reads stay valid until then.
  if (hipStreamSynchronize(to_stream(stream)) != hipSuccess) {
    (void)hipGetLastError();
  }
  if (hipStreamDestroy(to_stream(stream)) != hipSuccess) {
    (void)hipGetLastError();
  }
}

std::uintptr_t HipRuntime::do_create_event(bool timing) {
  DeviceGuard guard(device_);
  hipEvent_t event = nullptr;
  check_hip(hipEventCreateWithFlags(&event, timing ? hipEventDefault : hipEventDisableTiming),
             "hipEventCreateWithFlags");
  return reinterpret_cast<std::uintptr_t>(event);
}

void HipRuntime::do_destroy_event(std::uintptr_t event) noexcept {
  if (hipEventDestroy(to_event(event)) != hipSuccess) {
    (void)hipGetLastError();
  }
}

void HipRuntime::do_record_event(std::uintptr_t event, std::uintptr_t stream) {
  DeviceGuard guard(device_);  // stream 0 means the current device's legacy stream
  check_hip(hipEventRecord(to_event(event), to_stream(stream)), "hipEventRecord");
}

void HipRuntime::do_wait_event(std::uintptr_t stream, std::uintptr_t event) {
  DeviceGuard guard(device_);
  check_hip(hipStreamWaitEvent(to_stream(stream), to_event(event), 0), "hipStreamWaitEvent");
}

bool HipRuntime::do_query_event(std::uintptr_t event) {
  const hipError_t err = hipEventQuery(to_event(event));
  if (err == hipSuccess) {
    return true;
  }
  if (err == hipErrorNotReady) {
    (void)hipGetLastError();
    return false;
  }
  throw_hip(err, "hipEventQuery", "(a copy before the event failed)");
}

void HipRuntime::do_synchronize_event(std::uintptr_t event) {
  check_hip(hipEventSynchronize(to_event(event)), "hipEventSynchronize");
}

void HipRuntime::do_synchronize_stream(std::uintptr_t stream) {
  DeviceGuard guard(device_);
  check_hip(hipStreamSynchronize(to_stream(stream)), "hipStreamSynchronize");
}

double HipRuntime::do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) {
  float ms = 0.0F;
  check_hip(hipEventElapsedTime(&ms, to_event(start), to_event(end)), "hipEventElapsedTime");
  return static_cast<double>(ms) / 1e3;
}

void HipRuntime::do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) {
  // hipLaunchHostFunc is declared by ROCm 5.2's headers but not exported by its library;
  // hipStreamAddCallback exists in every ROCm and runs in stream order the same way.
  struct HostCall {
    void (*fn)(void*);
    void* arg;
  };
  DeviceGuard guard(device_);
  auto call = std::make_unique<HostCall>(HostCall{fn, arg});
  const hipError_t err = hipStreamAddCallback(
      to_stream(stream),
      [](hipStream_t, hipError_t, void* data) {
        std::unique_ptr<HostCall> c(static_cast<HostCall*>(data));
        c->fn(c->arg);  // also after a failed copy, as the CUDA twin: waiters must not hang
      },
      call.get(), 0);
  check_hip(err, "hipStreamAddCallback");
  (void)call.release();  // the callback owns it now
}

// ---- device memory (tests, benchmarks, calibration) ----

void* HipRuntime::do_allocate_device(std::size_t bytes) {
  DeviceGuard guard(device_);
  RelaxedCaptureMode relaxed;
  void* ptr = nullptr;
  check_hip(hipMalloc(&ptr, bytes), "hipMalloc", std::to_string(bytes) + " bytes");
  return ptr;
}

void HipRuntime::do_free_device(void* ptr) noexcept {
  RelaxedCaptureMode relaxed;
  if (const hipError_t err = hipFree(ptr); err != hipSuccess) {
    (void)hipGetLastError();
    try {
      log().error("hip: hipFree({}) failed: {}", ptr, describe(err));
    } catch (...) {
    }
  }
}

void HipRuntime::do_memcpy_sync(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) {
    return;
  }
  DeviceGuard guard(device_);
  // hipMemcpyDefault: the runtime tells host from device memory itself.
  check_hip(hipMemcpyAsync(dst, src, bytes, hipMemcpyDefault, sync_stream_), "hipMemcpyAsync",
             std::to_string(bytes) + " bytes");
  check_hip(hipStreamSynchronize(sync_stream_), "hipStreamSynchronize");
}

void HipRuntime::do_memset_sync(void* dst, int value, std::size_t bytes) {
  if (bytes == 0) {
    return;
  }
  DeviceGuard guard(device_);
  hipPointerAttribute_t attr{};
  const bool known = hipPointerGetAttributes(&attr, dst) == hipSuccess;
  if (!known) {
    (void)hipGetLastError();
  }
#if HIP_VERSION_MAJOR >= 6
  const bool device_memory = attr.type == hipMemoryTypeDevice || attr.isManaged != 0;
#else
  const bool device_memory = attr.memoryType == hipMemoryTypeDevice || attr.isManaged != 0;
#endif
  if (known && device_memory) {
    check_hip(hipMemsetAsync(dst, value, bytes, sync_stream_), "hipMemsetAsync",
               std::to_string(bytes) + " bytes");
    check_hip(hipStreamSynchronize(sync_stream_), "hipStreamSynchronize");
  } else {
    std::memset(dst, value, bytes);  // host memory, registered or not
  }
}

// ---- copies ----

void HipRuntime::do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                                    CopyKind kind, CopyPath path) {
  if (batch.empty()) {
    return;
  }
  DeviceGuard guard(device_);
  if (path == CopyPath::kKernel) {
    enqueue_kernel(to_stream(stream), batch);
  } else {
    enqueue_dma(to_stream(stream), batch, kind);
  }
}

void HipRuntime::enqueue_dma(hipStream_t stream, std::span<const CopyDescriptor> batch,
                              CopyKind kind) {
  // Never the null stream (the CUDA driver refuses the legacy stream; kept the same here); one
  // copy gains nothing.
  const bool legacy = stream == nullptr;
  if (legacy || batch.size() < 2 || !batch_enabled_.load(std::memory_order_relaxed)) {
    enqueue_dma_loop(stream, batch, kind);
    return;
  }
  // Per-thread scratch: no allocation per batch once warm, and the store and load threads of the
  // engine never share it.
  thread_local std::vector<void*> dsts;
  thread_local std::vector<void*> srcs;
  thread_local std::vector<std::size_t> sizes;
  dsts.clear();
  srcs.clear();
  sizes.clear();
  for (const CopyDescriptor& d : batch) {
    if (d.bytes == 0) {
      continue;  // the runtime rejects empty copies
    }
    dsts.push_back(d.dst);
    srcs.push_back(const_cast<void*>(d.src));  // the API takes void** for both sides
    sizes.push_back(static_cast<std::size_t>(d.bytes));
  }
  if (sizes.empty()) {
    return;
  }
  std::size_t fail_index = SIZE_MAX;
  const int result =
      batch_.enqueue(dsts.data(), srcs.data(), sizes.data(), sizes.size(), stream, &fail_index);
  if (result == 0) {
    return;
  }
  // The loop below redoes the refused batch copy by copy (and reports a bad descriptor with the
  // runtime's own error). Copies the batch may already have enqueued are written again with the
  // same bytes, which is harmless: copies of one batch never overlap. The batched call is not
  // tried again in this process.
  if (batch_enabled_.exchange(false)) {
    log().warn("hip: hipMemcpyBatchAsync refused a batch of {} {} copies ({}{}); using the per-copy "
               "loop from now on",
               sizes.size(), to_string(kind), batch_.error_string(result),
               fail_index != SIZE_MAX ? fmt::format(", at copy {}", fail_index) : std::string());
  }
  enqueue_dma_loop(stream, batch, kind);
}

void HipRuntime::enqueue_dma_loop(hipStream_t stream, std::span<const CopyDescriptor> batch,
                                   CopyKind kind) {
  const hipMemcpyKind memcpy_kind = to_memcpy_kind(kind);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const CopyDescriptor& d = batch[i];
    if (d.bytes == 0) {
      continue;
    }
    if (const hipError_t err = hipMemcpyAsync(d.dst, d.src, static_cast<std::size_t>(d.bytes),
                                                memcpy_kind, stream);
        err != hipSuccess) {
      throw_hip(err, "hipMemcpyAsync",
                 fmt::format("copy {} of {} ({}, {} bytes, {} -> {})", i, batch.size(),
                             to_string(kind), d.bytes, d.src, static_cast<void*>(d.dst)));
    }
  }
}

HipRuntime::DescSlot& HipRuntime::acquire_slot() {
  const std::size_t n = slots_.size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = (next_slot_ + i) % n;
    DescSlot& slot = slots_[idx];
    if (slot.retired) {
      continue;
    }
    bool free = !slot.recorded;
    if (!free) {
      const hipError_t err = hipEventQuery(slot.done);
      if (err == hipSuccess) {
        free = true;
      } else if (err == hipErrorNotReady) {
        (void)hipGetLastError();
      } else {
        throw_hip(err, "hipEventQuery", "(an earlier kernel copy failed)");
      }
    }
    if (free) {
      next_slot_ = idx + 1;
      slot.recorded = false;
      return slot;
    }
  }
  if (n < kMaxSlots) {
    RelaxedCaptureMode relaxed;
    DescSlot slot;
    void* host = nullptr;
    check_hip(hipHostMalloc(&host, kSlotDescs * sizeof(kernels::CopyDesc),
                            hipHostMallocMapped | hipHostMallocPortable),
              "hipHostMalloc", "kernel descriptor buffer");
    slot.host = static_cast<kernels::CopyDesc*>(host);
    void* device = nullptr;
    hipError_t err = hipHostGetDevicePointer(&device, host, 0);
    if (err == hipSuccess) {
      err = hipEventCreateWithFlags(&slot.done, hipEventDisableTiming);
    }
    if (err != hipSuccess) {
      (void)hipGetLastError();
      (void)hipHostFree(host);
      throw_hip(err, "hipHostGetDevicePointer/hipEventCreateWithFlags", "kernel descriptor buffer");
    }
    slot.device = static_cast<const kernels::CopyDesc*>(device);
    slots_.push_back(slot);
    next_slot_ = slots_.size();
    return slots_.back();
  }
  // Every slot is in flight: wait for the oldest (the next in ring order).
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = (next_slot_ + i) % n;
    DescSlot& slot = slots_[idx];
    if (slot.retired) {
      continue;
    }
    check_hip(hipEventSynchronize(slot.done), "hipEventSynchronize",
               "(waiting for a kernel descriptor buffer)");
    next_slot_ = idx + 1;
    slot.recorded = false;
    return slot;
  }
  throw Error(ErrorCode::kInternal, "hip: every kernel descriptor buffer is retired");
}

void HipRuntime::enqueue_kernel(hipStream_t stream, std::span<const CopyDescriptor> batch) {
  if (!kernel_ok_) {
    throw Error(ErrorCode::kNotAvailable, "hip: the kernel copy path is " + kernel_detail_);
  }
  // Descriptors travel in a pinned ring slot that the kernel reads through its device pointer;
  // the slot is reused only after the event recorded behind the kernel has completed.
  std::lock_guard lock(ring_mu_);
  for (std::size_t first = 0; first < batch.size(); first += kSlotDescs) {
    const std::size_t count = std::min(kSlotDescs, batch.size() - first);
    DescSlot& slot = acquire_slot();
    std::memcpy(slot.host, batch.data() + first, count * sizeof(kernels::CopyDesc));
    std::uint64_t total = 0;
    for (std::size_t i = first; i < first + count; ++i) {
      total += batch[i].bytes;
    }
    const int ctas = kernels::batch_copy_ctas(total, kernel_max_ctas_);
    if (const int rc = kernels::hip::launch_batch_copy(slot.device, count, ctas, stream); rc != 0) {
      throw_hip(static_cast<hipError_t>(rc), "launch_batch_copy",
                 fmt::format("({} copies, {} bytes, {} CTAs)", count, total, ctas));
    }
    if (const hipError_t err = hipEventRecord(slot.done, stream); err != hipSuccess) {
      slot.retired = true;  // the kernel may still read it and nothing tells when it is done
      throw_hip(err, "hipEventRecord", "(after the batch copy kernel)");
    }
    slot.recorded = true;
  }
}

}  // namespace kvoffload::hip
