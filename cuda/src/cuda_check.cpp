#include "cuda_check.hpp"

namespace kvoffload::cuda {

std::string describe(cudaError_t err) {
  std::string msg = cudaGetErrorName(err);
  msg += ": ";
  msg += cudaGetErrorString(err);
  msg += " (cuda error " + std::to_string(static_cast<int>(err)) + ")";
  return msg;
}

void throw_cuda(cudaError_t err, std::string_view call, std::string_view context) {
  (void)cudaGetLastError();
  std::string msg(call);
  if (!context.empty()) {
    msg += ' ';
    msg += context;
  }
  msg += ": ";
  msg += describe(err);
  throw Error(ErrorCode::kDevice, std::move(msg), 0, std::string(call));
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice", "device " + std::to_string(device));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) {
    (void)cudaSetDevice(previous_);  // restoring a device that was valid a moment ago
  }
}

RelaxedCaptureMode::RelaxedCaptureMode() noexcept {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  exchanged_ = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  if (exchanged_) {
    previous_ = mode;
  } else {
    (void)cudaGetLastError();
  }
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (exchanged_) {
    cudaStreamCaptureMode mode = previous_;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
  }
}

}  // namespace kvoffload::cuda
