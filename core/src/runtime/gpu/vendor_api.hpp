#pragma once
// The table of vendor calls that the one GPU runtime (gpu_runtime.cpp) is written against.
//
// Note [One GPU runtime over a vendor table]
// Everything a GPU backend does that is not a vendor call — registration planning, the
// descriptor rings, building batches, fallbacks, error handling, device guards — is written once,
// in core, against this table. cuda/ and hip/ only fill the table with their runtime's calls (and
// are built as modules that core dlopen()s on first use, so one build runs on a machine with
// either runtime or neither); sim/ fills it with a CPU simulation that has a GPU's semantics,
// so CI runs the same runtime code without a GPU. Differences between the vendors are data or
// small hooks here (`caps`, `legacy_stream`, a null batch entry point), never a second copy of
// the logic.
//
// Conventions: every call returns the vendor's error code as an int (0 = success in CUDA, HIP and
// sim alike) and leaves the thread's last-error slot as the vendor does; handles are opaque
// pointers; `ctx` is the table's own context (sim: one simulated device; cuda/hip: unused). The
// table is plain data with C linkage types so that a module built by another compiler can fill it.
// No CUDA or HIP type appears here. A call made by a driver-level entry point (a CUresult, not a
// cudaError_t) returns driver_result(code), so the two numberings are never confused and the
// real driver code reaches the message (error_name/error_string of the table decode it).
#include <cstddef>
#include <cstdint>

namespace kvoffload::gpu {

// Bumped on any change to the layout below; a module reporting another version is refused.
inline constexpr std::uint32_t kVendorApiVersion = 4;

// Driver-level results (CUresult) carried in the table's int codes: see the conventions above.
inline constexpr int kDriverResultBase = 1 << 20;
constexpr int driver_result(int code) noexcept {
  return code == 0 ? 0 : kDriverResultBase + code;
}
constexpr bool is_driver_result(int err) noexcept {
  return err >= kDriverResultBase;
}
constexpr int driver_code(int err) noexcept {
  return is_driver_result(err) ? err - kDriverResultBase : err;
}

// Stream-capture modes with CUDA's numbering (cudaStreamCaptureMode / hipStreamCaptureMode).
enum CaptureMode : int {
  kCaptureModeGlobal = 0,
  kCaptureModeThreadLocal = 1,
  kCaptureModeRelaxed = 2,
};

// Memcpy directions, with the vendors' numbering (cudaMemcpyKind / hipMemcpyKind).
enum MemcpyKind : int {
  kMemcpyHostToHost = 0,
  kMemcpyHostToDevice = 1,
  kMemcpyDeviceToHost = 2,
  kMemcpyDeviceToDevice = 3,
  kMemcpyDefault = 4,
};

// Capability bits.
enum VendorCaps : std::uint32_t {
  // Device pointer of registered host memory equals the host pointer (CUDA's UVA). Without it
  // (ROCm may map registered memory elsewhere) pieces of one registration need not be
  // contiguous on the device side.
  kCapUnifiedAddressing = 1u << 0,
  // Registered host memory may still migrate (ROCm): RuntimeOptions::hip_mlock_registered applies.
  kCapRegistrationMayMigrate = 1u << 1,
};

// event_create's flags. Without kEventTiming the event cannot time (cudaEventDisableTiming,
// cheaper); with kEventBlockingSync a host thread synchronizing on it sleeps until it completes
// instead of spinning a core (cudaEventBlockingSync).
enum EventFlags : int {
  kEventTiming = 1 << 0,
  kEventBlockingSync = 1 << 1,
};

// A kernel copy descriptor, identical to kernels::CopyDesc and CopyDescriptor.
struct VendorCopyDesc {
  const void* src;
  void* dst;
  std::uint64_t bytes;
};

struct VendorApi {
  std::uint32_t version;  // kVendorApiVersion
  const char* name;       // "cuda" | "hip" | "sim"
  void* ctx;
  std::uint32_t caps;  // VendorCaps
  // Error codes the runtime tells apart.
  int err_not_ready;         // event/stream query: work still pending
  int err_capture_implicit;  // a blocking stream is capturing (legacy-stream capture)
  // The stream handle that means "legacy default stream" in this API (batched copies refuse it).
  void* legacy_stream;
  // The architectures the module's kernels were built for ("gfx90a", "80;90"), and whether a
  // device must match one of them exactly (HIP: code objects are per architecture; CUDA: PTX can
  // be compiled for a newer GPU, so kernel_check decides). Note [Kernel architectures].
  const char* kernel_archs;
  int kernel_archs_exact;
  // The oldest driver this module runs on (driver_version encoding; 0 = no floor) and how to say
  // it ("R580 or newer (CUDA 13.x)"). Note [Driver floor] in backend_modules.cpp.
  int min_driver_version;
  const char* min_driver_text;

