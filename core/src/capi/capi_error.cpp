// The C API's error state and the functions that do not belong to one object.
#include <cerrno>
#include <new>
#include <string>

#include <kvoffload/version.hpp>

#include "capi/capi_internal.hpp"

namespace kvoffload::capi {
namespace {

struct LastError {
  kvo_status code = KVO_OK;
  int sys_errno = 0;
  std::string message;
  std::string call;
  // When copying the message failed (out of memory) we still answer something true.
  const char* fallback = nullptr;
};

LastError& last_error() noexcept {
  thread_local LastError error;
  return error;
}

}  // namespace

kvo_status set_last_error(kvo_status code, const char* message, int sys_errno,
                          const char* call) noexcept {
  LastError& e = last_error();
  e.code = code;
  e.sys_errno = sys_errno;
  try {
    e.message = message != nullptr ? message : "";
    e.call = call != nullptr ? call : "";
    e.fallback = nullptr;
  } catch (...) {
    e.message.clear();
    e.call.clear();
    e.fallback =
        "kvoffload: an error occurred, and its message could not be stored (out of memory)";
  }
  return code;
}

kvo_status set_last_error(const Error& error) noexcept {
  return set_last_error(static_cast<kvo_status>(error.code()), error.what(), error.sys_errno(),
                        error.call().c_str());
}

}  // namespace kvoffload::capi

// Both enums are generated from error_codes.h; this checks that the C++ side and the C side read
// the list the same way (a hand-written enumerator on either side would fail here).
#define KVO_SAME_CODE_(value, upper, camel, name) \
  static_assert(KVO_##upper == (value) &&         \
                static_cast<int>(kvoffload::ErrorCode::k##camel) == (value));
KVOFFLOAD_ERROR_CODES(KVO_SAME_CODE_)
#undef KVO_SAME_CODE_

extern "C" {

const char* kvo_last_error_message(void) {
  const auto& e = kvoffload::capi::last_error();
  return e.fallback != nullptr ? e.fallback : e.message.c_str();
}
kvo_status kvo_last_error_code(void) {
  return kvoffload::capi::last_error().code;
}
int kvo_last_error_errno(void) {
  return kvoffload::capi::last_error().sys_errno;
}
const char* kvo_last_error_call(void) {
  return kvoffload::capi::last_error().call.c_str();
}

const char* kvo_status_name(kvo_status status) {
  // to_string(ErrorCode) returns views of string literals, so .data() is NUL-terminated.
  if (status < 0 || status >= KVOFFLOAD_ERROR_CODE_COUNT) return "unknown";
  return kvoffload::to_string(static_cast<kvoffload::ErrorCode>(status)).data();
}

const char* kvo_version(void) {
  return KVOFFLOAD_VERSION_STRING;
}

}  // extern "C"
