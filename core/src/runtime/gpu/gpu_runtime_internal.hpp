#pragma once
// What the pieces of the GPU runtime share: handle and kind conversions, a logger that never
// throws, the relaxed-capture scope (Note [Registration during capture] in gpu_registration.cpp)
// and the device guard (Note [Device guard] in gpu_runtime.cpp). Internal to runtime/gpu/.
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <utility>

#include "runtime/gpu/gpu_runtime.hpp"
#include "util/log.hpp"

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

// Note [Thread-local capture mode]
// Event queries and synchronizes, stream synchronizes and elapsed-time reads are "potentially
// unsafe" during stream capture: PyTorch's caching allocator skips its cudaEventQuery calls while
// any capture is underway for that reason, and the simulated device classes them so. Under the
// default mode an engine's poll or wait on a thread of its own would then invalidate a CUDA graph
// the model captures on another thread. CUDA 13's cuda_runtime_api.h,
// cudaThreadExchangeStreamCaptureMode, gives the rules: "cudaStreamCaptureModeGlobal: ... If the
// local thread has an ongoing capture sequence that was not initiated with
// cudaStreamCaptureModeRelaxed ..., or if any other thread has a concurrent capture sequence
// initiated with cudaStreamCaptureModeGlobal, this thread is prohibited from potentially unsafe
// API calls"; "cudaStreamCaptureModeThreadLocal: If the local thread has an ongoing capture
// sequence not initiated with cudaStreamCaptureModeRelaxed, it is prohibited from potentially
// unsafe API calls. Concurrent capture sequences in other threads are ignored"; Relaxed: "not
// prohibited ... still prohibited from API calls which necessarily conflict with stream capture,
// for example, attempting cudaEventQuery on an event that was last recorded inside a capture
// sequence". So these calls run with the thread in ThreadLocal mode: other threads' captures no
// longer see them, while a capture of the calling thread itself still refuses them (as it should:
// that is the caller's own mistake, and the mode does not hide it). A thread the caller put in
// Relaxed mode stays Relaxed, which prohibits less than ThreadLocal; ThreadLocal over Global only
// ever prohibits less. The previous mode is restored at the end of the scope (the push-pop use
// the header recommends).
class ThreadLocalCapture {
 public:
  explicit ThreadLocalCapture(const VendorApi& api) noexcept : api_(api) {
    exchanged_ = api_.exchange_capture_mode(api_.ctx, &mode_, 0) == 0;  // mode_: the previous
    if (!exchanged_) {
      (void)api_.get_last_error(api_.ctx);
    } else if (mode_ == kCaptureModeRelaxed) {
      // Relaxed already allows more than ThreadLocal: put it back, nothing to restore later.
      int relaxed = kCaptureModeRelaxed;
      (void)api_.exchange_capture_mode(api_.ctx, &relaxed, 0);
      exchanged_ = false;
    }
  }
  ~ThreadLocalCapture() {
    if (exchanged_) (void)api_.exchange_capture_mode(api_.ctx, &mode_, 0);
  }
  ThreadLocalCapture(const ThreadLocalCapture&) = delete;
  ThreadLocalCapture& operator=(const ThreadLocalCapture&) = delete;

 private:
  const VendorApi& api_;
  int mode_ = kCaptureModeThreadLocal;  // what the scope sets; then the mode it replaced
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
