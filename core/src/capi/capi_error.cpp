// The C API's error state and the functions that do not belong to one object.
#include "capi/capi_internal.hpp"

#include <kvoffload/version.hpp>

#include <cerrno>
#include <new>
#include <string>

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
    e.fallback = "kvoffload: an error occurred, and its message could not be stored (out of memory)";
  }
  return code;
}

kvo_status set_last_error(const Error& error) noexcept {
  return set_last_error(static_cast<kvo_status>(error.code()), error.what(), error.sys_errno(),
                        error.call().c_str());
}

}  // namespace kvoffload::capi


// The enum values are the C API's codes: a renumbering on either side must fail the build.
static_assert(KVO_INVALID_ARGUMENT == static_cast<int>(kvoffload::ErrorCode::kInvalidArgument));
static_assert(KVO_SYSTEM == static_cast<int>(kvoffload::ErrorCode::kSystem));
static_assert(KVO_NOT_AVAILABLE == static_cast<int>(kvoffload::ErrorCode::kNotAvailable));
static_assert(KVO_TRANSFER_FAILED == static_cast<int>(kvoffload::ErrorCode::kTransferFailed));
static_assert(KVO_INTERNAL == static_cast<int>(kvoffload::ErrorCode::kInternal));

extern "C" {

const char* kvo_last_error_message(void) {
  const auto& e = kvoffload::capi::last_error();
  return e.fallback != nullptr ? e.fallback : e.message.c_str();
}
kvo_status kvo_last_error_code(void) { return kvoffload::capi::last_error().code; }
int kvo_last_error_errno(void) { return kvoffload::capi::last_error().sys_errno; }
const char* kvo_last_error_call(void) { return kvoffload::capi::last_error().call.c_str(); }

const char* kvo_status_name(kvo_status status) {
  // error_code_name returns views of string literals, so .data() is NUL-terminated.
  if (status < KVO_OK || status > KVO_INTERNAL) return "unknown";
  return kvoffload::error_code_name(static_cast<kvoffload::ErrorCode>(status)).data();
}

const char* kvo_version(void) { return KVOFFLOAD_VERSION_STRING; }

}  // extern "C"
