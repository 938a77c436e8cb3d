#pragma once
// Host-side entry points of the device copy kernels (kernels/copy_kernels.cu, compiled once by nvcc
// and once by hipcc). No CUDA or HIP types here, so the backends (plain host C++) and anything
// else can include it: streams are passed as void* (a cudaStream_t / hipStream_t).
//
// C++17: this header is also compiled by nvcc/hipcc in C++17 mode.
#include <cstddef>
#include <cstdint>

namespace kvoffload::kernels {

// One copy of `bytes` bytes from `src` to `dst`. Both addresses must be valid on the device that
// runs the kernel: device memory, or host memory through its device pointer (the value
// cudaHostGetDevicePointer / hipHostGetDevicePointer returns for a registered range; on ROCm it
// can differ from the host pointer). Never an unregistered host pointer.
struct CopyDesc {
  const void* src;
  void* dst;
  std::uint64_t bytes;
};
static_assert(sizeof(CopyDesc) == 24, "CopyDesc is shared by host and device code");

// Threads per CTA of the batch copy kernel (a multiple of every warp size: 32 and 64).
inline constexpr int kBatchCopyThreads = 256;
// Bytes one CTA moves per row of the batch: one 16-byte vector per thread.
inline constexpr std::uint64_t kBatchCopyChunkBytes = 16u * kBatchCopyThreads;
// Independent 16-byte loads each thread keeps in flight before its first store. Host memory read
// through PCIe is latency-bound (bandwidth = bytes in flight / round trip), so this matters more
// than anything else: 16 CTAs x 256 threads x 4 x 16 B = 256 KiB in flight.
inline constexpr int kBatchCopyLoadsInFlight = 4;
// Default grid: small, so the copy leaves the model's SMs alone (about 12-16 CTAs reach the PCIe
// peak for H2D pieces of 8-32 KiB on H100).
inline constexpr int kDefaultBatchCopyCtas = 16;

// CTAs worth launching for a batch of `total_bytes`: no more than one per chunk group, at most
// `max_ctas` (kDefaultBatchCopyCtas when max_ctas <= 0), at least 1.
inline int batch_copy_ctas(std::uint64_t total_bytes, int max_ctas) noexcept {
  const std::uint64_t cap = max_ctas > 0 ? static_cast<std::uint64_t>(max_ctas)
                                         : static_cast<std::uint64_t>(kDefaultBatchCopyCtas);
  const std::uint64_t group = kBatchCopyChunkBytes * kBatchCopyLoadsInFlight;
  const std::uint64_t useful = (total_bytes + group - 1) / group;
  return static_cast<int>(useful < 1 ? 1 : (useful < cap ? useful : cap));
}

// The launch functions exist once per GPU runtime, in kvoffload::kernels::cuda (built by nvcc)
// and kvoffload::kernels::hip (built by hipcc), because both can be linked into one library; each
// backend calls its own.
//
// launch_batch_copy enqueues one kernel on `stream` that performs every copy of descs[0..count).
// Copies within the batch may run in any order and must not overlap each other. The batch's
// descriptors are cut into 16-byte vectors, numbered one after another, and rows of
// kBatchCopyChunkBytes (one vector per thread, pieces of several descriptors sharing a row) are
// spread round-robin over the CTAs, so one large descriptor uses the whole grid, many small ones
// are shared out evenly and keep every lane's loads busy. 16-byte vector accesses
// with a streaming cache hint where src and dst are 16-byte aligned; narrower words, then bytes,
// for the rest (any size and alignment is copied exactly).
//
// `device_descs` must be readable by the device: device memory or registered/pinned host memory
// (its device pointer). The caller owns that buffer and must neither free nor rewrite it until the
// kernel has completed (record an event after the launch): the GPU backends keep a ring of pinned
// descriptor buffers per stream for this and reuse a slot only after its event completed.
//
// `max_ctas` bounds the grid (kDefaultBatchCopyCtas when <= 0); see batch_copy_ctas.
// Returns 0 on success (also for count == 0, which launches nothing), else the error of this
// launch (cudaError_t / hipError_t from cudaLaunchKernel / hipLaunchKernel, never an earlier error
// left on the thread); runtime_error_string names it.
namespace cuda {
int launch_batch_copy(const CopyDesc* device_descs, std::size_t count, int max_ctas, void* stream);
const char* runtime_error_string(int code) noexcept;
// 0 when the current device can run the batch copy kernel, else the runtime's error (e.g. no
// kernel image for this GPU's architecture in the fat binary).
int check_batch_copy() noexcept;
}  // namespace cuda

namespace hip {
int launch_batch_copy(const CopyDesc* device_descs, std::size_t count, int max_ctas, void* stream);
const char* runtime_error_string(int code) noexcept;
// 0 when the current device can run the batch copy kernel, else the runtime's error (e.g. no
// kernel image for this GPU's architecture in the fat binary).
int check_batch_copy() noexcept;
}  // namespace hip

// The simulated device (core/src/runtime/sim): runs one GPU thread of the kernel on the calling
// host thread, whose indices, shared arena and barrier the executor set (kernels/sim_thread.hpp).
// `descs` are host-addressable (the simulator translated them).
namespace sim {
void run_batch_copy_thread(const CopyDesc* descs, std::size_t count);
}  // namespace sim

}  // namespace kvoffload::kernels
