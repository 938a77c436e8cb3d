#pragma once
// What a kernel body compiled for the simulated device (compat.hpp, KVOFFLOAD_KERNELS_SIM) sees
// of "its" GPU thread: indices, the CTA's shared arena and its barrier. Set by the CTA executor
// in core/src/runtime/sim before it switches to the thread; plain host C++.
#include <cstddef>

namespace kvoffload::kernels::sim {

struct Dim3 {
  unsigned x = 0;
  unsigned y = 0;
  unsigned z = 0;
};

struct ThreadContext {
  Dim3 thread_idx;
  Dim3 block_idx;
  Dim3 grid_dim;
  void* shared = nullptr;         // the CTA's shared memory
  void (*sync)(void*) = nullptr;  // __syncthreads of the CTA
  void* sync_arg = nullptr;
};

// The GPU thread running now on this host thread.
ThreadContext& this_thread() noexcept;

// One 16-byte vector load / store, as the GPU makes it (ld.global.v4 / st.global.v4): the address
// must be 16-byte aligned, or the access faults with a misaligned address (a sticky error) and
// the kernel stops there, as on a GPU. Defined by the CTA executor (core/src/runtime/sim).
void vector_load(const void* src, void* out16);
void vector_store(void* dst, const void* in16);
// One 8-, 4- or 2-byte word copied: each address must be a multiple of `bytes`, or it faults.
void word_copy(void* dst, const void* src, std::size_t bytes);
// One thread's group of loads moved `bytes` of the `capacity` it could (kUnroll vectors): the
// executor sums both, so a test reads the bytes a CTA keeps in flight (SimCounters).
void note_group(unsigned bytes, unsigned capacity);

inline void sync_threads() {
  ThreadContext& t = this_thread();
  t.sync(t.sync_arg);
}

template <typename T>
T& shared() noexcept {
  return *static_cast<T*>(this_thread().shared);
}

}  // namespace kvoffload::kernels::sim