  // ---- errors and devices ----
  const char* (*error_name)(void* ctx, int err);
  const char* (*error_string)(void* ctx, int err);
  int (*get_last_error)(void* ctx);  // returns and clears the thread's last error
  int (*get_device_count)(void* ctx, int* count);
  int (*get_device)(void* ctx, int* device);
  // The device whose context is current on this thread, or -1 when the thread has none (it never
  // chose a device, and its next runtime call would create device 0's context). CUDA: the
  // driver's cuCtxGetCurrent; get_device cannot tell, it reports 0 for such a thread.
  int (*current_device)(void* ctx, int* device);
  // The context current on this thread when it is not its device's primary context (another
  // library made it with the driver's cuCtxCreate), else null. Runtime calls on such a thread
  // operate on that context, not on the primary one the runtime's streams, events and memory
  // belong to (Note [Device guard] in gpu_runtime.cpp). HIP: always null.
  int (*foreign_context)(void* ctx, void** context);
  // Makes a context from foreign_context current again on this thread (cuCtxSetCurrent).
  int (*set_context)(void* ctx, void* context);
  // Makes `device` current on this thread and binds its context (cudaSetDevice).
  int (*set_device)(void* ctx, int device);
  // Waits for all work of the current device (cudaDeviceSynchronize).
  int (*device_synchronize)(void* ctx);
  // Device name and architecture ("sm_90", "gfx90a:sramecc+:xnack-").
  int (*device_describe)(void* ctx, int device, char* name, std::size_t name_len, char* arch,
                         std::size_t arch_len);
  int (*driver_version)(void* ctx, int* version);
  int (*runtime_version)(void* ctx, int* version);
  // "12.8"-style text of a version number in this API's encoding.
  void (*version_text)(void* ctx, int version, char* out, std::size_t out_len);
  // cudaThreadExchangeStreamCaptureMode: with relaxed = 1 switches this thread to relaxed and
  // writes the previous mode to *mode; with relaxed = 0 sets this thread's mode to *mode (a
  // CaptureMode) and writes the previous one to *mode (to set ThreadLocal, or to restore).
  int (*exchange_capture_mode)(void* ctx, int* mode, int relaxed);
  // cudaStreamIsCapturing: 1 when `stream` is capturing (or its capture was invalidated). For
  // the legacy stream, err_capture_implicit means a blocking stream of the device is capturing.
  int (*stream_capturing)(void* ctx, void* stream, int* capturing);

  // ---- streams and events ----
  int (*stream_create)(void* ctx, void** stream);  // non-blocking
  int (*stream_destroy)(void* ctx, void* stream);
  int (*stream_synchronize)(void* ctx, void* stream);
  int (*stream_wait_event)(void* ctx, void* stream, void* event);
  // Blocks `stream` until the 32-bit word at `flag` (from flag_alloc) equals `value`
  // (cuStreamWaitValue32, hipStreamWaitValue32): a gate that needs no host thread.
  int (*stream_wait_value32)(void* ctx, void* stream, std::uint32_t* flag, std::uint32_t value);
  // A host-writable word that stream_wait_value32 may wait on: pinned, device-mapped host memory
  // on CUDA; signal memory (hipExtMallocWithFlags(hipMallocSignalMemory)) on HIP, the only memory
  // hipStreamWaitValue32 is documented for, after checking hipDeviceAttributeCanUseStreamWaitValue.
  int (*flag_alloc)(void* ctx, std::uint32_t** flag);
  int (*flag_free)(void* ctx, std::uint32_t* flag);
  int (*launch_host_func)(void* ctx, void* stream, void (*fn)(void*), void* arg);
  int (*event_create)(void* ctx, void** event, int flags);  // EventFlags
  int (*event_destroy)(void* ctx, void* event);
  int (*event_record)(void* ctx, void* event, void* stream);
  int (*event_query)(void* ctx, void* event);
  int (*event_synchronize)(void* ctx, void* event);
  int (*event_elapsed_ms)(void* ctx, float* ms, void* start, void* end);

  // ---- memory ----
  int (*host_register)(void* ctx, void* ptr, std::size_t bytes);  // portable | mapped
  int (*host_unregister)(void* ctx, void* ptr);
  int (*host_device_pointer)(void* ctx, void** device, void* host);
  // Pinned, device-mapped host memory for the descriptor rings (coherent on HIP).
  int (*host_alloc_mapped)(void* ctx, void** ptr, std::size_t bytes);
  int (*host_free)(void* ctx, void* ptr);
  int (*device_malloc)(void* ctx, void** ptr, std::size_t bytes);
  int (*device_free)(void* ctx, void* ptr);  // synchronizes the device (not for async memory)
  // Stream-ordered allocation and free (cudaMallocAsync / cudaFreeAsync): no device-wide
  // synchronization. Only memory from device_malloc_async may be freed by device_free_async.
  // Null where missing (both or neither).
  int (*device_malloc_async)(void* ctx, void** ptr, std::size_t bytes, void* stream);
  int (*device_free_async)(void* ctx, void* ptr, void* stream);
  // Whether `device` has memory pools (cudaDevAttrMemoryPoolsSupported): where it has not (some
  // vGPUs), the stream-ordered calls exist but answer "not supported", and the runtime
  // allocates plainly. Set with the pair above; null with them.
  int (*memory_pools_supported)(void* ctx, int device, int* supported);
  // 1 when ptr is device (or managed) memory.
  int (*pointer_is_device)(void* ctx, const void* ptr, int* is_device);
  int (*memcpy_async)(void* ctx, void* dst, const void* src, std::size_t bytes, int kind,
                      void* stream);
  int (*memset_async)(void* ctx, void* dst, int value, std::size_t bytes, void* stream);

