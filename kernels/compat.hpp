#pragma once
// The small compatibility layer that lets each kernel be written once for CUDA, HIP and the
// simulated device. Every difference between them lives here; the kernels use only the kvo_* /
// KVO_* names below.
//
// - KVO_WARP_SIZE: 32 on NVIDIA, 64 on CDNA, 32 on RDNA; always the device's own `warpSize`,
//   never a literal, so code written against it is right on every one of them.
// - KVO_SHARED(type, name): a CTA-shared variable (__shared__; on sim, the CTA's shared arena).
// - kvo_vec16: a 16-byte value loaded and stored with one vector instruction.
// - kvo_load_stream / kvo_store_stream: 16-byte accesses with a streaming ("evict first") cache
//   hint, so a KV copy does not push the model's working set out of L2: ld.global.cs /
//   st.global.cs through __ldcs/__stcs on CUDA, nontemporal loads/stores on AMD.
// - kvo_copy_word<T>: one aligned 8-, 4- or 2-byte word copied (the kernel's narrow path); on
//   sim it faults when misaligned, as the GPU's narrow loads and stores do.
// - kvo_note_group(bytes, capacity): the bytes one thread moves in one group of loads and what it
//   could move; counted on sim (bytes in flight per CTA, SimCounters), nothing on a GPU.
// - kvo_block_scan<Threads>: a block-wide inclusive sum from the vendors' own libraries
//   (cub::BlockScan from CCCL on CUDA, rocprim::block_scan on HIP; hipCUB is not packaged in
//   Debian), and a plain scan over the CTA's shared arena on sim.
#include <cstdint>

#if defined(KVOFFLOAD_KERNELS_HIP)
#include <hip/hip_runtime.h>
#include <rocprim/block/block_scan.hpp>

// Host launchers are defined in kvoffload::kernels::<KVO_BACKEND_NS> (see copy_kernels.hpp).
#define KVO_BACKEND_NS hip

#define KVO_WARP_SIZE warpSize
#define KVO_SHARED(type, name) __shared__ type name
using kvo_stream_t = hipStream_t;
using kvo_error_t = hipError_t;
#define kvoSuccess hipSuccess
#define kvoErrorInvalidValue hipErrorInvalidValue
#define kvoGetErrorString hipGetErrorString
#define kvoFuncGetAttributes hipFuncGetAttributes
#define kvoLaunchKernel hipLaunchKernel
using kvo_func_attributes = hipFuncAttributes;

// HIP's uint4 is a struct wrapper; __builtin_nontemporal_{load,store} want a clang vector type.
typedef unsigned int kvo_vec16 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ kvo_vec16 kvo_load_stream(const kvo_vec16* p) {
  return __builtin_nontemporal_load(p);
}
__device__ __forceinline__ void kvo_store_stream(kvo_vec16* p, kvo_vec16 v) {
  __builtin_nontemporal_store(v, p);
}

template <typename T>
__device__ __forceinline__ void kvo_copy_word(unsigned char* dst, const unsigned char* src) {
  *reinterpret_cast<T*>(dst) = *reinterpret_cast<const T*>(src);
}
// Accounting of the simulated device only (bytes a thread moves per group); nothing on a GPU.
__device__ __forceinline__ void kvo_note_group(unsigned /*bytes*/, unsigned /*capacity*/) {}

template <int Threads>
struct kvo_block_scan {
  using impl = rocprim::block_scan<unsigned long long, Threads>;
  using storage = typename impl::storage_type;
  __device__ static unsigned long long inclusive_sum(unsigned long long v, storage& s) {
    unsigned long long out = 0;
    impl().inclusive_scan(v, out, s);
    return out;
  }
};

#elif defined(KVOFFLOAD_KERNELS_SIM)
// The simulated device runs the kernel body on the CPU: one host thread per GPU thread of a CTA,
// CTAs one after another, __syncthreads a barrier of the CTA's threads (kernels/sim_thread.hpp,
// driven by core/src/runtime/sim). Nothing here may touch a GPU.
#include "sim_thread.hpp"

