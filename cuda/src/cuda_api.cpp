// The CUDA vendor table (core/src/runtime/gpu/vendor_api.hpp): each entry is the CUDA runtime call
// it names, nothing more. Everything else — registration pieces, rings, fallbacks — is the one GPU
// runtime in core. Built as the module libkvoffload_cuda.so, which core opens on first use.
// hip/src/hip_api.cpp is its twin; the differences are CUDA's and are said where they are.
//
// Note [CUDA versions]
// The module builds with any CUDA toolkit from 12.0 to 13.x. What newer toolkits added sits
// behind the toolkit's version (KVOFFLOAD_CUDA_API, CUDART_VERSION unless a test build forces an
// older one): the batched copy (CUmemcpyAttributes, cuMemcpyBatchAsync) needs 12.8, else the
// per-copy loop runs; cudaGetDriverEntryPointByVersion needs 12.5, else
// cudaGetDriverEntryPoint (12.0's signature, with the query result) resolves the driver calls.
// A module needs a driver of its toolkit's major version or newer (Note [Driver floor] in
// core/src/runtime/gpu/backend_modules.cpp): R525 for 12.x, R580 for 13.x.
//
// Note [Resolving cuMemcpyBatchAsync]
// - The symbol exists from CUDA 12.8. CUDA 12.8/12.9 take 9 arguments (a size_t* failIdx before
//   the stream); CUDA 13 takes 8. Calling one through the other's type passes the stream in the
//   wrong slot, so the ABI is chosen by the version we ask the driver for: the driver's own
//   version, capped to the two signatures we know (12080 or 13000).
// - It is resolved through cudaGetDriverEntryPointByVersion (cuGetProcAddress), not dlsym: a
//   process can hold several copies of libcudart (torch wheels bring their own), while the driver
//   is one.
// - It is a driver call: it needs a current context on the calling thread, which the runtime
//   guarantees by setting the device on every call (Note [Batched DMA refusals]).
#include <cstdio>
#include <cstring>
#include <string>

#include <cuda.h>
#include <cuda_runtime.h>

#include <kvoffload_kernels/copy_kernels.hpp>

#include "runtime/gpu/vendor_api.hpp"

// The CUDA API level this module is written for: the toolkit's, or an older one forced by the
// compile check of the older branches (cuda/CMakeLists.txt).
#ifndef KVOFFLOAD_CUDA_API
#define KVOFFLOAD_CUDA_API CUDART_VERSION
#endif
#if KVOFFLOAD_CUDA_API < 12000
#error "kvoffload's CUDA backend needs a CUDA toolkit 12.0 or newer"
#endif
#ifndef KVOFFLOAD_CUDA_ARCHS
#define KVOFFLOAD_CUDA_ARCHS ""
#endif

namespace kvoffload::gpu::cuda_api {

namespace {

cudaStream_t st(void* s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t ev(void* e) {
  return static_cast<cudaEvent_t>(e);
}
int rc(cudaError_t e) {
  return static_cast<int>(e);
}

// Defined below, with the driver entry points they use.
const char* error_name(void*, int err);
const char* error_string(void*, int err);
int get_last_error(void*) {
  return rc(cudaGetLastError());
}
int get_device_count(void*, int* n) {
  return rc(cudaGetDeviceCount(n));
}
int get_device(void*, int* d) {
  return rc(cudaGetDevice(d));
}
int set_device(void*, int d) {
  return rc(cudaSetDevice(d));
}
int device_synchronize(void*) {
  return rc(cudaDeviceSynchronize());
}
int device_describe(void*, int d, char* name, std::size_t name_len, char* arch,
                    std::size_t arch_len) {
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, d); e != cudaSuccess) return rc(e);
  (void)std::snprintf(name, name_len, "%s", prop.name);
  (void)std::snprintf(arch, arch_len, "sm_%d%d", prop.major, prop.minor);
  return 0;
}
int driver_version(void*, int* v) {
  return rc(cudaDriverGetVersion(v));
}
int runtime_version(void*, int* v) {
  return rc(cudaRuntimeGetVersion(v));
}
// CUDA_VERSION encoding: major * 1000 + minor * 10.
void version_text(void*, int v, char* out, std::size_t len) {
  (void)std::snprintf(out, len, "%d.%d", v / 1000, (v % 1000) / 10);
}
int exchange_capture_mode(void*, int* mode, int relaxed) {
  auto m = relaxed != 0 ? cudaStreamCaptureModeRelaxed : static_cast<cudaStreamCaptureMode>(*mode);
  const cudaError_t e = cudaThreadExchangeStreamCaptureMode(&m);
  *mode = static_cast<int>(m);
  return rc(e);
}
int stream_capturing(void*, void* s, int* capturing) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(st(s), &status);
  *capturing = status != cudaStreamCaptureStatusNone ? 1 : 0;
  return rc(e);
}

