#pragma once
// Timing helper shared by the library, the GPU backends and the `kvoffload` program (header-only,
// so the program can use it without the library exporting it).

#include <chrono>

namespace kvoffload::util {

// Seconds elapsed on the steady clock since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvoffload::util
