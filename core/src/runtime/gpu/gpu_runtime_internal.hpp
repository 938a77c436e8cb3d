#pragma once
// What the pieces of the GPU runtime share: handle and kind conversions, a logger that never
// throws, the relaxed-capture scope (Note [Registration during capture] in gpu_registration.cpp)
// and the device guard (Note [Device guard] in gpu_runtime.cpp). Internal to runtime/gpu/.
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <utility>

#include <kvoffload/log.hpp>

#include "runtime/gpu/gpu_runtime.hpp"

namespace kvoffload::gpu {

inline void* to_ptr(std::uintptr_t handle) noexcept {
  return reinterpret_cast<void*>(handle);
}

inline std::string range_string(const void* ptr, std::size_t bytes) {
  return fmt::format("[{}, +{} bytes)", ptr, bytes);
}

// Logs without letting a logging failure escape (teardown and after-success paths).
template <typename... Args>
void log_noexcept(spdlog::level::level_enum level, fmt::format_string<Args...> fmt,
                  Args&&... args) noexcept {
  try {
    log().log(level, fmt, std::forward<Args>(args)...);
  } catch (...) {
    // logging must not undo or stop what it reports
  }
}

// Switches this thread to relaxed stream-capture mode for the scope (Note [Registration during
// capture] in gpu_registration.cpp).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const VendorApi& api) noexcept : api_(api) {
    exchanged_ = api_.exchange_capture_mode(api_.ctx, &mode_, 1) == 0;
    if (!exchanged_) (void)api_.get_last_error(api_.ctx);
  }
  ~RelaxedCapture() {
    if (exchanged_) (void)api_.exchange_capture_mode(api_.ctx, &mode_, 0);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const VendorApi& api_;
  int mode_ = 0;
  bool exchanged_ = false;
};

// Makes the runtime's device current on this thread for the scope; restores the device the
// thread had chosen, if any (Note [Device guard] in gpu_runtime.cpp).
class GpuRuntime::Guard {
 public:
  Guard(const VendorApi& api, int device);
  // For teardown paths: a failure is logged, and the call goes on (and reports its own error).
  Guard(const VendorApi& api, int device, std::nothrow_t /*unused*/) noexcept;
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  int bind(int device) noexcept;

  const VendorApi& api_;
  int previous_ = -1;
  void* foreign_ = nullptr;  // the thread's own non-primary context, given back at the end
};

}  // namespace kvoffload::gpu
