#pragma once
// The small compatibility layer that lets each kernel be written once for CUDA and HIP. Every
// difference between the two lives here; the kernels use only the kvo_* names below.
//
// - KVO_WARP_SIZE: 32 on NVIDIA, 64 on CDNA, 32 on RDNA; always the device's own `warpSize`,
//   never a literal, so code written against it is right on every one of them.
// - kvo_vec16: a 16-byte value loaded and stored with one vector instruction.
// - kvo_load_stream / kvo_store_stream: 16-byte accesses with a streaming ("evict first") cache
//   hint, so a KV copy does not push the model's working set out of L2: ld.global.cs /
//   st.global.cs through __ldcs/__stcs on CUDA, nontemporal loads/stores on AMD.
#include <cstdint>

#if defined(KVOFFLOAD_KERNELS_HIP)
#include <hip/hip_runtime.h>

// Host launchers are defined in kvoffload::kernels::<KVO_BACKEND_NS> (see copy_kernels.hpp).
#define KVO_BACKEND_NS hip

#define KVO_WARP_SIZE warpSize
using kvo_stream_t = hipStream_t;
using kvo_error_t = hipError_t;
#define kvoGetLastError hipGetLastError
#define kvoSuccess hipSuccess
#define kvoErrorInvalidValue hipErrorInvalidValue
#define kvoGetErrorString hipGetErrorString
#define kvoFuncGetAttributes hipFuncGetAttributes
using kvo_func_attributes = hipFuncAttributes;

// HIP's uint4 is a struct wrapper; __builtin_nontemporal_{load,store} want a clang vector type.
typedef unsigned int kvo_vec16 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ kvo_vec16 kvo_load_stream(const kvo_vec16* p) {
  return __builtin_nontemporal_load(p);
}
__device__ __forceinline__ void kvo_store_stream(kvo_vec16* p, kvo_vec16 v) {
  __builtin_nontemporal_store(v, p);
}

#else
#include <cuda_runtime.h>

#define KVO_BACKEND_NS cuda

#define KVO_WARP_SIZE warpSize
using kvo_stream_t = cudaStream_t;
using kvo_error_t = cudaError_t;
#define kvoGetLastError cudaGetLastError
#define kvoSuccess cudaSuccess
#define kvoErrorInvalidValue cudaErrorInvalidValue
#define kvoGetErrorString cudaGetErrorString
#define kvoFuncGetAttributes cudaFuncGetAttributes
using kvo_func_attributes = cudaFuncAttributes;

using kvo_vec16 = uint4;

__device__ __forceinline__ kvo_vec16 kvo_load_stream(const kvo_vec16* p) { return __ldcs(p); }
__device__ __forceinline__ void kvo_store_stream(kvo_vec16* p, kvo_vec16 v) { __stcs(p, v); }

#endif

static_assert(sizeof(kvo_vec16) == 16, "kvo_vec16 must be one 16-byte vector");
