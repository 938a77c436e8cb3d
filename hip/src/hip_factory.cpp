// The HIP backend's factory functions (declared in core/src/transfer/backend_factories.hpp).
#include "hip_check.hpp"
#include "hip_device_runtime.hpp"

#include "transfer/backend_factories.hpp"
#include "util/version_text.hpp"

#include <kvoffload/error.hpp>

#include <hip/hip_runtime.h>

#include <cstdlib>
#include <string>

namespace kvoffload::detail {

namespace {

std::string visible_devices_hint() {
  std::string hint;
  for (const char* name : {"HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}) {
    if (const char* env = std::getenv(name); env != nullptr) {
      hint += std::string(" (") + name + "=" + env + ")";
    }
  }
  return hint;
}

}  // namespace

BackendInfo probe_hip() {
  BackendInfo info{"hip", true, 0, {}};
  try {
    int count = 0;
    if (const hipError_t err = hipGetDeviceCount(&count); err != hipSuccess) {
      (void)hipGetLastError();
      info.detail = "no usable device: hipGetDeviceCount: " + hip::describe(err) +
                    (err == hipErrorNoDevice ? " (is /dev/kfd visible?)" : "");
      return info;
    }
    int driver = 0;
    int runtime = 0;
    (void)hipDriverGetVersion(&driver);
    (void)hipRuntimeGetVersion(&runtime);
    info.device_count = count;
    info.detail = "driver " + util::hip_version_string(driver) + ", runtime " +
                  util::hip_version_string(runtime);
    if (count == 0) {
      info.detail += "; no HIP device visible (is /dev/kfd available?)" + visible_devices_hint();
    }
    for (int i = 0; i < count; ++i) {
      hipDeviceProp_t prop{};
      if (hipGetDeviceProperties(&prop, i) == hipSuccess) {
        info.detail += "; " + std::to_string(i) + ": " + prop.name + " (" + prop.gcnArchName + ")";
      }
    }
    (void)hipGetLastError();
  } catch (...) {
    // probe never throws; what was gathered so far is returned
  }
  return info;
}

std::unique_ptr<DeviceRuntime> make_hip_runtime(const RuntimeOptions& options) {
  int count = 0;
  if (const hipError_t err = hipGetDeviceCount(&count); err != hipSuccess) {
    (void)hipGetLastError();
    throw Error(ErrorCode::kNotAvailable,
                "device runtime 'hip' is not available: hipGetDeviceCount: " + hip::describe(err) +
                    (err == hipErrorNoDevice ? " (is /dev/kfd visible?)" : ""),
                0, "hipGetDeviceCount");
  }
  if (count == 0) {
    throw Error(ErrorCode::kNotAvailable,
                "device runtime 'hip' is not available: no HIP device visible (is /dev/kfd available?)" +
                    visible_devices_hint());
  }
  if (options.device < 0 || options.device >= count) {
    throw_invalid("hip: device " + std::to_string(options.device) + " does not exist (" +
                  std::to_string(count) + " visible" + visible_devices_hint() + ")");
  }
  return std::make_unique<hip::HipRuntime>(options);
}

}  // namespace kvoffload::detail
