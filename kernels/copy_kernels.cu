// Device copy kernels (written once; compiled by nvcc and hipcc). Placeholder until the transfer
// engine lands its batch copy kernel.
#include "compat.hpp"
#include "kvoffload_kernels/copy_kernels.hpp"

namespace kvoffload::kernels {

__global__ void copy_probe_kernel() {}

int launch_copy_probe(void* stream) {
  copy_probe_kernel<<<1, 1, 0, static_cast<kvo_stream_t>(stream)>>>();
  return static_cast<int>(kvoGetLastError());
}

}  // namespace kvoffload::kernels
