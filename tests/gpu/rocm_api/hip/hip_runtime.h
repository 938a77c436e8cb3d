// The HIP runtime API of ROCm 6.x and 7.x, as far as hip/src/hip_api.cpp uses it: declarations
// written for the hip_api_rocm compile check (tests/gpu/CMakeLists.txt), from ROCm's own
// include/hip/hip_runtime_api.h (ROCm/HIP rocm-6.2.0 and develop of late 2024, ROCm 7's
// projects/hip). Only one ROCm is installed where CI runs (Debian's 5.2), so this stands in for the
// others the way check_cuda_api_levels.py stands in for older CUDA toolkits: it catches a table
// that uses what ROCm 6 removed or changed, never a call a real ROCm 6 lacks that this file
// declares. Declared here exactly as ROCm 6 and 7 differ from 5.2:
// - hipPointerAttribute_t has `type` (no `memoryType`), and hipMemoryType is renumbered
//   (Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11; 5.2: Host 0, Device 1,
//   Array 2, Unified 3);
// - hipDeviceProp_t and hipGetDeviceProperties are macros for the R0600 versions;
// - from HIP 6.3 (KVOFFLOAD_FAKE_HIP_MINOR >= 3 or major 7) hipHostMalloc and hipHostFree are
//   deprecated for hipHostAlloc and hipFreeHost, the reverse of 5.2 and 6.2.
// KVOFFLOAD_FAKE_HIP_MAJOR / KVOFFLOAD_FAKE_HIP_MINOR choose the version (default 6.0).
#pragma once

#include <cstddef>
#include <cstdint>

#ifndef KVOFFLOAD_FAKE_HIP_MAJOR
#define KVOFFLOAD_FAKE_HIP_MAJOR 6
#endif
#ifndef KVOFFLOAD_FAKE_HIP_MINOR
#define KVOFFLOAD_FAKE_HIP_MINOR 0
#endif
#define HIP_VERSION_MAJOR KVOFFLOAD_FAKE_HIP_MAJOR
#define HIP_VERSION_MINOR KVOFFLOAD_FAKE_HIP_MINOR
#define HIP_VERSION_PATCH 0
#define HIP_VERSION (HIP_VERSION_MAJOR * 10000000 + HIP_VERSION_MINOR * 100000 + HIP_VERSION_PATCH)
#define __HIP_PLATFORM_AMD__ 1  // NOLINT(bugprone-reserved-identifier): ROCm's own name

#define HIP_DEPRECATED(msg) __attribute__((deprecated(msg)))
#if HIP_VERSION >= 60300000
#define KVO_FAKE_DEPRECATED_FROM_6_3(msg) HIP_DEPRECATED(msg)
#define KVO_FAKE_DEPRECATED_UNTIL_6_3(msg)
#else
#define KVO_FAKE_DEPRECATED_FROM_6_3(msg)
#define KVO_FAKE_DEPRECATED_UNTIL_6_3(msg) HIP_DEPRECATED(msg)
#endif

