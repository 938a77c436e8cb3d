// Placeholder: replaced by the CUDA DeviceRuntime.
#include <cuda_runtime.h>
namespace kvoffload::cuda {
int device_count() noexcept {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
}  // namespace kvoffload::cuda