// Non-blocking: no implicit synchronization with the legacy default stream the engine may use.
int stream_create(void*, void** s) {
  return rc(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(s), cudaStreamNonBlocking));
}
int stream_destroy(void*, void* s) {
  return rc(cudaStreamDestroy(st(s)));
}
int stream_synchronize(void*, void* s) {
  return rc(cudaStreamSynchronize(st(s)));
}
int stream_wait_event(void*, void* s, void* e) {
  return rc(cudaStreamWaitEvent(st(s), ev(e), 0));
}
int launch_host_func(void*, void* s, void (*fn)(void*), void* arg) {
  return rc(cudaLaunchHostFunc(st(s), fn, arg));
}
int event_create(void*, void** e, int flags) {
  const unsigned f = ((flags & kEventTiming) != 0 ? cudaEventDefault : cudaEventDisableTiming) |
                     ((flags & kEventBlockingSync) != 0 ? cudaEventBlockingSync : 0u);
  return rc(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(e), f));
}
int event_destroy(void*, void* e) {
  return rc(cudaEventDestroy(ev(e)));
}
int event_record(void*, void* e, void* s) {
  return rc(cudaEventRecord(ev(e), st(s)));
}
int event_query(void*, void* e) {
  return rc(cudaEventQuery(ev(e)));
}
int event_synchronize(void*, void* e) {
  return rc(cudaEventSynchronize(ev(e)));
}
int event_elapsed_ms(void*, float* ms, void* a, void* b) {
  return rc(cudaEventElapsedTime(ms, ev(a), ev(b)));
}

int host_register(void*, void* p, std::size_t n) {
  return rc(cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped));
}
int host_unregister(void*, void* p) {
  return rc(cudaHostUnregister(p));
}
int host_device_pointer(void*, void** d, void* h) {
  return rc(cudaHostGetDevicePointer(d, h, 0));
}
int host_alloc_mapped(void*, void** p, std::size_t n) {
  return rc(cudaHostAlloc(p, n, cudaHostAllocMapped | cudaHostAllocPortable));
}
int host_free(void*, void* p) {
  return rc(cudaFreeHost(p));
}
int device_malloc(void*, void** p, std::size_t n) {
  return rc(cudaMalloc(p, n));
}
int device_free(void*, void* p) {
  return rc(cudaFree(p));
}
int device_malloc_async(void*, void** p, std::size_t n, void* s) {
  return rc(cudaMallocAsync(p, n, st(s)));
}
int device_free_async(void*, void* p, void* s) {
  return rc(cudaFreeAsync(p, st(s)));
}
int memory_pools_supported(void*, int d, int* supported) {
  return rc(cudaDeviceGetAttribute(supported, cudaDevAttrMemoryPoolsSupported, d));
}
// Pinned, device-mapped: what cuStreamWaitValue32 may wait on.
int flag_alloc(void*, std::uint32_t** flag) {
  return rc(cudaHostAlloc(reinterpret_cast<void**>(flag), 64,
                          cudaHostAllocMapped | cudaHostAllocPortable));
}
int flag_free(void*, std::uint32_t* flag) {
  return rc(cudaFreeHost(flag));
}
int pointer_is_device(void*, const void* p, int* is_device) {
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  *is_device =
      e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
  return rc(e);
}
int memcpy_async(void*, void* d, const void* s, std::size_t n, int kind, void* stream) {
  return rc(cudaMemcpyAsync(d, s, n, static_cast<cudaMemcpyKind>(kind), st(stream)));
}
int memset_async(void*, void* d, int v, std::size_t n, void* s) {
  return rc(cudaMemsetAsync(d, v, n, st(s)));
}

