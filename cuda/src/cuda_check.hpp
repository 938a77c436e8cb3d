#pragma once
// Error helpers of the CUDA backend: every failing runtime call becomes a kvoffload::Error of code
// kDevice whose message names the call, what it was doing, and the runtime's error name and
// string; Error::call() is the call's name.
#include <kvoffload/error.hpp>

#include <cuda_runtime.h>

#include <string>
#include <string_view>

namespace kvoffload::cuda {

// "cudaErrorMemoryAllocation: out of memory (cuda error 2)".
std::string describe(cudaError_t err);

// Throws Error(kDevice, "<call> <context>: <describe(err)>", 0, call). Clears the thread's last
// (non-sticky) error first, so a handled failure does not resurface from a later, unrelated call.
[[noreturn]] void throw_cuda(cudaError_t err, std::string_view call, std::string_view context);

// Throws on anything but cudaSuccess.
inline void check_cuda(cudaError_t err, std::string_view call, std::string_view context = {}) {
  if (err != cudaSuccess) {
    throw_cuda(err, call, context);
  }
}

// Makes `device` current for the scope and restores the caller's device after: the engine's
// threads have their own current device and the backend must not change it behind their back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// Switches this thread to cudaStreamCaptureModeRelaxed for the scope. Calls that are "unsafe"
// during stream capture (cudaHostRegister, cudaMalloc, cudaFree, ...) made in the default global
// mode would invalidate a CUDA graph that the engine is capturing on another thread; in relaxed
// mode they are allowed and leave the capture alone (see Note [Registration during capture]).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept;
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

}  // namespace kvoffload::cuda
