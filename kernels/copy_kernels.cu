// Device copy kernels, written once against compat.hpp and compiled by nvcc (KVO_BACKEND_NS =
// cuda), by hipcc (KVO_BACKEND_NS = hip) and by the host compiler for the simulated device
// (KVO_BACKEND_NS = sim, core/src/runtime/sim/sim_kernel.cpp). The host entry points are declared
// in include/kvoffload_kernels/copy_kernels.hpp.
//
// Note [Batch copy work split]
// Descriptors are read in batches of kThreads into shared memory. Each descriptor is cut into
// 16-byte vectors, and an inclusive scan of the vector counts numbers every vector of the batch,
// descriptor after descriptor. A row is kThreads consecutive vectors of that numbering (thread t
// takes the t-th), so a row may hold the end of one descriptor and the start of the next: pieces
// under kChunk bytes share a row instead of each leaving most of one idle (before, a 1 KiB piece
// had a 4 KiB chunk of its own, and three quarters of the loads in flight carried nothing). Rows
// are taken kUnroll at a time ("groups"), and group G of a batch belongs to CTA
// (G + rotation) % gridDim.x, where `rotation` carries the group count of the previous batches so
// that a run of small batches does not always start at CTA 0. So a 2 MiB descriptor is spread
// over the whole grid, 1 KiB descriptors fill sixteen to a group, and the work of every CTA
// differs by at most one group per batch. Each thread finds the descriptor of its own vector
// (a binary search of the scan in shared memory, before any load). Every CTA
// reads every descriptor (24 bytes each), so the GPU runtime stages them in device memory with one
// copy before the launch (Note [Descriptor rings] in core/src/runtime/gpu/gpu_kernel_path.cpp): the
// CTAs then read them from L2, not each over PCIe.
//
// Within a group each thread first issues its kUnroll independent 16-byte loads, then the
// stores: reads of host memory over PCIe are latency-bound, so the loads in flight, not the
// instruction count, set the bandwidth (docs/DESIGN.md §4.4).
#include "compat.hpp"
#include "kvoffload_kernels/copy_kernels.hpp"