// NOLINTBEGIN: ROCm's names and C declarations, as ROCm spells them.
extern "C" {

typedef enum [[nodiscard]] hipError_t{
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorNotReady = 600,
    hipErrorIllegalAddress = 700,
    hipErrorNotSupported = 801,
    hipErrorStreamCaptureUnsupported = 900,
    hipErrorStreamCaptureInvalidated = 901,
    hipErrorStreamCaptureImplicit = 906,
    hipErrorCapturedEvent = 907,
    hipErrorUnknown = 999,
} hipError_t;

typedef enum hipMemoryType {
  hipMemoryTypeUnregistered = 0,
  hipMemoryTypeHost = 1,
  hipMemoryTypeDevice = 2,
  hipMemoryTypeManaged = 3,
  hipMemoryTypeArray = 10,
  hipMemoryTypeUnified = 11
} hipMemoryType;

typedef struct hipPointerAttribute_t {
  enum hipMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
  int isManaged;
  unsigned allocationFlags;
} hipPointerAttribute_t;

typedef enum hipMemcpyKind {
  hipMemcpyHostToHost = 0,
  hipMemcpyHostToDevice = 1,
  hipMemcpyDeviceToHost = 2,
  hipMemcpyDeviceToDevice = 3,
  hipMemcpyDefault = 4
} hipMemcpyKind;

typedef enum hipStreamCaptureMode {
  hipStreamCaptureModeGlobal = 0,
  hipStreamCaptureModeThreadLocal,
  hipStreamCaptureModeRelaxed
} hipStreamCaptureMode;

typedef enum hipStreamCaptureStatus {
  hipStreamCaptureStatusNone = 0,
  hipStreamCaptureStatusActive,
  hipStreamCaptureStatusInvalidated
} hipStreamCaptureStatus;

// Only the attributes the table reads (their values are ROCm 6's).
typedef enum hipDeviceAttribute_t {
  hipDeviceAttributeMemoryPoolsSupported = 88,
  hipDeviceAttributeCanUseStreamWaitValue = 10013,
} hipDeviceAttribute_t;

typedef struct ihipStream_t* hipStream_t;
typedef struct ihipEvent_t* hipEvent_t;
typedef void (*hipStreamCallback_t)(hipStream_t stream, hipError_t status, void* userData);

#define hipStreamDefault 0x00
#define hipStreamNonBlocking 0x01
#define hipEventDefault 0x0
#define hipEventBlockingSync 0x1
#define hipEventDisableTiming 0x2
#define hipHostMallocDefault 0x0
#define hipHostMallocPortable 0x1
#define hipHostMallocMapped 0x2
#define hipHostMallocCoherent 0x40000000
#define hipHostAllocDefault 0x0
#define hipHostAllocPortable 0x1
#define hipHostAllocMapped 0x2
#define hipHostRegisterDefault 0x0
#define hipHostRegisterPortable 0x1
#define hipHostRegisterMapped 0x2
#define hipMallocSignalMemory 0x2
#define hipStreamWaitValueGte 0x0
#define hipStreamWaitValueEq 0x1

typedef struct hipDeviceProp_tR0600 {
  char name[256];
  char uuid[16];
  char luid[8];
  unsigned int luidDeviceNodeMask;
  std::size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
  char gcnArchName[256];
} hipDeviceProp_tR0600;
#define hipDeviceProp_t hipDeviceProp_tR0600
#define hipGetDeviceProperties hipGetDevicePropertiesR0600

const char* hipGetErrorName(hipError_t hip_error);
const char* hipGetErrorString(hipError_t hipError);
hipError_t hipGetLastError(void);
hipError_t hipGetDeviceCount(int* count);
hipError_t hipGetDevice(int* deviceId);
hipError_t hipSetDevice(int deviceId);
hipError_t hipDeviceSynchronize(void);
hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600* prop, int deviceId);
hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr, int deviceId);
hipError_t hipDriverGetVersion(int* driverVersion);
hipError_t hipRuntimeGetVersion(int* runtimeVersion);
hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode* mode);
hipError_t hipStreamIsCapturing(hipStream_t stream, hipStreamCaptureStatus* pCaptureStatus);
hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags);
hipError_t hipStreamDestroy(hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipStreamQuery(hipStream_t stream);
hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags);
hipError_t hipStreamWaitValue32(hipStream_t stream, void* ptr, std::uint32_t value,
                                unsigned int flags, std::uint32_t mask);
hipError_t hipStreamAddCallback(hipStream_t stream, hipStreamCallback_t callback, void* userData,
                                unsigned int flags);
hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags);
hipError_t hipEventDestroy(hipEvent_t event);
hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream);
hipError_t hipEventQuery(hipEvent_t event);
hipError_t hipEventSynchronize(hipEvent_t event);
hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop);
hipError_t hipHostRegister(void* hostPtr, std::size_t sizeBytes, unsigned int flags);
hipError_t hipHostUnregister(void* hostPtr);
hipError_t hipHostGetDevicePointer(void** devPtr, void* hstPtr, unsigned int flags);
KVO_FAKE_DEPRECATED_FROM_6_3("use hipExtHostAlloc instead")
hipError_t hipHostMalloc(void** ptr, std::size_t size, unsigned int flags);
KVO_FAKE_DEPRECATED_UNTIL_6_3("use hipHostMalloc instead")
hipError_t hipHostAlloc(void** ptr, std::size_t size, unsigned int flags);
KVO_FAKE_DEPRECATED_FROM_6_3("use hipFreeHost instead")
hipError_t hipHostFree(void* ptr);
KVO_FAKE_DEPRECATED_UNTIL_6_3("use hipHostFree instead")
hipError_t hipFreeHost(void* ptr);
hipError_t hipMalloc(void** ptr, std::size_t size);
hipError_t hipExtMallocWithFlags(void** ptr, std::size_t sizeBytes, unsigned int flags);
hipError_t hipFree(void* ptr);
hipError_t hipPointerGetAttributes(hipPointerAttribute_t* attributes, const void* ptr);
hipError_t hipMemcpyAsync(void* dst, const void* src, std::size_t sizeBytes, hipMemcpyKind kind,
                          hipStream_t stream);
hipError_t hipMemsetAsync(void* dst, int value, std::size_t sizeBytes, hipStream_t stream);

}  // extern "C"
// NOLINTEND
