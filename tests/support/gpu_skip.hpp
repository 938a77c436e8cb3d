#pragma once
// When a GPU case may skip (Note [Not built vs not loadable] in
// core/src/runtime/gpu/backend_modules.cpp). A gpu-labelled suite is compiled with
// KVOFFLOAD_TEST_BUILT_BACKENDS, the cuda/hip modules this build made. A case of a backend that
// was not built skips ("does not include it"); a case of a built backend skips only when the
// machine lacks its driver or device, and fails when the module itself cannot be found or loaded:
// that is a broken build or installation, and a GPU run that skipped over it would test nothing.
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "skip.hpp"

#ifndef KVOFFLOAD_TEST_BUILT_BACKENDS
#define KVOFFLOAD_TEST_BUILT_BACKENDS ""
#endif

namespace kvoffload::test {

inline bool backend_built(std::string_view name) {
  const std::string_view built = KVOFFLOAD_TEST_BUILT_BACKENDS;
  for (std::size_t pos = 0; pos <= built.size();) {
    std::size_t comma = built.find(',', pos);
    if (comma == std::string_view::npos) comma = built.size();
    if (built.substr(pos, comma - pos) == name) return true;
    pos = comma + 1;
  }
  return false;
}

// The loader's words for a module it could not use (backend_modules.cpp), as opposed to a driver
// or device that is missing.
inline bool module_fault(std::string_view what) {
  for (std::string_view phrase : {"does not include", "module could not be loaded", "exports no",
                                  "implements vendor table version"}) {
    if (what.find(phrase) != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace kvoffload::test

// In SetUp, for an Error(kNotAvailable) from make_runtime(backend): fail or skip as above.
#define KVO_SKIP_OR_FAIL_GPU(backend, what)                                                 \
  do {                                                                                      \
    if (::kvoffload::test::backend_built(backend) && ::kvoffload::test::module_fault(what)) \
      FAIL() << "the " << (backend)                                                         \
             << " backend was built but its module is unusable: " << (what);                \
    KVO_SKIP("no-gpu") << (what);                                                           \
  } while (0)
