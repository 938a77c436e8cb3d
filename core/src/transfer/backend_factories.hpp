#pragma once
// Factory functions each backend defines; make_runtime() / list_backends() (runtime_factory.cpp)
// call them. Only the backends that are built define theirs: core calls the cuda ones only under
// KVOFFLOAD_HAVE_CUDA and the hip ones only under KVOFFLOAD_HAVE_HIP. No CUDA/HIP types here, so
// cuda/ and hip/ include this header with core/src on their include path.

#include <kvoffload/device_runtime.hpp>

#include <memory>

namespace kvoffload::detail {

// host backend: core/src/transfer/host_runtime.cpp (always built).
std::unique_ptr<DeviceRuntime> make_host_runtime(const RuntimeOptions& options);
BackendInfo probe_host();

// cuda backend: cuda/src/. make_* throws Error(kNotAvailable) when no device is usable (message
// says why, e.g. the cudaGetDeviceCount error), Error(kDevice) for other runtime failures.
// probe_* never throws: device_count 0 and the reason in detail when unusable; built = true.
std::unique_ptr<DeviceRuntime> make_cuda_runtime(const RuntimeOptions& options);
BackendInfo probe_cuda();

// hip backend: hip/src/. Same contract.
std::unique_ptr<DeviceRuntime> make_hip_runtime(const RuntimeOptions& options);
BackendInfo probe_hip();

}  // namespace kvoffload::detail