// Driver calls through the driver entry point (no libcuda link needed).
using WaitValueFn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using CtxGetCurrentFn = CUresult(CUDAAPI*)(CUcontext*);
using CtxSetCurrentFn = CUresult(CUDAAPI*)(CUcontext);
using CtxGetDeviceFn = CUresult(CUDAAPI*)(CUdevice*);
using PrimaryRetainFn = CUresult(CUDAAPI*)(CUcontext*, CUdevice);
using PrimaryReleaseFn = CUresult(CUDAAPI*)(CUdevice);
using GetErrorFn = CUresult(CUDAAPI*)(CUresult, const char**);
WaitValueFn g_wait_value = nullptr;
CtxGetCurrentFn g_ctx_get_current = nullptr;
CtxSetCurrentFn g_ctx_set_current = nullptr;
CtxGetDeviceFn g_ctx_get_device = nullptr;
PrimaryRetainFn g_primary_retain = nullptr;
PrimaryReleaseFn g_primary_release = nullptr;
GetErrorFn g_error_name = nullptr;
GetErrorFn g_error_string = nullptr;

int stream_wait_value32(void*, void* s, std::uint32_t* flag, std::uint32_t value) {
  if (g_wait_value == nullptr) return rc(cudaErrorNotSupported);
  void* dev = nullptr;
  if (const cudaError_t e = cudaHostGetDevicePointer(&dev, flag, 0); e != cudaSuccess) return rc(e);
  const CUresult r =
      g_wait_value(st(s), reinterpret_cast<CUdeviceptr>(dev), value, CU_STREAM_WAIT_VALUE_EQ);
  return driver_result(static_cast<int>(r));  // the driver's own code, not a runtime guess
}

// -1 when no context is current: cudaGetDevice reports 0 for such a thread, and any other
// runtime call would create device 0's context there (Note [Device guard] in gpu_runtime.cpp).
int current_device(void*, int* d) {
  *d = -1;
  if (g_ctx_get_current != nullptr) {
    CUcontext ctx = nullptr;
    if (const CUresult r = g_ctx_get_current(&ctx); r != CUDA_SUCCESS) {
      return driver_result(static_cast<int>(r));
    }
    if (ctx == nullptr) return 0;
  }
  return rc(cudaGetDevice(d));
}

// The current context when it is not its device's primary one (Note [Device guard] in
// gpu_runtime.cpp). The primary context is only looked up (retained and released at once): a
// thread with a context of that device current means the device's primary context exists, as
// the runtime bound it, so the retain creates nothing.
int foreign_context(void*, void** context) {
  *context = nullptr;
  if (g_ctx_get_current == nullptr || g_ctx_get_device == nullptr || g_primary_retain == nullptr ||
      g_primary_release == nullptr) {
    return 0;  // a driver without these entries: every context reads as primary, as before
  }
  CUcontext current = nullptr;
  if (const CUresult r = g_ctx_get_current(&current); r != CUDA_SUCCESS) {
    return driver_result(static_cast<int>(r));
  }
  if (current == nullptr) return 0;
  CUdevice device = 0;
  if (const CUresult r = g_ctx_get_device(&device); r != CUDA_SUCCESS) {
    return driver_result(static_cast<int>(r));
  }
  CUcontext primary = nullptr;
  if (const CUresult r = g_primary_retain(&primary, device); r != CUDA_SUCCESS) {
    return driver_result(static_cast<int>(r));
  }
  (void)g_primary_release(device);
  if (current != primary) *context = current;
  return 0;
}
int set_context(void*, void* context) {
  if (g_ctx_set_current == nullptr) return rc(cudaErrorNotSupported);
  return driver_result(static_cast<int>(g_ctx_set_current(static_cast<CUcontext>(context))));
}

