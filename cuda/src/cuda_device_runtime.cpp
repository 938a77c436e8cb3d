// The CUDA DeviceRuntime. hip/src/hip_device_runtime.cpp is its twin: keep the two in step.
//
// Note [Registration during capture]
// The engine may capture CUDA graphs on its compute stream while kvoffload registers the region
// or allocates on another thread. cudaHostRegister / cudaHostUnregister / cudaMalloc / cudaFree
// are "unsafe" calls during capture: in the default global capture mode they invalidate every
// capture in the process. Every such call here runs inside RelaxedCaptureMode (this thread's mode
// switched to relaxed, then restored), which the CUDA programming guide names for exactly this.
// A blocking stream capturing in the same context is different: registration synchronizes with
// the legacy default stream and would break that capture, so registration first asks
// cudaStreamIsCapturing(cudaStreamLegacy) and refuses (kState, nothing registered) when it
// reports an implicit capture. Non-blocking streams, which the engines capture on, are unaffected.
#include "cuda_device_runtime.hpp"

#include "cuda_check.hpp"
#include "util/clock.hpp"
#include "util/version_text.hpp"

#include <kvoffload/error.hpp>
#include <kvoffload/log.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>

namespace kvoffload::cuda {

namespace {

// The transfer engine's descriptors are handed to the kernel as they are.
static_assert(sizeof(CopyDescriptor) == sizeof(kernels::CopyDesc));
static_assert(offsetof(CopyDescriptor, src) == offsetof(kernels::CopyDesc, src));
static_assert(offsetof(CopyDescriptor, dst) == offsetof(kernels::CopyDesc, dst));
static_assert(offsetof(CopyDescriptor, bytes) == offsetof(kernels::CopyDesc, bytes));

cudaStream_t to_stream(std::uintptr_t handle) noexcept {
  return reinterpret_cast<cudaStream_t>(handle);
}
cudaEvent_t to_event(std::uintptr_t handle) noexcept {
  return reinterpret_cast<cudaEvent_t>(handle);
}

cudaMemcpyKind to_memcpy_kind(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice: return cudaMemcpyDeviceToDevice;
    case CopyKind::kHostToHost: return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
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

CudaRuntime::CudaRuntime(const RuntimeOptions& options) : options_(options), device_(options.device) {
  DeviceGuard guard(device_);
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties",
             "device " + std::to_string(device_));
  device_name_ = prop.name;
  arch_ = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  check_cuda(cudaDriverGetVersion(&driver_version_), "cudaDriverGetVersion");
  check_cuda(cudaRuntimeGetVersion(&runtime_version_), "cudaRuntimeGetVersion");

  if (options_.register_chunk_bytes != 0) {
    register_chunk_bytes_ = static_cast<std::size_t>(options_.register_chunk_bytes);
  }
  if (options_.kernel_max_blocks != 0) {
    kernel_max_ctas_ = static_cast<int>(std::min<unsigned>(options_.kernel_max_blocks, 65535u));
  }
  if (options_.kernel_threads_per_block != 0 &&
      options_.kernel_threads_per_block != static_cast<unsigned>(kernels::kBatchCopyThreads)) {
    log().warn("cuda: kernel_threads_per_block={} ignored: the batch copy kernel is built for {}",
               options_.kernel_threads_per_block, kernels::kBatchCopyThreads);
  }

  batch_ = BatchMemcpy::resolve();
  batch_enabled_.store(batch_.available(), std::memory_order_relaxed);

  if (const int rc = kernels::cuda::check_batch_copy(); rc == 0) {
    kernel_ok_ = true;
    kernel_detail_ = fmt::format("batch copy kernel, up to {} CTAs x {} threads", kernel_max_ctas_,
                                 kernels::kBatchCopyThreads);
  } else {
    (void)cudaGetLastError();
    kernel_detail_ = "unavailable: " + describe(static_cast<cudaError_t>(rc));
  }

  check_cuda(cudaStreamCreateWithFlags(&sync_stream_, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");

  log().info("cuda: device {} {} ({}), driver {}, runtime {}; dma: {}; kernel: {}", device_,
             device_name_, arch_, util::cuda_version_string(driver_version_),
             util::cuda_version_string(runtime_version_), batch_.detail(), kernel_detail_);
}

CudaRuntime::~CudaRuntime() {
  RelaxedCaptureMode relaxed;  // cudaFreeHost and cudaHostUnregister below
  // Teardown keeps going: every step is attempted and failures are only logged. Errors such as
  // cudaErrorCudartUnloading at process exit are expected and harmless.
  if (std::any_of(slots_.begin(), slots_.end(), [](const DescSlot& s) { return s.retired; })) {
    // No event tells when the kernel reading a retired slot ended.
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && cudaSetDevice(device_) == cudaSuccess) {
      (void)cudaDeviceSynchronize();
      (void)cudaSetDevice(current);
    }
  }
  for (DescSlot& slot : slots_) {
    if (slot.recorded) {
      (void)cudaEventSynchronize(slot.done);
    }
    (void)cudaEventDestroy(slot.done);
    (void)cudaFreeHost(slot.host);
  }
  slots_.clear();
  for (auto& [handle, reg] : registrations_) {
    try {
      log().warn("cuda: runtime destroyed with {} still registered; unregistering it",
                 range_string(reg->base, reg->bytes));
    } catch (...) {
      // logging must not stop the teardown
    }
    (void)unregister_pieces(*reg);
  }
  registrations_.clear();
  if (sync_stream_ != nullptr) {
    (void)cudaStreamDestroy(sync_stream_);
  }
  (void)cudaGetLastError();
}

BackendInfo CudaRuntime::info() const {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  return BackendInfo{
      "cuda", true, count,
      fmt::format("device {} {} ({}), driver {}, runtime {}; dma: {}; kernel: {}", device_,
                  device_name_, arch_, util::cuda_version_string(driver_version_),
                  util::cuda_version_string(runtime_version_),
                  batch_enabled_.load(std::memory_order_relaxed) ? batch_.detail()
                                                                 : std::string("per-copy loop"),
                  kernel_detail_)};
}

// ---- host registration ----

void CudaRuntime::register_pieces(Registration& reg,
                                  const std::vector<std::pair<std::size_t, std::size_t>>& plan) {
  auto* base = static_cast<std::byte*>(reg.base);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    void* p = base + plan[i].first;
    const cudaError_t err =
        cudaHostRegister(p, plan[i].second, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // the sticky-looking error must not surface from a later call
      (void)unregister_pieces(reg);
      throw_cuda(err, "cudaHostRegister",
                 fmt::format("{} (piece {} of {} of {}); the engine continues on the slower "
                             "unregistered path",
                             range_string(p, plan[i].second), i + 1, plan.size(),
                             range_string(reg.base, reg.bytes)));
    }
    reg.pieces.push_back(Piece{p, plan[i].second});
  }
}

bool CudaRuntime::unregister_pieces(Registration& reg) noexcept {
  bool ok = true;
  RelaxedCaptureMode relaxed;
  for (auto it = reg.pieces.rbegin(); it != reg.pieces.rend(); ++it) {
    if (const cudaError_t err = cudaHostUnregister(it->ptr); err != cudaSuccess) {
      (void)cudaGetLastError();
      ok = false;
      try {
        log().error("cuda: cudaHostUnregister {} failed: {}", range_string(it->ptr, it->bytes),
                    describe(err));
      } catch (...) {
        // logging must not stop the teardown
      }
    }
  }
  reg.pieces.clear();
  return ok;
}

DeviceRuntime::RegistrationRecord CudaRuntime::do_register_host(void* ptr, std::size_t bytes,
                                                               std::size_t align) {
  DeviceGuard guard(device_);
  RelaxedCaptureMode relaxed;  // Note [Registration during capture]

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t err = cudaStreamIsCapturing(cudaStreamLegacy, &capture);
      err != cudaSuccess) {
    (void)cudaGetLastError();
    if (err == cudaErrorStreamCaptureImplicit) {
      throw Error(ErrorCode::kState,
                  "cuda: cannot register host memory " + range_string(ptr, bytes) +
                      " while a blocking stream on device " + std::to_string(device_) +
                      " is capturing a CUDA graph; register before or after the capture",
                  0, "cudaStreamIsCapturing");
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

  // One device address for the whole range: with UVA it is the host address itself
  // (cudaDevAttrCanUseHostPointerForRegisteredMem); anything else must still be one contiguous
  // span, because HostRegistration::device_pointer is base + offset.
  void* device_base = nullptr;
  bool contiguous = true;
  for (const Piece& piece : reg->pieces) {
    void* dev = nullptr;
    if (const cudaError_t err = cudaHostGetDevicePointer(&dev, piece.ptr, 0); err != cudaSuccess) {
      (void)cudaGetLastError();
      (void)unregister_pieces(*reg);
      throw_cuda(err, "cudaHostGetDevicePointer", range_string(piece.ptr, piece.bytes));
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
    log().warn("cuda: device addresses of the {} registered pieces of {} are not contiguous; "
               "registering it as one piece",
               reg->pieces.size(), range_string(ptr, bytes));
    (void)unregister_pieces(*reg);
    register_pieces(*reg, {{0, bytes}});
    if (const cudaError_t err = cudaHostGetDevicePointer(&device_base, ptr, 0); err != cudaSuccess) {
      (void)cudaGetLastError();
      (void)unregister_pieces(*reg);
      throw_cuda(err, "cudaHostGetDevicePointer", range_string(ptr, bytes));
    }
  }

  const double secs = util::seconds_since(start);
  log().info("cuda: registered {} in {} piece(s) in {:.3f} s ({:.2f} GB/s)", range_string(ptr, bytes),
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

bool CudaRuntime::do_unregister_host(std::uintptr_t handle) noexcept {
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
      log().error("cuda: unregister of an unknown registration handle {:#x}", handle);
    } catch (...) {
    }
    return false;
  }
  return unregister_pieces(*reg);
}

// ---- streams and events ----

std::uintptr_t CudaRuntime::do_create_stream() {
  DeviceGuard guard(device_);
  cudaStream_t stream = nullptr;
  // Non-blocking: no implicit synchronization with the legacy default stream the engine may use.
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return reinterpret_cast<std::uintptr_t>(stream);
}

void CudaRuntime::do_destroy_stream(std::uintptr_t stream) noexcept {
  // Pending work finishes first, so descriptors and buffers it reads stay valid until then.
  if (cudaStreamSynchronize(to_stream(stream)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  if (cudaStreamDestroy(to_stream(stream)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

std::uintptr_t CudaRuntime::do_create_event(bool timing) {
  DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming),
             "cudaEventCreateWithFlags");
  return reinterpret_cast<std::uintptr_t>(event);
}

void CudaRuntime::do_destroy_event(std::uintptr_t event) noexcept {
  if (cudaEventDestroy(to_event(event)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

void CudaRuntime::do_record_event(std::uintptr_t event, std::uintptr_t stream) {
  DeviceGuard guard(device_);  // stream 0 means the current device's legacy stream
  check_cuda(cudaEventRecord(to_event(event), to_stream(stream)), "cudaEventRecord");
}

void CudaRuntime::do_wait_event(std::uintptr_t stream, std::uintptr_t event) {
  DeviceGuard guard(device_);
  check_cuda(cudaStreamWaitEvent(to_stream(stream), to_event(event), 0), "cudaStreamWaitEvent");
}

bool CudaRuntime::do_query_event(std::uintptr_t event) {
  const cudaError_t err = cudaEventQuery(to_event(event));
  if (err == cudaSuccess) {
    return true;
  }
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  throw_cuda(err, "cudaEventQuery", "(a copy before the event failed)");
}

void CudaRuntime::do_synchronize_event(std::uintptr_t event) {
  check_cuda(cudaEventSynchronize(to_event(event)), "cudaEventSynchronize");
}

void CudaRuntime::do_synchronize_stream(std::uintptr_t stream) {
  DeviceGuard guard(device_);
  check_cuda(cudaStreamSynchronize(to_stream(stream)), "cudaStreamSynchronize");
}

double CudaRuntime::do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) {
  float ms = 0.0F;
  check_cuda(cudaEventElapsedTime(&ms, to_event(start), to_event(end)), "cudaEventElapsedTime");
  return static_cast<double>(ms) / 1e3;
}

void CudaRuntime::do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) {
  DeviceGuard guard(device_);
  check_cuda(cudaLaunchHostFunc(to_stream(stream), fn, arg), "cudaLaunchHostFunc");
}

// ---- device memory (tests, benchmarks, calibration) ----

void* CudaRuntime::do_allocate_device(std::size_t bytes) {
  DeviceGuard guard(device_);
  RelaxedCaptureMode relaxed;
  void* ptr = nullptr;
  check_cuda(cudaMalloc(&ptr, bytes), "cudaMalloc", std::to_string(bytes) + " bytes");
  return ptr;
}

void CudaRuntime::do_free_device(void* ptr) noexcept {
  RelaxedCaptureMode relaxed;
  if (const cudaError_t err = cudaFree(ptr); err != cudaSuccess) {
    (void)cudaGetLastError();
    try {
      log().error("cuda: cudaFree({}) failed: {}", ptr, describe(err));
    } catch (...) {
    }
  }
}

void CudaRuntime::do_memcpy_sync(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) {
    return;
  }
  DeviceGuard guard(device_);
  // cudaMemcpyDefault: with UVA the runtime tells host from device memory itself.
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, sync_stream_), "cudaMemcpyAsync",
             std::to_string(bytes) + " bytes");
  check_cuda(cudaStreamSynchronize(sync_stream_), "cudaStreamSynchronize");
}

void CudaRuntime::do_memset_sync(void* dst, int value, std::size_t bytes) {
  if (bytes == 0) {
    return;
  }
  DeviceGuard guard(device_);
  cudaPointerAttributes attr{};
  const bool known = cudaPointerGetAttributes(&attr, dst) == cudaSuccess;
  if (!known) {
    (void)cudaGetLastError();
  }
  if (known && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)) {
    check_cuda(cudaMemsetAsync(dst, value, bytes, sync_stream_), "cudaMemsetAsync",
               std::to_string(bytes) + " bytes");
    check_cuda(cudaStreamSynchronize(sync_stream_), "cudaStreamSynchronize");
  } else {
    std::memset(dst, value, bytes);  // host memory, registered or not
  }
}

// ---- copies ----

void CudaRuntime::do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
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

void CudaRuntime::enqueue_dma(cudaStream_t stream, std::span<const CopyDescriptor> batch,
                              CopyKind kind) {
  // The driver refuses the legacy default stream for batched copies; one copy gains nothing.
  const bool legacy = stream == nullptr || stream == cudaStreamLegacy;
  if (legacy || batch.size() < 2 || !batch_enabled_.load(std::memory_order_relaxed)) {
    enqueue_dma_loop(stream, batch, kind);
    return;
  }
  // Per-thread scratch: no allocation per batch once warm, and the store and load threads of the
  // engine never share it.
  thread_local std::vector<std::uint64_t> dsts;
  thread_local std::vector<std::uint64_t> srcs;
  thread_local std::vector<std::size_t> sizes;
  dsts.clear();
  srcs.clear();
  sizes.clear();
  for (const CopyDescriptor& d : batch) {
    if (d.bytes == 0) {
      continue;  // the driver rejects empty copies
    }
    dsts.push_back(reinterpret_cast<std::uintptr_t>(d.dst));
    srcs.push_back(reinterpret_cast<std::uintptr_t>(d.src));
    sizes.push_back(static_cast<std::size_t>(d.bytes));
  }
  if (sizes.empty()) {
    return;
  }
  const auto order = kind == CopyKind::kHostToDevice ? BatchMemcpy::SourceOrder::kAny
                                                     : BatchMemcpy::SourceOrder::kStream;
  std::size_t fail_index = SIZE_MAX;
  const int result =
      batch_.enqueue(dsts.data(), srcs.data(), sizes.data(), sizes.size(), order, stream, &fail_index);
  if (result == 0) {
    return;
  }
  // The loop below redoes the refused batch copy by copy (and reports a bad descriptor with the
  // runtime's own error). Copies the batch may already have enqueued are written again with the
  // same bytes, which is harmless: copies of one batch never overlap. The batched call is not
  // tried again in this process.
  if (batch_enabled_.exchange(false)) {
    log().warn("cuda: cuMemcpyBatchAsync refused a batch of {} {} copies ({}{}); using the per-copy "
               "loop from now on",
               sizes.size(), to_string(kind), batch_.error_string(result),
               fail_index != SIZE_MAX ? fmt::format(", at copy {}", fail_index) : std::string());
  }
  enqueue_dma_loop(stream, batch, kind);
}

void CudaRuntime::enqueue_dma_loop(cudaStream_t stream, std::span<const CopyDescriptor> batch,
                                   CopyKind kind) {
  const cudaMemcpyKind memcpy_kind = to_memcpy_kind(kind);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const CopyDescriptor& d = batch[i];
    if (d.bytes == 0) {
      continue;
    }
    if (const cudaError_t err = cudaMemcpyAsync(d.dst, d.src, static_cast<std::size_t>(d.bytes),
                                                memcpy_kind, stream);
        err != cudaSuccess) {
      throw_cuda(err, "cudaMemcpyAsync",
                 fmt::format("copy {} of {} ({}, {} bytes, {} -> {})", i, batch.size(),
                             to_string(kind), d.bytes, d.src, static_cast<void*>(d.dst)));
    }
  }
}

CudaRuntime::DescSlot& CudaRuntime::acquire_slot() {
  const std::size_t n = slots_.size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = (next_slot_ + i) % n;
    DescSlot& slot = slots_[idx];
    if (slot.retired) {
      continue;
    }
    bool free = !slot.recorded;
    if (!free) {
      const cudaError_t err = cudaEventQuery(slot.done);
      if (err == cudaSuccess) {
        free = true;
      } else if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
      } else {
        throw_cuda(err, "cudaEventQuery", "(an earlier kernel copy failed)");
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
    check_cuda(cudaHostAlloc(&host, kSlotDescs * sizeof(kernels::CopyDesc),
                             cudaHostAllocMapped | cudaHostAllocPortable),
               "cudaHostAlloc", "kernel descriptor buffer");
    slot.host = static_cast<kernels::CopyDesc*>(host);
    void* device = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&device, host, 0);
    if (err == cudaSuccess) {
      err = cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaFreeHost(host);
      throw_cuda(err, "cudaHostGetDevicePointer/cudaEventCreateWithFlags", "kernel descriptor buffer");
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
    check_cuda(cudaEventSynchronize(slot.done), "cudaEventSynchronize",
               "(waiting for a kernel descriptor buffer)");
    next_slot_ = idx + 1;
    slot.recorded = false;
    return slot;
  }
  throw Error(ErrorCode::kInternal, "cuda: every kernel descriptor buffer is retired");
}

void CudaRuntime::enqueue_kernel(cudaStream_t stream, std::span<const CopyDescriptor> batch) {
  if (!kernel_ok_) {
    throw Error(ErrorCode::kNotAvailable, "cuda: the kernel copy path is " + kernel_detail_);
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
    if (const int rc = kernels::cuda::launch_batch_copy(slot.device, count, ctas, stream); rc != 0) {
      throw_cuda(static_cast<cudaError_t>(rc), "launch_batch_copy",
                 fmt::format("({} copies, {} bytes, {} CTAs)", count, total, ctas));
    }
    if (const cudaError_t err = cudaEventRecord(slot.done, stream); err != cudaSuccess) {
      slot.retired = true;  // the kernel may still read it and nothing tells when it is done
      throw_cuda(err, "cudaEventRecord", "(after the batch copy kernel)");
    }
    slot.recorded = true;
  }
}

}  // namespace kvoffload::cuda
