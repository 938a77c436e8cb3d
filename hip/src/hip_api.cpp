// The HIP vendor table, the twin of cuda/src/cuda_api.cpp: each entry is the HIP call it names.
// Built as the module libkvoffload_hip.so, which core opens on first use. The differences are
// ROCm's, and each is data or a small hook of the table:
// - registered host memory may have a device address other than its host address (no
//   kCapUnifiedAddressing) and may migrate (kCapRegistrationMayMigrate: the runtime's optional
//   mlock, RuntimeOptions::hip_mlock_registered);
// - the descriptor ring is hipHostMalloc'ed coherent, so the GPU sees each new batch of
//   descriptors without a cache flush;
// - hipLaunchHostFunc is declared by ROCm 5.2's headers but not exported by its library;
//   hipStreamAddCallback exists in every ROCm and runs in stream order the same way — and, unlike
//   CUDA's host functions, also after an error (it hands the callback the error): nothing in
//   kvoffload may rely on either behaviour (DeviceRuntime::launch_host_func);
// - hipStreamWaitValue32 is documented for signal memory only (hipExtMallocWithFlags with
//   hipMallocSignalMemory) and only where hipDeviceAttributeCanUseStreamWaitValue says so: the
//   flags of wait_host_flag are allocated that way;
// - HIP has no per-thread "no context" state that costs anything: a thread that never chose a
//   device runs on device 0, whose runtime state exists anyway, so current_device is
//   hipGetDevice;
// - code objects exist per GPU architecture, with no JIT from a portable form: a device whose
//   architecture the build lacks (Debian's ROCm 5.2 hipcc does not know gfx942) is refused by
//   the runtime (kernel_archs, Note [Kernel architectures] in
//   core/src/runtime/gpu/gpu_runtime.cpp);
// - the null stream stands for the legacy default stream.
//
// Note [Resolving hipMemcpyBatchAsync]
// - The symbol exists from ROCm 7.1 with the CUDA 12.8 shape (9 arguments, failIdx before the
//   stream); it takes no attributes, so there is no source order to choose. ROCm 5.2 lacks it.
// - It, and hipFreeAsync, are looked up in the very libamdhip64 this module is linked to, through
//   that library's own handle (dladdr of hipGetDeviceCount, then dlopen RTLD_NOLOAD):
//   dlsym(RTLD_DEFAULT) misses when Python loaded us RTLD_LOCAL.
// - The signature is trusted only on the HIP major that published it (7.x).
//
// Note [ROCm versions]
// The table builds with ROCm 5.2 (Debian's) through 7.x. What changed on the way, and how the
// table meets it:
// - ROCm 6.0 renamed hipPointerAttribute_t::memoryType to `type` and renumbered hipMemoryType
//   (Unregistered 0, Host 1, Device 2, Managed 3; 5.x: Host 0, Device 1, and no Unregistered or
//   Managed): memory_type() reads whichever field the headers have, and the table compares
//   enumerators by name, never by value. ROCm 6 answers plain host memory with hipSuccess and
//   Unregistered where 5.x returned an error: both read "not device".
// - ROCm 6.0 made hipDeviceProp_t and hipGetDeviceProperties macros for their R0600 versions:
//   the table uses the names only.
// - HIP 6.3 deprecated hipHostMalloc/hipHostFree for hipHostAlloc/hipFreeHost, which 5.2 and 6.2
//   deprecate the other way round: host_alloc_mapped and host_free pick the pair by version.
// CI compiles this file against ROCm 6 and 7 declarations written for the purpose
// (tests/gpu/rocm_api, the hip_api_rocm targets), and against the installed ROCm 5.2.
#include <dlfcn.h>

#include <cstdio>
#include <memory>
#include <string>

#include <hip/hip_runtime.h>

#include <kvoffload_kernels/copy_kernels.hpp>

#include "runtime/gpu/vendor_api.hpp"

#ifndef KVOFFLOAD_HIP_ARCHS
#define KVOFFLOAD_HIP_ARCHS ""
#endif