// ---- batched DMA: Note [Resolving cuMemcpyBatchAsync] ----
#if KVOFFLOAD_CUDA_API >= 12080
using BatchFn12080 = CUresult(CUDAAPI*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t,
                                        CUmemcpyAttributes*, std::size_t*, std::size_t,
                                        std::size_t*, CUstream);
using BatchFn13000 = CUresult(CUDAAPI*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t,
                                        CUmemcpyAttributes*, std::size_t*, std::size_t, CUstream);
void* g_batch = nullptr;
bool g_batch_13000 = false;
#endif
std::string g_batch_detail;

const char* error_name(void*, int err) {
  if (is_driver_result(err)) {
    const char* name = nullptr;
    if (g_error_name != nullptr) (void)g_error_name(static_cast<CUresult>(driver_code(err)), &name);
    return name != nullptr ? name : "CUresult";
  }
  return cudaGetErrorName(static_cast<cudaError_t>(err));
}
const char* error_string(void*, int err) {
  if (is_driver_result(err)) {
    const char* text = nullptr;
    if (g_error_string != nullptr)
      (void)g_error_string(static_cast<CUresult>(driver_code(err)), &text);
    return text != nullptr ? text : "a driver call failed";
  }
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}

// A driver entry point of the ABI `version` (CUDA_VERSION encoding), or null.
void* entry_point(const char* symbol, [[maybe_unused]] unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if KVOFFLOAD_CUDA_API >= 12050
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableLegacyStream, &status);
#else
  // 12.0 to 12.4: the ABI is the runtime's own version, which is the one asked for everywhere
  // below except cuMemcpyBatchAsync (12.8+, so never resolved here).
  const cudaError_t e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableLegacyStream, &status);
#endif
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

void resolve_driver_entries() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) {
    (void)cudaGetLastError();
    g_batch_detail = "per-copy loop: cudaDriverGetVersion failed";
    return;
  }
  g_wait_value = reinterpret_cast<WaitValueFn>(entry_point("cuStreamWaitValue32", 12000));
  g_ctx_get_current = reinterpret_cast<CtxGetCurrentFn>(entry_point("cuCtxGetCurrent", 12000));
  g_ctx_set_current = reinterpret_cast<CtxSetCurrentFn>(entry_point("cuCtxSetCurrent", 12000));
  g_ctx_get_device = reinterpret_cast<CtxGetDeviceFn>(entry_point("cuCtxGetDevice", 12000));
  g_primary_retain =
      reinterpret_cast<PrimaryRetainFn>(entry_point("cuDevicePrimaryCtxRetain", 12000));
  g_primary_release =
      reinterpret_cast<PrimaryReleaseFn>(entry_point("cuDevicePrimaryCtxRelease", 12000));
  g_error_name = reinterpret_cast<GetErrorFn>(entry_point("cuGetErrorName", 12000));
  g_error_string = reinterpret_cast<GetErrorFn>(entry_point("cuGetErrorString", 12000));
#if KVOFFLOAD_CUDA_API >= 12080
  const unsigned version = driver >= 13000 ? 13000u : 12080u;
  if (driver < 12080) {
    g_batch_detail = "per-copy loop: driver " + std::to_string(driver) +
                     " has no cuMemcpyBatchAsync (needs 12.8)";
    return;
  }
  g_batch = entry_point("cuMemcpyBatchAsync", version);
  g_batch_13000 = version >= 13000;
  g_batch_detail = g_batch == nullptr
                       ? "per-copy loop: the driver did not resolve cuMemcpyBatchAsync"
                   : g_batch_13000 ? "cuMemcpyBatchAsync (CUDA 13 signature, 8 arguments)"
                                   : "cuMemcpyBatchAsync (CUDA 12.8 signature, 9 arguments)";
#else
  g_batch_detail = "per-copy loop: built with CUDA " + std::to_string(KVOFFLOAD_CUDA_API / 1000) +
                   "." + std::to_string(KVOFFLOAD_CUDA_API % 1000 / 10) +
                   ", whose headers have no cuMemcpyBatchAsync (12.8+)";
