#pragma once
// The small compatibility layer that lets each kernel be written once for CUDA and HIP.
#if defined(KVOFFLOAD_KERNELS_HIP)
#include <hip/hip_runtime.h>
#define KVO_WARP_SIZE warpSize  // 64 on CDNA, 32 on RDNA: never hard-code 32
using kvo_stream_t = hipStream_t;
using kvo_error_t = hipError_t;
#define kvoGetLastError hipGetLastError
#define kvoSuccess hipSuccess
#define kvoGetErrorString hipGetErrorString
#else
#include <cuda_runtime.h>
#define KVO_WARP_SIZE 32
using kvo_stream_t = cudaStream_t;
using kvo_error_t = cudaError_t;
#define kvoGetLastError cudaGetLastError
#define kvoSuccess cudaSuccess
#define kvoGetErrorString cudaGetErrorString
#endif
