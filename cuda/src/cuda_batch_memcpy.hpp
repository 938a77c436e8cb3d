#pragma once
// Batched DMA through the driver's cuMemcpyBatchAsync, resolved at run time.
//
// Note [Resolving cuMemcpyBatchAsync]
// - The symbol exists from CUDA 12.8. CUDA 12.8/12.9 take 9 arguments (a size_t* failIdx before
//   the stream); CUDA 13 takes 8. Calling one through the other's type passes the stream in the
//   wrong slot, so the ABI is chosen by the version we ask the driver for: the driver's own
//   version, capped to the two signatures we know (12080 or 13000), and the pointer is cast to
//   exactly that version's type.
// - It is resolved through the runtime's cudaGetDriverEntryPointByVersion (cuGetProcAddress), not
//   dlsym: a process can hold several copies of libcudart (torch wheels bring their own), while
//   the driver is one, and this asks it directly for the legacy-stream variant.
// - The legacy default stream is rejected by the driver; callers pass a created stream (the
//   runtime falls back to the per-copy loop for stream 0 / cudaStreamLegacy).
// - Source access order: STREAM for device-to-host (the KV source is written in stream order by
//   the model), ANY only for host-to-device (the host slot is stable while a load runs).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvoffload::cuda {

class BatchMemcpy {
 public:
  enum class SourceOrder : std::uint8_t { kStream, kAny };

  // Resolves the entry point for the current driver. Never throws: when unavailable, available()
  // is false and detail() says why.
  static BatchMemcpy resolve() noexcept;

  [[nodiscard]] bool available() const noexcept { return fn_ != nullptr; }
  // "cuMemcpyBatchAsync (CUDA 13 signature)" or the reason it is not used.
  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

  // Enqueues count copies (dsts[i] <- srcs[i], sizes[i] bytes) on `stream` (never the legacy
  // default stream). Returns the driver's CUresult as an int (0 = success); on failure
  // *fail_index is the copy the driver refused, or SIZE_MAX when it did not say.
  int enqueue(std::uint64_t* dsts, std::uint64_t* srcs, std::size_t* sizes, std::size_t count,
              SourceOrder order, cudaStream_t stream, std::size_t* fail_index) const noexcept;

  // "CUDA_ERROR_INVALID_VALUE: invalid argument (driver error 1)".
  [[nodiscard]] std::string error_string(int result) const;

 private:
  enum class Abi : std::uint8_t { kNone, kCuda12080, kCuda13000 };
  void* fn_ = nullptr;
  void* get_error_name_ = nullptr;
  void* get_error_string_ = nullptr;
  Abi abi_ = Abi::kNone;
  std::string detail_;
};

}  // namespace kvoffload::cuda
