#pragma once
// "MAJOR.MINOR" of a runtime's packed version number, shared by the CUDA and HIP backends
// (header-only, so a backend module needs nothing else from core to use it).

#include <string>

namespace kvoffload::util {

// `encoded` is major * major_unit + minor * minor_unit + (patch below minor_unit).
inline std::string version_string(int encoded, int major_unit, int minor_unit) {
  return std::to_string(encoded / major_unit) + "." +
         std::to_string((encoded % major_unit) / minor_unit);
}

// CUDA_VERSION / cudaRuntimeGetVersion: major * 1000 + minor * 10 (12040 -> "12.4").
inline std::string cuda_version_string(int encoded) {
  return version_string(encoded, 1000, 10);
}

// HIP_VERSION / hipRuntimeGetVersion: major * 10000000 + minor * 100000 + patch
// (70151234 -> "7.1").
inline std::string hip_version_string(int encoded) {
  return version_string(encoded, 10000000, 100000);
}

}  // namespace kvoffload::util
