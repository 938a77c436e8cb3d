#include "kvoffload/error.hpp"

#include <cstring>
#include <utility>

namespace kvoffload {

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kCapacity: return "capacity";
    case ErrorCode::kSystem: return "system";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kPermission: return "permission";
    case ErrorCode::kNotAvailable: return "not_available";
    case ErrorCode::kDevice: return "device";
    case ErrorCode::kTransferFailed: return "transfer_failed";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kState: return "state";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string errno_name(int err) {
  // strerrorname_np is glibc >= 2.32 (Debian 12 has 2.36).
  if (const char* name = strerrorname_np(err)) return name;
  return "errno " + std::to_string(err);
}

Error::Error(ErrorCode code, std::string message, int sys_errno, std::string call)
    : std::runtime_error(std::move(message)), code_(code), errno_(sys_errno), call_(std::move(call)) {}

void throw_system_error(std::string_view call, int err, std::string_view context) {
  std::string msg(call);
  if (!context.empty()) {
    msg += ' ';
    msg += context;
  }
  msg += ": ";
  msg += strerrordesc_np(err) != nullptr ? strerrordesc_np(err) : "unknown error";
  msg += " (" + errno_name(err) + ")";
  throw Error(ErrorCode::kSystem, std::move(msg), err, std::string(call));
}

void throw_invalid(std::string message) {
  throw Error(ErrorCode::kInvalidArgument, std::move(message));
}

}  // namespace kvoffload