  // ---- batched DMA (null when this runtime has none) ----
  // count copies dsts[i] <- srcs[i]; source_in_stream_order: 1 = STREAM (the source may be
  // written by earlier work in the stream), 0 = ANY. Returns the batch API's own code (CUDA: a
  // CUresult) with *fail_index the refused copy or SIZE_MAX.
  int (*memcpy_batch_async)(void* ctx, void** dsts, const void** srcs, std::size_t* sizes,
                            std::size_t count, int source_in_stream_order, void* stream,
                            std::size_t* fail_index);
  // Text of a batch code, and whether it means "never works in this process" (not supported,
  // not permitted) rather than "not this batch" (a bad descriptor, no context on this thread).
  const char* (*batch_error_text)(void* ctx, int code);
  int (*batch_error_is_permanent)(void* ctx, int code);
  const char* batch_detail;  // what the batch entry point is, or why there is none

  // ---- the copy kernel (kernels/copy_kernels.cu) ----
  // 0 when the current device can run it (an image for its architecture exists).
  int (*kernel_check)(void* ctx);
  // Launches the batch copy kernel over count descriptors at `descs` (device-readable) with
  // `ctas` CTAs; returns the launch's own status (never an earlier error of the thread).
  int (*kernel_launch)(void* ctx, const VendorCopyDesc* descs, std::size_t count, int ctas,
                       void* stream);
  int kernel_threads;  // threads per CTA the kernel is built for
};

// Fills every call entry of `table` from the functions of the same names in the current scope:
// a vendor module defines error_name, get_last_error, ... in its own namespace and says
// KVOFFLOAD_VENDOR_TABLE_CALLS(table), so the two modules never list the table twice. The data
// fields and the optional entries (batch, malloc_async / free_async) stay the module's to set.
#define KVOFFLOAD_VENDOR_TABLE_CALLS(table)                      \
  do {                                                           \
    (table).error_name = error_name;                             \
    (table).error_string = error_string;                         \
    (table).get_last_error = get_last_error;                     \
    (table).get_device_count = get_device_count;                 \
    (table).get_device = get_device;                             \
    (table).current_device = current_device;                     \
    (table).foreign_context = foreign_context;                   \
    (table).set_context = set_context;                           \
    (table).set_device = set_device;                             \
    (table).device_synchronize = device_synchronize;             \
    (table).device_describe = device_describe;                   \
    (table).driver_version = driver_version;                     \
    (table).runtime_version = runtime_version;                   \
    (table).version_text = version_text;                         \
    (table).exchange_capture_mode = exchange_capture_mode;       \
    (table).stream_capturing = stream_capturing;                 \
    (table).stream_create = stream_create;                       \
    (table).stream_destroy = stream_destroy;                     \
    (table).stream_synchronize = stream_synchronize;             \
    (table).stream_wait_event = stream_wait_event;               \
    (table).stream_wait_value32 = stream_wait_value32;           \
    (table).flag_alloc = flag_alloc;                             \
    (table).flag_free = flag_free;                               \
    (table).launch_host_func = launch_host_func;                 \
    (table).event_create = event_create;                         \
    (table).event_destroy = event_destroy;                       \
    (table).event_record = event_record;                         \
    (table).event_query = event_query;                           \
    (table).event_synchronize = event_synchronize;               \
    (table).event_elapsed_ms = event_elapsed_ms;                 \
    (table).host_register = host_register;                       \
    (table).host_unregister = host_unregister;                   \
    (table).host_device_pointer = host_device_pointer;           \
    (table).host_alloc_mapped = host_alloc_mapped;               \
    (table).host_free = host_free;                               \
    (table).device_malloc = device_malloc;                       \
    (table).device_free = device_free;                           \
    (table).pointer_is_device = pointer_is_device;               \
    (table).memcpy_async = memcpy_async;                         \
    (table).memset_async = memset_async;                         \
    (table).batch_error_text = batch_error_text;                 \
    (table).batch_error_is_permanent = batch_error_is_permanent; \
    (table).kernel_check = kernel_check;                         \
    (table).kernel_launch = kernel_launch;                       \
  } while (0)

// Entry point every backend module exports (C linkage, looked up with dlsym). Returns the table,
// or null with the reason written to `why` (e.g. no driver).
using VendorApiEntry = const VendorApi* (*)(char* why, std::size_t why_len);
inline constexpr const char* kVendorApiEntrySymbol = "kvoffload_vendor_api_v1";

}  // namespace kvoffload::gpu
