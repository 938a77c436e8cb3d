#pragma once
// Host-side entry points of the device copy kernels. No CUDA/HIP types: streams are void*.
#include <cstddef>
#include <cstdint>

namespace kvoffload::kernels {

// Returns 0 on success, else the runtime's error code of the launch.
int launch_copy_probe(void* stream);

}  // namespace kvoffload::kernels