#define KVO_BACKEND_NS sim

// CUDA's own keywords, given their meaning on the CPU: reserved names on purpose.
// NOLINTBEGIN(bugprone-reserved-identifier)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __syncthreads() ::kvoffload::kernels::sim::sync_threads()
// NOLINTEND(bugprone-reserved-identifier)
#define threadIdx (::kvoffload::kernels::sim::this_thread().thread_idx)
#define blockIdx (::kvoffload::kernels::sim::this_thread().block_idx)
#define gridDim (::kvoffload::kernels::sim::this_thread().grid_dim)
#define KVO_WARP_SIZE 32
#define KVO_SHARED(type, name) type& name = ::kvoffload::kernels::sim::shared<type>()

struct alignas(16) kvo_vec16 {
  std::uint32_t x, y, z, w;
};
// Vector accesses fault when misaligned, as on a GPU (sim_thread.hpp).
inline kvo_vec16 kvo_load_stream(const kvo_vec16* p) {
  kvo_vec16 v;
  ::kvoffload::kernels::sim::vector_load(p, &v);
  return v;
}
inline void kvo_store_stream(kvo_vec16* p, kvo_vec16 v) {
  ::kvoffload::kernels::sim::vector_store(p, &v);
}
template <typename T>
inline void kvo_copy_word(unsigned char* dst, const unsigned char* src) {
  ::kvoffload::kernels::sim::word_copy(dst, src, sizeof(T));
}
inline void kvo_note_group(unsigned bytes, unsigned capacity) {
  ::kvoffload::kernels::sim::note_group(bytes, capacity);
}

template <int Threads>
struct kvo_block_scan {
  struct storage {
    unsigned long long v[Threads];
  };
  static unsigned long long inclusive_sum(unsigned long long v, storage& s) {
    const unsigned tid = threadIdx.x;
    s.v[tid] = v;
    __syncthreads();
    unsigned long long sum = 0;
    for (unsigned i = 0; i <= tid; ++i) sum += s.v[i];
    __syncthreads();  // every thread has read s before it is reused
    return sum;
  }
};

#else
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#define KVO_BACKEND_NS cuda

#define KVO_WARP_SIZE warpSize
#define KVO_SHARED(type, name) __shared__ type name
using kvo_stream_t = cudaStream_t;
using kvo_error_t = cudaError_t;
#define kvoSuccess cudaSuccess
#define kvoErrorInvalidValue cudaErrorInvalidValue
#define kvoGetErrorString cudaGetErrorString
#define kvoFuncGetAttributes cudaFuncGetAttributes
#define kvoLaunchKernel cudaLaunchKernel
using kvo_func_attributes = cudaFuncAttributes;

using kvo_vec16 = uint4;

__device__ __forceinline__ kvo_vec16 kvo_load_stream(const kvo_vec16* p) {
  return __ldcs(p);
}
__device__ __forceinline__ void kvo_store_stream(kvo_vec16* p, kvo_vec16 v) {
  __stcs(p, v);
}

template <typename T>
__device__ __forceinline__ void kvo_copy_word(unsigned char* dst, const unsigned char* src) {
  *reinterpret_cast<T*>(dst) = *reinterpret_cast<const T*>(src);
}
// Accounting of the simulated device only (bytes a thread moves per group); nothing on a GPU.
__device__ __forceinline__ void kvo_note_group(unsigned /*bytes*/, unsigned /*capacity*/) {}

template <int Threads>
struct kvo_block_scan {
  using impl = cub::BlockScan<unsigned long long, Threads>;
  using storage = typename impl::TempStorage;
  __device__ static unsigned long long inclusive_sum(unsigned long long v, storage& s) {
    unsigned long long out = 0;
    impl(s).InclusiveSum(v, out);
    return out;
  }
};

#endif

static_assert(sizeof(kvo_vec16) == 16, "kvo_vec16 must be one 16-byte vector");
