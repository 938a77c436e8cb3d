#pragma once
// Shared plumbing of the C API: the thread-local last error and the guard that turns every C++
// exception into a kvo_status, so no exception crosses the C boundary.

#include <cstring>
#include <string>
#include <type_traits>

#include <kvoffload/error.hpp>
#include <kvoffload/kvoffload.h>

namespace kvoffload::capi {

// The integer a C caller stored in an enum-typed field or argument. C lets any int of the
// underlying type through; in C++ reading an enum object whose value is outside its range is
// undefined (UBSan flags it), so validation reads the bytes as the underlying integer first.
template <typename Enum>
inline auto enum_value(const Enum& value) noexcept {
  std::underlying_type_t<Enum> raw;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

// Records an error for kvo_last_error_*(); never throws (falls back to a static message when the
// copy cannot be allocated). Returns the status to hand to the caller.
kvo_status set_last_error(kvo_status code, const char* message, int sys_errno = 0,
                          const char* call = "") noexcept;
kvo_status set_last_error(const Error& error) noexcept;

// Throws kInvalidArgument "<function>: argument '<name>' is NULL" when ptr is null.
inline void require_arg(const void* ptr, const char* function, const char* name) {
  if (ptr == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(function) + ": argument '" + name + "' is NULL");
  }
}
[[noreturn]] inline void invalid_arg(const char* function, const char* name,
                                     const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(function) + ": argument '" + name + "' " + why);
}

// Runs `body`, mapping exceptions to a status. kvoffload::Error keeps its code, errno and call;
// std::bad_alloc becomes KVO_SYSTEM/ENOMEM; anything else is KVO_INTERNAL.
template <class Body>
kvo_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return KVO_OK;
  } catch (const Error& e) {
    return set_last_error(e);
  } catch (const std::bad_alloc&) {
    return set_last_error(KVO_SYSTEM, "out of memory", ENOMEM, function);
  } catch (const std::exception& e) {
    return set_last_error(KVO_INTERNAL, e.what(), 0, function);
  } catch (...) {
    return set_last_error(KVO_INTERNAL, "unknown exception", 0, function);
  }
}

}  // namespace kvoffload::capi

// KVO_ARG(p): the NULL check with the calling function's name and the argument's spelling.
// Used inside guarded() lambdas, which capture the C function's name as `fn` (in a lambda,
// __func__ would be "operator()").
#define KVO_ARG(p) ::kvoffload::capi::require_arg((p), fn, #p)