#endif
}

#if KVOFFLOAD_CUDA_API >= 12080
int memcpy_batch_async(void*, void** dsts, const void** srcs, std::size_t* sizes, std::size_t count,
                       int source_in_stream_order, void* stream, std::size_t* fail_index) {
  *fail_index = SIZE_MAX;
  CUmemcpyAttributes attr = {};  // location hints unused: neither side is managed memory
  attr.srcAccessOrder = source_in_stream_order != 0 ? CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
                                                    : CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
  attr.flags = CU_MEMCPY_FLAG_DEFAULT;
  std::size_t attr_idx = 0;  // the one attribute applies to every copy
  static_assert(sizeof(CUdeviceptr) == sizeof(void*));
  auto* d = reinterpret_cast<CUdeviceptr*>(dsts);
  auto* s = reinterpret_cast<CUdeviceptr*>(const_cast<void**>(srcs));
  const CUresult r = g_batch_13000
                         ? reinterpret_cast<BatchFn13000>(g_batch)(d, s, sizes, count, &attr,
                                                                   &attr_idx, 1, st(stream))
                         : reinterpret_cast<BatchFn12080>(g_batch)(
                               d, s, sizes, count, &attr, &attr_idx, 1, fail_index, st(stream));
  return static_cast<int>(r);
}
#endif
const char* batch_error_text(void*, int code) {
  const char* name = nullptr;
  if (g_error_name != nullptr) (void)g_error_name(static_cast<CUresult>(code), &name);
  return name != nullptr ? name : "CUresult";
}
int batch_error_is_permanent(void*, int code) {
  return code == CUDA_ERROR_NOT_SUPPORTED || code == CUDA_ERROR_NOT_PERMITTED ? 1 : 0;
}

int kernel_check(void*) {
  return kernels::cuda::check_batch_copy();
}
int kernel_launch(void*, const VendorCopyDesc* descs, std::size_t count, int ctas, void* stream) {
  return kernels::cuda::launch_batch_copy(reinterpret_cast<const kernels::CopyDesc*>(descs), count,
                                          ctas, stream);
}

VendorApi make_table() {
  VendorApi a{};
  a.version = kVendorApiVersion;
  a.name = "cuda";
  a.caps = kCapUnifiedAddressing;
  a.err_not_ready = cudaErrorNotReady;
  a.err_capture_implicit = cudaErrorStreamCaptureImplicit;
  a.legacy_stream = cudaStreamLegacy;
  // Note [Kernel architectures] in gpu_runtime.cpp: PTX of the newest architecture is embedded,
  // so kernel_check decides for a newer GPU.
  a.kernel_archs = KVOFFLOAD_CUDA_ARCHS;
  a.kernel_archs_exact = 0;
  a.min_driver_version = KVOFFLOAD_CUDA_API / 1000 * 1000;
  a.min_driver_text =
      KVOFFLOAD_CUDA_API >= 13000 ? "NVIDIA driver R580 or newer" : "NVIDIA driver R525 or newer";
  KVOFFLOAD_VENDOR_TABLE_CALLS(a);
  a.device_malloc_async = device_malloc_async;
  a.device_free_async = device_free_async;
  a.memory_pools_supported = memory_pools_supported;
  resolve_driver_entries();
#if KVOFFLOAD_CUDA_API >= 12080
  a.memcpy_batch_async = g_batch != nullptr ? memcpy_batch_async : nullptr;
#else
  a.memcpy_batch_async = nullptr;
#endif
  a.batch_detail = g_batch_detail.c_str();
  a.kernel_threads = kernels::kBatchCopyThreads;
  return a;
}

}  // namespace

}  // namespace kvoffload::gpu::cuda_api

extern "C" __attribute__((visibility("default"))) const kvoffload::gpu::VendorApi*
kvoffload_vendor_api_v1(char* /*why*/, std::size_t /*why_len*/) {
  // The runtime loaded with this module; a missing driver or device is for probe to report.
  static const kvoffload::gpu::VendorApi table = kvoffload::gpu::cuda_api::make_table();
  return &table;
}
