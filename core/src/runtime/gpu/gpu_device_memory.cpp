// The GPU runtime's device memory (tests, benchmarks, calibration): allocation, frees in the
// way the memory was allocated, and synchronous copies and memsets.
//
// Note [Freeing]
// Device memory is freed the way it was allocated. Memory that is freed in stream order
// (cudaFreeAsync) comes from cudaMallocAsync (device_malloc_async), never from cudaMalloc; the
// allocations made here remember which they were. A plain free of stream-ordered memory does not
// wait for the device (the CUDA runtime header says so), so such a free first synchronizes.
// Where the device has no memory pools (cudaDevAttrMemoryPoolsSupported 0, some vGPUs) the
// stream-ordered calls answer "not supported": the runtime then allocates plainly (async_alloc_).
#include <mutex>

#include <kvoffload/error.hpp>

#include "runtime/gpu/gpu_runtime_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu {

void* GpuRuntime::do_allocate_device(std::size_t bytes) {
  Guard guard(api_, device_);
  RelaxedCapture relaxed(api_);
  void* ptr = nullptr;
  if (async_alloc_) {
    // Stream-ordered, so that release_async can free it in stream order; synchronized here so
    // that it is usable on every stream, as cudaMalloc memory is.
    check_vendor(api_, api_.device_malloc_async(ctx_, &ptr, bytes, sync_stream_),
                 "device_malloc_async", std::to_string(bytes) + " bytes");
    if (const int err = api_.stream_synchronize(ctx_, sync_stream_); err != 0) {
      (void)api_.device_free(ctx_, ptr);
      throw_vendor(api_, err, "stream_synchronize", "(after device_malloc_async)");
    }
    std::lock_guard lock(alloc_mu_);
    async_allocations_.insert(ptr);
    return ptr;
  }
  check_vendor(api_, api_.device_malloc(ctx_, &ptr, bytes), "device_malloc",
               std::to_string(bytes) + " bytes");
  return ptr;
}

void GpuRuntime::do_free_device(void* ptr) noexcept {
  Guard guard(api_, device_, std::nothrow);
  RelaxedCapture relaxed(api_);
  bool async = false;
  {
    std::lock_guard lock(alloc_mu_);
    async = async_allocations_.erase(ptr) != 0;
  }
  // A plain free of stream-ordered memory does not wait for work that may still use it.
  if (async && api_.device_synchronize(ctx_) != 0) (void)api_.get_last_error(ctx_);
  if (const int err = api_.device_free(ctx_, ptr); err != 0) {
    (void)api_.get_last_error(ctx_);
    log_noexcept(spdlog::level::err, "{}: device_free({}) failed: {}", api_.name, ptr,
                 api_.error_name(ctx_, err));
  }
}

void GpuRuntime::do_free_device_async(void* ptr, std::uintptr_t stream) noexcept {
  bool async = false;
  {
    std::lock_guard lock(alloc_mu_);
    async = async_allocations_.contains(ptr);
  }
  if (!async || api_.device_free_async == nullptr || stream == 0) {
    DeviceRuntime::do_free_device_async(ptr, stream);  // synchronize the stream, then free
    return;
  }
  Guard guard(api_, device_, std::nothrow);
  if (const int err = api_.device_free_async(ctx_, ptr, to_ptr(stream)); err != 0) {
    (void)api_.get_last_error(ctx_);
    log_noexcept(spdlog::level::warn, "{}: device_free_async({}) failed: {}; freeing synchronously",
                 api_.name, ptr, api_.error_name(ctx_, err));
    DeviceRuntime::do_free_device_async(ptr, stream);
    return;
  }
  std::lock_guard lock(alloc_mu_);
  async_allocations_.erase(ptr);
}

void GpuRuntime::do_memcpy_sync(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  Guard guard(api_, device_);
  ThreadLocalCapture capture_mode(api_);  // it synchronizes a stream
  // Default kind: with unified addressing the runtime tells host from device memory itself.
  check_vendor(api_, api_.memcpy_async(ctx_, dst, src, bytes, kMemcpyDefault, sync_stream_),
               "memcpy_async", std::to_string(bytes) + " bytes");
  check_vendor(api_, api_.stream_synchronize(ctx_, sync_stream_), "stream_synchronize");
}

void GpuRuntime::do_memset_sync(void* dst, int value, std::size_t bytes) {
  if (bytes == 0) return;
  Guard guard(api_, device_);
  ThreadLocalCapture capture_mode(api_);  // it synchronizes a stream
  int is_device = 0;
  if (api_.pointer_is_device(ctx_, dst, &is_device) != 0) {
    (void)api_.get_last_error(ctx_);
    is_device = 0;
  }
  if (is_device == 0) {
    std::memset(dst, value, bytes);  // host memory, registered or not
    return;
  }
  check_vendor(api_, api_.memset_async(ctx_, dst, value, bytes, sync_stream_), "memset_async",
               std::to_string(bytes) + " bytes");
  check_vendor(api_, api_.stream_synchronize(ctx_, sync_stream_), "stream_synchronize");
}

}  // namespace kvoffload::gpu
