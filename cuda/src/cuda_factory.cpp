// The CUDA backend's factory functions (declared in core/src/transfer/backend_factories.hpp).
#include "cuda_check.hpp"
#include "cuda_device_runtime.hpp"

#include "transfer/backend_factories.hpp"
#include "util/version_text.hpp"

#include <kvoffload/error.hpp>

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

namespace kvoffload::detail {

namespace {

std::string visible_devices_hint() {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  return env != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + env + ")" : std::string();
}

}  // namespace

BackendInfo probe_cuda() {
  BackendInfo info{"cuda", true, 0, {}};
  try {
    int count = 0;
    if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
      (void)cudaGetLastError();
      info.detail = "no usable device: cudaGetDeviceCount: " + cuda::describe(err);
      return info;
    }
    int driver = 0;
    int runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    info.device_count = count;
    info.detail = "driver " + util::cuda_version_string(driver) + ", runtime " +
                  util::cuda_version_string(runtime);
    if (count == 0) {
      info.detail += "; no CUDA device visible" + visible_devices_hint();
    }
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
        info.detail += "; " + std::to_string(i) + ": " + prop.name + " (sm_" +
                       std::to_string(prop.major) + std::to_string(prop.minor) + ")";
      }
    }
    (void)cudaGetLastError();
  } catch (...) {
    // probe never throws; what was gathered so far is returned
  }
  return info;
}

std::unique_ptr<DeviceRuntime> make_cuda_runtime(const RuntimeOptions& options) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(ErrorCode::kNotAvailable,
                "device runtime 'cuda' is not available: cudaGetDeviceCount: " + cuda::describe(err),
                0, "cudaGetDeviceCount");
  }
  if (count == 0) {
    throw Error(ErrorCode::kNotAvailable,
                "device runtime 'cuda' is not available: no CUDA device visible" +
                    visible_devices_hint());
  }
  if (options.device < 0 || options.device >= count) {
    throw_invalid("cuda: device " + std::to_string(options.device) + " does not exist (" +
                  std::to_string(count) + " visible" + visible_devices_hint() + ")");
  }
  return std::make_unique<cuda::CudaRuntime>(options);
}

}  // namespace kvoffload::detail
