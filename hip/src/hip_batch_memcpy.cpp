// See Note [Resolving hipMemcpyBatchAsync] in hip_batch_memcpy.hpp.
#include "hip_batch_memcpy.hpp"

#include "hip_check.hpp"
#include "util/version_text.hpp"

#include <dlfcn.h>

#include <cstdint>

namespace kvoffload::hip {

namespace {

// ROCm 7.1's signature; attrs is a hipMemcpyAttributes* that we always pass as nullptr, spelt
// void* so that old headers without the type still compile.
using BatchFn = hipError_t (*)(void** dsts, void** srcs, std::size_t* sizes, std::size_t count,
                               void* attrs, std::size_t* attrs_idxs, std::size_t num_attrs,
                               std::size_t* fail_idx, hipStream_t stream);

constexpr int kFirstVersion = 70100000;    // HIP 7.1: HIP_VERSION encoding major*1e7 + minor*1e5
constexpr int kNextUnknownMajor = 80000000;

using util::hip_version_string;

}  // namespace

BatchMemcpy BatchMemcpy::resolve() noexcept {
  BatchMemcpy out;
  try {
    int runtime = 0;
    if (const hipError_t err = hipRuntimeGetVersion(&runtime); err != hipSuccess) {
      (void)hipGetLastError();
      out.detail_ = "per-copy loop: hipRuntimeGetVersion failed: " + describe(err);
      return out;
    }
    if (runtime < kFirstVersion) {
      out.detail_ = "per-copy loop: HIP runtime " + hip_version_string(runtime) +
                    " has no hipMemcpyBatchAsync (needs 7.1 or later)";
      return out;
    }
    if (runtime >= kNextUnknownMajor) {
      out.detail_ = "per-copy loop: hipMemcpyBatchAsync's signature is verified for HIP 7.x only, "
                    "runtime is " + hip_version_string(runtime);
      return out;
    }
    void* fn = ::dlsym(RTLD_DEFAULT, "hipMemcpyBatchAsync");
    if (fn == nullptr) {
      out.detail_ = "per-copy loop: HIP runtime " + hip_version_string(runtime) +
                    " does not export hipMemcpyBatchAsync";
      return out;
    }
    out.fn_ = fn;
    out.detail_ = "hipMemcpyBatchAsync (HIP " + hip_version_string(runtime) + ", no attributes)";
  } catch (...) {
    out.fn_ = nullptr;  // only std::string can throw here (out of memory); keep the loop path
  }
  return out;
}

int BatchMemcpy::enqueue(void** dsts, void** srcs, std::size_t* sizes, std::size_t count,
                         hipStream_t stream, std::size_t* fail_index) const noexcept {
  *fail_index = SIZE_MAX;
  if (fn_ == nullptr) {
    return static_cast<int>(hipErrorNotSupported);
  }
  return static_cast<int>(reinterpret_cast<BatchFn>(fn_)(dsts, srcs, sizes, count, nullptr, nullptr,
                                                         0, fail_index, stream));
}

std::string BatchMemcpy::error_string(int result) const {
  return describe(static_cast<hipError_t>(result));
}

}  // namespace kvoffload::hip