namespace kvoffload::kernels::KVO_BACKEND_NS {
namespace detail {

constexpr int kThreads = kBatchCopyThreads;
constexpr int kUnroll = kBatchCopyLoadsInFlight;
using u64 = unsigned long long;
constexpr u64 kChunk = kBatchCopyChunkBytes;
static_assert(kChunk == 16ull * kThreads, "a row is one 16-byte vector per thread");

// A valid, aligned device address for the loads of lanes that have no vector to copy.
__device__ kvo_vec16 g_idle_source;

using BlockScan = kvo_block_scan<kThreads>;

struct BatchShared {
  const unsigned char* src[kThreads];
  unsigned char* dst[kThreads];
  u64 bytes[kThreads];
  u64 vec_end[kThreads];  // inclusive scan of the vector counts: vectors of desc i end here
  typename BlockScan::storage scan;
};

// Copies n (< 16, or 16 at an address that is not 16-byte aligned) bytes with the widest word
// both addresses allow, then bytes. The slow path: aligned KV pieces only come here for the last
// partial vector of a descriptor.
__device__ __forceinline__ void copy_small(unsigned char* dst, const unsigned char* src,
                                           unsigned n) {
  const auto mis = reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst);
  unsigned i = 0;
  if ((mis & 7u) == 0) {
    for (; i + 8 <= n; i += 8) {
      kvo_copy_word<u64>(dst + i, src + i);
    }
  } else if ((mis & 3u) == 0) {
    for (; i + 4 <= n; i += 4) {
      kvo_copy_word<unsigned>(dst + i, src + i);
    }
  } else if ((mis & 1u) == 0) {
    for (; i + 2 <= n; i += 2) {
      kvo_copy_word<unsigned short>(dst + i, src + i);
    }
  }
  for (; i < n; ++i) {
    dst[i] = src[i];
  }
}

// Index of the descriptor that holds vector v of the batch: the first d with vec_end[d] > v.
// Zero-byte descriptors own no vector and are skipped by construction. v < vec_end[n - 1].
__device__ __forceinline__ int find_desc(const BatchShared& s, int n, u64 v) {
  int lo = 0;
  int hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (s.vec_end[mid] > v) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

__global__ void __launch_bounds__(kThreads)
    batch_copy_kernel(const CopyDesc* __restrict__ descs, std::size_t count) {
  KVO_SHARED(BatchShared, s);
  const int tid = static_cast<int>(threadIdx.x);
  const u64 grid = gridDim.x;
  u64 rotation = 0;  // (groups of all previous batches) % grid

  for (std::size_t base = 0; base < count; base += kThreads) {
    const int n = static_cast<int>(count - base < kThreads ? count - base : kThreads);

    // Load this batch's descriptors (coalesced, one per thread) and scan their vector counts.
    u64 vectors = 0;
    if (tid < n) {
      const CopyDesc d = descs[base + tid];
      s.src[tid] = static_cast<const unsigned char*>(d.src);
      s.dst[tid] = static_cast<unsigned char*>(d.dst);
      s.bytes[tid] = d.bytes;
      vectors = (d.bytes + 15u) / 16u;
    }
    // Block-wide inclusive scan from the vendor library (compat.hpp): independent of the warp
    // size, and the library's scan beats a hand-written Hillis-Steele one.
    s.vec_end[tid] = BlockScan::inclusive_sum(vectors, s.scan);
    __syncthreads();

    const u64 total = s.vec_end[kThreads - 1];           // vectors of the batch
    const u64 rows = (total + kThreads - 1) / kThreads;  // of kThreads vectors
    const u64 groups = (rows + kUnroll - 1) / kUnroll;
    const u64 first = (blockIdx.x + grid - rotation) % grid;

    for (u64 group = first; group < groups; group += grid) {
      // Addresses first (shared-memory lookups), then all loads back to back, then the stores:
      // a shared-memory read between two loads would make the compiler wait for the first load
      // (on AMD, flat loads and LDS reads share one counter) and leave one load in flight.
      const unsigned char* src[kUnroll];
      unsigned char* dst[kUnroll];
      unsigned len[kUnroll];  // bytes of this thread's piece: 0..16
      bool fast[kUnroll];     // a whole 16-byte vector at 16-byte aligned addresses
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        src[u] = nullptr;
        dst[u] = nullptr;
        len[u] = 0;
        fast[u] = false;
        const u64 v = (group * kUnroll + u) * kThreads + static_cast<u64>(tid);
        if (v < total) {  // only the batch's last row has idle lanes
          const int d = find_desc(s, n, v);
          const u64 off = (v - (d == 0 ? 0 : s.vec_end[d - 1])) * 16u;
          const u64 left = s.bytes[d] - off;  // > 0: vector v is one of d's
          src[u] = s.src[d] + off;
          dst[u] = s.dst[d] + off;
          len[u] = static_cast<unsigned>(left < 16 ? left : 16);
          const auto mis =
              reinterpret_cast<std::uintptr_t>(src[u]) | reinterpret_cast<std::uintptr_t>(dst[u]);
          fast[u] = len[u] == 16 && (mis & 15u) == 0;
        }
      }
      unsigned moved = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) moved += len[u];
      kvo_note_group(moved, 16u * kUnroll);  // the simulated device's accounting only
      // The loads are unconditional (a lane with nothing to load reads g_idle_source): a load in
      // its own branch gets a full wait for all earlier loads in front of it from LLVM's AMDGPU
      // backend, which would again leave one load in flight.
      kvo_vec16 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        v[u] =
            kvo_load_stream(fast[u] ? reinterpret_cast<const kvo_vec16*>(src[u]) : &g_idle_source);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (fast[u]) {
          kvo_store_stream(reinterpret_cast<kvo_vec16*>(dst[u]), v[u]);
        } else if (len[u] != 0) {
          copy_small(dst[u], src[u], len[u]);
        }
      }
    }

    rotation = (rotation + groups) % grid;
    __syncthreads();  // every thread is done with this batch's shared descriptors
  }
}

}  // namespace detail

#if defined(KVOFFLOAD_KERNELS_SIM)

// One CTA of the kernel on the calling host thread (the simulated device's executor sets the
// thread's indices, shared arena and barrier first).
void run_batch_copy_thread(const CopyDesc* descs, std::size_t count) {
  detail::batch_copy_kernel(descs, count);
}

#else

int launch_batch_copy(const CopyDesc* device_descs, std::size_t count, int max_ctas, void* stream) {
  if (count == 0) {
    return static_cast<int>(kvoSuccess);
  }
  if (device_descs == nullptr) {
    return static_cast<int>(kvoErrorInvalidValue);
  }
  // Grid bounded on purpose: the copy shares the GPU with the model (see copy_kernels.hpp).
  constexpr int kMaxGrid = 65535;
  const int grid =
      max_ctas <= 0 ? kDefaultBatchCopyCtas : (max_ctas < kMaxGrid ? max_ctas : kMaxGrid);
  // The launch API returns this launch's own status: a `<<<>>>` launch followed by
  // GetLastError would also report any earlier error left on the thread (by torch, say), and
  // a good launch would look failed (Note [Descriptor rings]).
  void* args[] = {const_cast<CopyDesc**>(&device_descs), &count};
  return static_cast<int>(kvoLaunchKernel(reinterpret_cast<const void*>(&detail::batch_copy_kernel),
                                          dim3(grid), dim3(detail::kThreads), args, 0,
                                          static_cast<kvo_stream_t>(stream)));
}

int check_batch_copy() noexcept {
  kvo_func_attributes attr{};
  return static_cast<int>(
      kvoFuncGetAttributes(&attr, reinterpret_cast<const void*>(&detail::batch_copy_kernel)));
}

const char* runtime_error_string(int code) noexcept {
  return kvoGetErrorString(static_cast<kvo_error_t>(code));
}

#endif

}  // namespace kvoffload::kernels::KVO_BACKEND_NS
