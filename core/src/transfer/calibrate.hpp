#pragma once
// Calibration of the copy paths (TransferEngine::calibrate): DMA against the copy kernel, per
// piece size and direction, on scratch buffers of its own.
#include <cstdint>
#include <functional>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/transfer_engine.hpp>

namespace kvoffload::detail {

// Measures both paths for stores, then loads, over `calibration_bytes` (at least 256 KiB) of
// scratch device and host memory (never the engine's slots), appending one point per piece size
// to report.points. After each direction, `apply` gets the direction and its kernel_below_bytes:
// twice the largest size up to which the kernel won at every size.
void calibrate_paths(DeviceRuntime& rt, std::uint64_t calibration_bytes, CalibrationReport& report,
                     const std::function<void(Direction, std::uint64_t)>& apply);

}  // namespace kvoffload::detail