namespace kvoffload::gpu::hip_api {

namespace {

hipStream_t st(void* s) {
  return static_cast<hipStream_t>(s);
}
hipEvent_t ev(void* e) {
  return static_cast<hipEvent_t>(e);
}
int rc(hipError_t e) {
  return static_cast<int>(e);
}

const char* error_name(void*, int err) {
  return hipGetErrorName(static_cast<hipError_t>(err));
}
const char* error_string(void*, int err) {
  return hipGetErrorString(static_cast<hipError_t>(err));
}
int get_last_error(void*) {
  return rc(hipGetLastError());
}
int get_device_count(void*, int* n) {
  return rc(hipGetDeviceCount(n));
}
int get_device(void*, int* d) {
  return rc(hipGetDevice(d));
}
int set_device(void*, int d) {
  return rc(hipSetDevice(d));
}
int current_device(void*, int* d) {
  return rc(hipGetDevice(d));
}
// HIP's context API (hipCtxCreate, hipCtxGetCurrent) is deprecated, and a HIP "context" is the
// device's one runtime state (hipSetDevice selects it): there is no non-primary context that
// runtime calls would operate on instead, so the guard never has one to bind over.
int foreign_context(void*, void** context) {
  *context = nullptr;
  return 0;
}
int set_context(void*, void* /*context*/) {
  return rc(hipErrorNotSupported);
}
int device_synchronize(void*) {
  return rc(hipDeviceSynchronize());
}
int device_describe(void*, int d, char* name, std::size_t name_len, char* arch,
                    std::size_t arch_len) {
  hipDeviceProp_t prop{};
  if (const hipError_t e = hipGetDeviceProperties(&prop, d); e != hipSuccess) return rc(e);
  (void)std::snprintf(name, name_len, "%s", prop.name);
  (void)std::snprintf(arch, arch_len, "%s", prop.gcnArchName);
  return 0;
}
int driver_version(void*, int* v) {
  return rc(hipDriverGetVersion(v));
}
int runtime_version(void*, int* v) {
  return rc(hipRuntimeGetVersion(v));
}
// HIP_VERSION encoding: major * 10000000 + minor * 100000 + patch.
void version_text(void*, int v, char* out, std::size_t len) {
  (void)std::snprintf(out, len, "%d.%d", v / 10000000, (v / 100000) % 100);
}
int exchange_capture_mode(void*, int* mode, int relaxed) {
  auto m = relaxed != 0 ? hipStreamCaptureModeRelaxed : static_cast<hipStreamCaptureMode>(*mode);
  const hipError_t e = hipThreadExchangeStreamCaptureMode(&m);
  *mode = static_cast<int>(m);
  return rc(e);
}
int stream_capturing(void*, void* s, int* capturing) {
  hipStreamCaptureStatus status = hipStreamCaptureStatusNone;
  const hipError_t e = hipStreamIsCapturing(st(s), &status);
  *capturing = status != hipStreamCaptureStatusNone ? 1 : 0;
  return rc(e);
}

int stream_create(void*, void** s) {
  return rc(hipStreamCreateWithFlags(reinterpret_cast<hipStream_t*>(s), hipStreamNonBlocking));
}
int stream_destroy(void*, void* s) {
  return rc(hipStreamDestroy(st(s)));
}
int stream_synchronize(void*, void* s) {
  return rc(hipStreamSynchronize(st(s)));
}
int stream_wait_event(void*, void* s, void* e) {
  return rc(hipStreamWaitEvent(st(s), ev(e), 0));
}
// `flag` is signal memory from flag_alloc (the only memory hipStreamWaitValue32 takes).
int stream_wait_value32(void*, void* s, std::uint32_t* flag, std::uint32_t value) {
  return rc(hipStreamWaitValue32(st(s), flag, value, hipStreamWaitValueEq, 0xFFFFFFFFu));
}
int flag_alloc(void*, std::uint32_t** flag) {
  int device = 0;
  int can_wait = 0;
  if (const hipError_t e = hipGetDevice(&device); e != hipSuccess) return rc(e);
  if (const hipError_t e =
          hipDeviceGetAttribute(&can_wait, hipDeviceAttributeCanUseStreamWaitValue, device);
      e != hipSuccess) {
    return rc(e);
  }
  if (can_wait == 0) return rc(hipErrorNotSupported);
  // Signal memory is 8 bytes; its first word is the flag, written by the host.
  return rc(hipExtMallocWithFlags(reinterpret_cast<void**>(flag), 8, hipMallocSignalMemory));
}
int flag_free(void*, std::uint32_t* flag) {
  return rc(hipFree(flag));
}
int launch_host_func(void*, void* s, void (*fn)(void*), void* arg) {
  struct HostCall {
    void (*fn)(void*);
    void* arg;
  };
  auto call = std::make_unique<HostCall>(HostCall{fn, arg});
  const hipError_t e = hipStreamAddCallback(
      st(s),
      [](hipStream_t, hipError_t, void* data) {
        std::unique_ptr<HostCall> c(static_cast<HostCall*>(data));
        c->fn(c->arg);  // also after an error (CUDA would skip it): see the header comment
      },
      call.get(), 0);
  if (e == hipSuccess) (void)call.release();  // the callback owns it now
  return rc(e);
}
int event_create(void*, void** e, int flags) {
  const unsigned f = ((flags & kEventTiming) != 0 ? hipEventDefault : hipEventDisableTiming) |
                     ((flags & kEventBlockingSync) != 0 ? hipEventBlockingSync : 0u);
  return rc(hipEventCreateWithFlags(reinterpret_cast<hipEvent_t*>(e), f));
}
int event_destroy(void*, void* e) {
  return rc(hipEventDestroy(ev(e)));
}
int event_record(void*, void* e, void* s) {
  return rc(hipEventRecord(ev(e), st(s)));
}
int event_query(void*, void* e) {
  return rc(hipEventQuery(ev(e)));
}
int event_synchronize(void*, void* e) {
  return rc(hipEventSynchronize(ev(e)));
}
int event_elapsed_ms(void*, float* ms, void* a, void* b) {
  return rc(hipEventElapsedTime(ms, ev(a), ev(b)));
}

int host_register(void*, void* p, std::size_t n) {
  return rc(hipHostRegister(p, n, hipHostRegisterPortable | hipHostRegisterMapped));
}
int host_unregister(void*, void* p) {
  return rc(hipHostUnregister(p));
}
int host_device_pointer(void*, void** d, void* h) {
  return rc(hipHostGetDevicePointer(d, h, 0));
}
// The undeprecated pair of this ROCm (Note [ROCm versions]); the flags have the same values.
int host_alloc_mapped(void*, void** p, std::size_t n) {
  constexpr unsigned flags = hipHostMallocMapped | hipHostMallocPortable | hipHostMallocCoherent;
#if HIP_VERSION >= 60300000
  return rc(hipHostAlloc(p, n, flags));
#else
  return rc(hipHostMalloc(p, n, flags));
#endif
}
int host_free(void*, void* p) {
#if HIP_VERSION >= 60300000
  return rc(hipFreeHost(p));
#else
  return rc(hipHostFree(p));
#endif
}
int device_malloc(void*, void** p, std::size_t n) {
  return rc(hipMalloc(p, n));
}
int device_free(void*, void* p) {
  return rc(hipFree(p));
}
hipMemoryType memory_type(const hipPointerAttribute_t& attr) {
#if HIP_VERSION_MAJOR >= 6
  return attr.type;  // Note [ROCm versions]
#else
  return attr.memoryType;
#endif
}
int pointer_is_device(void*, const void* p, int* is_device) {
  hipPointerAttribute_t attr{};
  const hipError_t e = hipPointerGetAttributes(&attr, p);
  *is_device = e == hipSuccess && (memory_type(attr) == hipMemoryTypeDevice || attr.isManaged);
  return rc(e);
}
int memcpy_async(void*, void* d, const void* s, std::size_t n, int kind, void* stream) {
  return rc(hipMemcpyAsync(d, s, n, static_cast<hipMemcpyKind>(kind), st(stream)));
}
int memset_async(void*, void* d, int v, std::size_t n, void* s) {
  return rc(hipMemsetAsync(d, v, n, st(s)));
}

// ---- entry points resolved in our own libamdhip64: Note [Resolving hipMemcpyBatchAsync] ----
using MallocAsyncFn = hipError_t (*)(void**, std::size_t, hipStream_t);
using FreeAsyncFn = hipError_t (*)(void*, hipStream_t);
using BatchFn = hipError_t (*)(void** dsts, void** srcs, std::size_t* sizes, std::size_t count,
                               void* attrs, std::size_t* attrs_idxs, std::size_t num_attrs,
                               std::size_t* fail_idx, hipStream_t stream);
MallocAsyncFn g_malloc_async = nullptr;
FreeAsyncFn g_free_async = nullptr;
BatchFn g_batch = nullptr;
std::string g_batch_detail;

void* runtime_symbol(const char* name) {
  Dl_info info{};
  // hipGetDeviceCount: not overloaded (hipMalloc is a template too), exported by libamdhip64.
  if (::dladdr(reinterpret_cast<void*>(&hipGetDeviceCount), &info) == 0 ||
      info.dli_fname == nullptr)
    return nullptr;
  void* handle = ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* sym = ::dlsym(handle, name);
  ::dlclose(handle);  // NOLOAD took a reference; the library itself stays loaded
  return sym;
}

void resolve_runtime_entries() {
  g_malloc_async = reinterpret_cast<MallocAsyncFn>(runtime_symbol("hipMallocAsync"));
  g_free_async = reinterpret_cast<FreeAsyncFn>(runtime_symbol("hipFreeAsync"));
  int runtime = 0;
  if (hipRuntimeGetVersion(&runtime) != hipSuccess) {
    (void)hipGetLastError();
    g_batch_detail = "per-copy loop: hipRuntimeGetVersion failed";
    return;
  }
  char v[32];
  version_text(nullptr, runtime, v, sizeof v);
  if (runtime < 70100000 || runtime >= 80000000) {
    g_batch_detail =
        std::string("per-copy loop: hipMemcpyBatchAsync is used on HIP 7.1 to 7.x, runtime is ") +
        v;
    return;
  }
  g_batch = reinterpret_cast<BatchFn>(runtime_symbol("hipMemcpyBatchAsync"));
  g_batch_detail =
      g_batch != nullptr
          ? std::string("hipMemcpyBatchAsync (HIP ") + v + ", no attributes)"
          : std::string("per-copy loop: HIP ") + v + " does not export hipMemcpyBatchAsync";
}

int device_malloc_async(void*, void** p, std::size_t n, void* s) {
  return rc(g_malloc_async(p, n, st(s)));
}
int device_free_async(void*, void* p, void* s) {
  return rc(g_free_async(p, st(s)));
}
int memory_pools_supported(void*, int d, int* supported) {
  return rc(hipDeviceGetAttribute(supported, hipDeviceAttributeMemoryPoolsSupported, d));
}
int memcpy_batch_async(void*, void** dsts, const void** srcs, std::size_t* sizes, std::size_t count,
                       int /*source_in_stream_order: HIP takes no attributes*/, void* stream,
                       std::size_t* fail_index) {
  *fail_index = SIZE_MAX;
  return rc(g_batch(dsts, const_cast<void**>(srcs), sizes, count, nullptr, nullptr, 0, fail_index,
                    st(stream)));
}
const char* batch_error_text(void*, int code) {
  return hipGetErrorName(static_cast<hipError_t>(code));
}
int batch_error_is_permanent(void*, int code) {
  return code == hipErrorNotSupported ? 1 : 0;
}

int kernel_check(void*) {
  return kernels::hip::check_batch_copy();
}
int kernel_launch(void*, const VendorCopyDesc* descs, std::size_t count, int ctas, void* stream) {
  return kernels::hip::launch_batch_copy(reinterpret_cast<const kernels::CopyDesc*>(descs), count,
                                         ctas, stream);
}

VendorApi make_table() {
  VendorApi a{};
  a.version = kVendorApiVersion;
  a.name = "hip";
  a.caps = kCapRegistrationMayMigrate;
  a.err_not_ready = hipErrorNotReady;
  a.err_capture_implicit = hipErrorStreamCaptureImplicit;
  a.legacy_stream = nullptr;
  a.kernel_archs = KVOFFLOAD_HIP_ARCHS;
  a.kernel_archs_exact = 1;
  a.min_driver_version = 0;
  a.min_driver_text = "";
  KVOFFLOAD_VENDOR_TABLE_CALLS(a);
  resolve_runtime_entries();
  // Stream-ordered allocation and free come as a pair (Note [Freeing] in gpu_device_memory.cpp).
  const bool async = g_malloc_async != nullptr && g_free_async != nullptr;
  a.device_malloc_async = async ? device_malloc_async : nullptr;
  a.device_free_async = async ? device_free_async : nullptr;
  a.memory_pools_supported = async ? memory_pools_supported : nullptr;
  a.memcpy_batch_async = g_batch != nullptr ? memcpy_batch_async : nullptr;
  a.batch_detail = g_batch_detail.c_str();
  a.kernel_threads = kernels::kBatchCopyThreads;
  return a;
}

}  // namespace

}  // namespace kvoffload::gpu::hip_api

extern "C" __attribute__((visibility("default"))) const kvoffload::gpu::VendorApi*
kvoffload_vendor_api_v1(char* /*why*/, std::size_t /*why_len*/) {
  // The runtime loaded with this module; a missing driver or device is for probe to report.
  static const kvoffload::gpu::VendorApi table = kvoffload::gpu::hip_api::make_table();
  return &table;
}
