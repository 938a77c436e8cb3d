#pragma once
// Factory functions of the backends; make_runtime() / list_backends() (device_runtime.cpp) call
// them. No CUDA/HIP types here.

#include <memory>
#include <string_view>

#include <kvoffload/device_runtime.hpp>

namespace kvoffload::gpu::sim {
class SimDevice;
}

namespace kvoffload::detail {

// host backend: core/src/runtime/host_runtime.cpp (always built).
std::unique_ptr<DeviceRuntime> make_host_runtime(const RuntimeOptions& options);
BackendInfo probe_host();

// sim backend: the GPU runtime over a simulated device (core/src/runtime/sim; always built).
// Without `device`, the process-wide default device (KVOFFLOAD_SIM_DEVICES devices, default 1).
std::unique_ptr<DeviceRuntime> make_sim_runtime(const RuntimeOptions& options,
                                                std::shared_ptr<gpu::sim::SimDevice> device = {});
BackendInfo probe_sim();

// cuda / hip: the GPU runtime over the vendor table of the module libkvoffload_<name>.so, loaded
// on first use (core/src/runtime/gpu/backend_modules.cpp). make_* throws Error(kNotAvailable) when
// the module is not built or cannot load (its runtime library missing), or no device is usable (the
// message says why); Error(kDevice) for other runtime failures. probe_* never throws.
std::unique_ptr<DeviceRuntime> make_vendor_runtime(std::string_view name,
                                                   const RuntimeOptions& options);
BackendInfo probe_vendor(std::string_view name);

}  // namespace kvoffload::detail
