#include "hip_check.hpp"

namespace kvoffload::hip {

std::string describe(hipError_t err) {
  std::string msg = hipGetErrorName(err);
  msg += ": ";
  msg += hipGetErrorString(err);
  msg += " (hip error " + std::to_string(static_cast<int>(err)) + ")";
  return msg;
}

void throw_hip(hipError_t err, std::string_view call, std::string_view context) {
  (void)hipGetLastError();
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
  check_hip(hipGetDevice(&current), "hipGetDevice");
  if (current != device) {
    check_hip(hipSetDevice(device), "hipSetDevice", "device " + std::to_string(device));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) {
    (void)hipSetDevice(previous_);  // restoring a device that was valid a moment ago
  }
}

RelaxedCaptureMode::RelaxedCaptureMode() noexcept {
  hipStreamCaptureMode mode = hipStreamCaptureModeRelaxed;
  exchanged_ = hipThreadExchangeStreamCaptureMode(&mode) == hipSuccess;
  if (exchanged_) {
    previous_ = mode;
  } else {
    (void)hipGetLastError();
  }
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (exchanged_) {
    hipStreamCaptureMode mode = previous_;
    (void)hipThreadExchangeStreamCaptureMode(&mode);
  }
}

}  // namespace kvoffload::hip
