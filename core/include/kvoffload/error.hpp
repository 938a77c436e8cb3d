#pragma once
// Errors in kvoffload are exceptions of one type, kvoffload::Error, thrown at the point of failure
// and never rewritten on the way up: the message of the step that failed is what the caller sees.
// Teardown paths never throw; they record the first failure and finish every step (see Note
// [Teardown keeps going] in DESIGN notes of the README).

#include <cerrno>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvoffload {

// Stable numeric codes: the C API returns these values, so never renumber them.
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // bad input from the caller; nothing was touched
  kCapacity = 2,          // not enough shared memory / space for what was asked
  kSystem = 3,            // a system call failed (errno is set)
  kTimeout = 4,           // waited too long for another process
  kMismatch = 5,          // an existing object disagrees with what the caller expects
  kPermission = 6,        // ownership or mode refused
  kNotAvailable = 7,      // a backend/feature not built or no device
  kDevice = 8,            // the device runtime reported an error
  kTransferFailed = 9,    // a copy job failed
  kNotFound = 10,         // a key, job or file that does not exist
  kState = 11,            // an operation not valid in the object's current state
  kInternal = 12,         // a bug: an invariant did not hold
};

// Name of the code, e.g. "invalid_argument"; stable, used in JSON output.
std::string_view error_code_name(ErrorCode code) noexcept;

// Symbolic errno name ("ENOSPC"), or "errno N" for unknown values.
std::string errno_name(int err);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, int sys_errno = 0, std::string call = {});

  [[nodiscard]] ErrorCode code() const noexcept { return code_; }
  // errno of the failing system call, or 0 when none was involved.
  [[nodiscard]] int sys_errno() const noexcept { return errno_; }
  // Name of the failing call ("fallocate", "cudaHostRegister"), or empty.
  [[nodiscard]] const std::string& call() const noexcept { return call_; }

 private:
  ErrorCode code_;
  int errno_;
  std::string call_;
};

// Throws a kSystem error whose message reads "<call> <context>: <strerror> (<ENAME>)".
[[noreturn]] void throw_system_error(std::string_view call, int err, std::string_view context);

// Throws kInvalidArgument with the message as given.
[[noreturn]] void throw_invalid(std::string message);

}  // namespace kvoffload
