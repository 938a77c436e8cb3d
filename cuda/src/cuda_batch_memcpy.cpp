// See Note [Resolving cuMemcpyBatchAsync] in cuda_batch_memcpy.hpp.
#include "cuda_batch_memcpy.hpp"

#include <cuda.h>

#include <cstdint>

namespace kvoffload::cuda {

namespace {

#if CUDART_VERSION >= 12080
// The two published signatures (cudaTypedefs.h: PFN_cuMemcpyBatchAsync_v12080 / _v13000), spelt
// out here so that building against 12.8 headers still knows the 13.0 one.
using BatchFn12080 = CUresult(CUDAAPI*)(CUdeviceptr* dsts, CUdeviceptr* srcs, std::size_t* sizes,
                                        std::size_t count, CUmemcpyAttributes* attrs,
                                        std::size_t* attrs_idxs, std::size_t num_attrs,
                                        std::size_t* fail_idx, CUstream stream);
using BatchFn13000 = CUresult(CUDAAPI*)(CUdeviceptr* dsts, CUdeviceptr* srcs, std::size_t* sizes,
                                        std::size_t count, CUmemcpyAttributes* attrs,
                                        std::size_t* attrs_idxs, std::size_t num_attrs,
                                        CUstream stream);
static_assert(sizeof(CUdeviceptr) == sizeof(std::uint64_t), "CUdeviceptr is 64-bit");
#endif
using GetErrorFn = CUresult(CUDAAPI*)(CUresult error, const char** str);

// Asks the driver for `symbol` as it was at CUDA `version`. nullptr when it has none.
void* entry_point(const char* symbol, unsigned version) noexcept {
  void* fn = nullptr;
#if CUDART_VERSION >= 12050
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableLegacyStream, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
#else
  (void)symbol;
  (void)version;
#endif
  return fn;
}

}  // namespace

BatchMemcpy BatchMemcpy::resolve() noexcept {
  BatchMemcpy out;
  try {
#if CUDART_VERSION < 12080
    out.detail_ = "per-copy loop: built against CUDA " + std::to_string(CUDART_VERSION) +
                  ", cuMemcpyBatchAsync needs headers of CUDA 12.8 or later";
    return out;
#else
    int driver = 0;
    if (const cudaError_t err = cudaDriverGetVersion(&driver); err != cudaSuccess) {
      (void)cudaGetLastError();
      out.detail_ = std::string("per-copy loop: cudaDriverGetVersion failed: ") +
                    cudaGetErrorName(err);
      return out;
    }
    if (driver < 12080) {
      out.detail_ = "per-copy loop: driver " + std::to_string(driver) +
                    " has no cuMemcpyBatchAsync (needs 12.8 or later)";
      return out;
    }
    const unsigned version = driver >= 13000 ? 13000u : 12080u;
    void* fn = entry_point("cuMemcpyBatchAsync", version);
    if (fn == nullptr) {
      out.detail_ = "per-copy loop: the driver did not resolve cuMemcpyBatchAsync at version " +
                    std::to_string(version);
      return out;
    }
    out.fn_ = fn;
    out.abi_ = version >= 13000 ? Abi::kCuda13000 : Abi::kCuda12080;
    out.get_error_name_ = entry_point("cuGetErrorName", version);
    out.get_error_string_ = entry_point("cuGetErrorString", version);
    out.detail_ = version >= 13000 ? "cuMemcpyBatchAsync (CUDA 13 signature, 8 arguments)"
                                   : "cuMemcpyBatchAsync (CUDA 12.8 signature, 9 arguments)";
#endif
  } catch (...) {
    // Only std::string can throw here (out of memory); keep the loop path.
    out.fn_ = nullptr;
    out.abi_ = Abi::kNone;
  }
  return out;
}

int BatchMemcpy::enqueue(std::uint64_t* dsts, std::uint64_t* srcs, std::size_t* sizes,
                         std::size_t count, SourceOrder order, cudaStream_t stream,
                         std::size_t* fail_index) const noexcept {
  *fail_index = SIZE_MAX;
#if CUDART_VERSION >= 12080
  CUmemcpyAttributes attr = {};  // location hints unused: neither side is managed memory
  attr.srcAccessOrder = order == SourceOrder::kStream ? CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
                                                      : CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
  attr.flags = CU_MEMCPY_FLAG_DEFAULT;
  std::size_t attr_idx = 0;  // the one attribute applies to every copy
  auto* d = reinterpret_cast<CUdeviceptr*>(dsts);
  auto* s = reinterpret_cast<CUdeviceptr*>(srcs);
  switch (abi_) {
    case Abi::kCuda13000:
      return static_cast<int>(reinterpret_cast<BatchFn13000>(fn_)(d, s, sizes, count, &attr,
                                                                  &attr_idx, 1, stream));
    case Abi::kCuda12080:
      return static_cast<int>(reinterpret_cast<BatchFn12080>(fn_)(d, s, sizes, count, &attr,
                                                                  &attr_idx, 1, fail_index, stream));
    case Abi::kNone:
      break;
  }
#else
  (void)dsts;
  (void)srcs;
  (void)sizes;
  (void)count;
  (void)order;
  (void)stream;
#endif
  return static_cast<int>(CUDA_ERROR_NOT_SUPPORTED);
}

std::string BatchMemcpy::error_string(int result) const {
  const auto res = static_cast<CUresult>(result);
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name_ != nullptr) {
    (void)reinterpret_cast<GetErrorFn>(get_error_name_)(res, &name);
  }
  if (get_error_string_ != nullptr) {
    (void)reinterpret_cast<GetErrorFn>(get_error_string_)(res, &text);
  }
  std::string msg = name != nullptr ? name : "CUresult";
  if (text != nullptr) {
    msg += ": ";
    msg += text;
  }
  msg += " (driver error " + std::to_string(result) + ")";
  return msg;
}

}  // namespace kvoffload::cuda
