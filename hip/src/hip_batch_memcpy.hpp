#pragma once
// Batched DMA through hipMemcpyBatchAsync, resolved at run time.
//
// Note [Resolving hipMemcpyBatchAsync]
// - The symbol exists from ROCm 7.1 (HIP 7.1), with the CUDA 12.8 shape: 9 arguments, a size_t*
//   failIdx before the stream. It refuses memcpy attributes and is a loop of async copies inside
//   the runtime, so it saves call overhead, not copy engine work. Older ROCm (the 5.2 of Debian 12
//   included) has no such symbol: the per-copy hipMemcpyAsync loop is the path there.
// - It is looked up with dlsym in the libamdhip64 this library is linked to, so a build against old
//   headers still uses it on a newer runtime. The signature is trusted only on the HIP major that
//   published it (7.x): calling a future 8-argument variant through the 9-argument type would
//   pass the stream in the wrong slot, so another major falls back to the loop until verified.
// - No attributes (numAttrs 0), so there is no source access order to choose on HIP.
// - The null stream is never used for it (the runtime takes the loop there, as on CUDA).
#include <hip/hip_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvoffload::hip {

class BatchMemcpy {
 public:
  // Resolves the entry point for the loaded HIP runtime. Never throws: when unavailable,
  // available() is false and detail() says why.
  static BatchMemcpy resolve() noexcept;

  [[nodiscard]] bool available() const noexcept { return fn_ != nullptr; }
  // "hipMemcpyBatchAsync (HIP 7.x, no attributes)" or the reason it is not used.
  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

  // Enqueues count copies (dsts[i] <- srcs[i], sizes[i] bytes) on `stream` (never the null
  // stream). Returns the hipError_t as an int (0 = success); on failure *fail_index is the copy the
  // runtime refused, or SIZE_MAX when it did not say.
  int enqueue(void** dsts, void** srcs, std::size_t* sizes, std::size_t count, hipStream_t stream,
              std::size_t* fail_index) const noexcept;

  // "hipErrorInvalidValue: invalid argument (hip error 1)".
  [[nodiscard]] std::string error_string(int result) const;

 private:
  void* fn_ = nullptr;
  std::string detail_;
};

}  // namespace kvoffload::hip
