#pragma once
// Errors in kvoffload are exceptions of one type, kvoffload::Error, thrown at the point of failure
// and never rewritten on the way up: the message of the step that failed is what the caller sees.
// Teardown paths never throw; they record the first failure and finish every step
// (docs/DESIGN.md §8.1).

#include <cerrno>
#include <stdexcept>
#include <string>
#include <string_view>

#include <kvoffload/error_codes.h>
#include <kvoffload/export.h>

namespace kvoffload {

// Stable numeric codes, listed once in error_codes.h (with the C API's kvo_status and Python's
// ErrorCode): the C API returns these values, so never renumber them.
enum class ErrorCode : int {
#define KVOFFLOAD_ERROR_CODE_ENUMERATOR_(value, upper, camel, name) k##camel = (value),
  KVOFFLOAD_ERROR_CODES(KVOFFLOAD_ERROR_CODE_ENUMERATOR_)
#undef KVOFFLOAD_ERROR_CODE_ENUMERATOR_
};

// Number of codes: they are 0 .. kErrorCodeCount - 1.
inline constexpr int kErrorCodeCount = KVOFFLOAD_ERROR_CODE_COUNT;

// Name of the code, e.g. "invalid_argument"; stable, used in JSON output; "unknown" for a value
// outside the list.
KVOFFLOAD_API std::string_view to_string(ErrorCode code) noexcept;

// Symbolic errno name ("ENOSPC"), or "errno N" for unknown values.
KVOFFLOAD_API std::string errno_name(int err);
// "<call>: <description> (<ENAME>)", e.g. "open /x: No such file or directory (ENOENT)": how every
// message of kvoffload words a failed system call. Thread-safe and locale-independent (unlike
// strerror).
KVOFFLOAD_API std::string errno_text(std::string_view call, int err);

class KVOFFLOAD_API Error : public std::runtime_error {
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

// Throws a kSystem error whose message is errno_text("<call> <context>", err).
[[noreturn]] KVOFFLOAD_API void throw_system_error(std::string_view call, int err,
                                                   std::string_view context);

// Throws kInvalidArgument with the message as given.
[[noreturn]] KVOFFLOAD_API void throw_invalid(std::string message);

}  // namespace kvoffload
