#include <cstring>
#include <utility>

#include <kvoffload/error.hpp>

namespace kvoffload {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
#define KVOFFLOAD_ERROR_CODE_CASE_(value, upper, camel, name) \
  case ErrorCode::k##camel:                                   \
    return name;
    KVOFFLOAD_ERROR_CODES(KVOFFLOAD_ERROR_CODE_CASE_)
#undef KVOFFLOAD_ERROR_CODE_CASE_
  }
  return "unknown";
}

std::string errno_name(int err) {
  // strerrorname_np is glibc >= 2.32 (Debian 12 has 2.36).
  if (const char* name = strerrorname_np(err)) return name;
  return "errno " + std::to_string(err);
}

std::string errno_text(std::string_view call, int err) {
  std::string s(call);
  s += ": ";
  // strerrordesc_np (glibc >= 2.32) is strerror without the locale and the static buffer.
  const char* description = strerrordesc_np(err);
  s += description != nullptr ? description : "unknown error";
  s += " (" + errno_name(err) + ")";
  return s;
}

// std::runtime_error has no std::string&& constructor, so the message is copied once whatever the
// parameter type; taking it by value keeps error.hpp's signature (changing it is an ABI change).
// NOLINTNEXTLINE(performance-unnecessary-value-param)
Error::Error(ErrorCode code, std::string message, int sys_errno, std::string call)
    : std::runtime_error(message), code_(code), errno_(sys_errno), call_(std::move(call)) {}

void throw_system_error(std::string_view call, int err, std::string_view context) {
  std::string what(call);
  if (!context.empty()) {
    what += ' ';
    what += context;
  }
  throw Error(ErrorCode::kSystem, errno_text(what, err), err, std::string(call));
}

void throw_invalid(std::string message) {
  throw Error(ErrorCode::kInvalidArgument, std::move(message));
}

}  // namespace kvoffload
