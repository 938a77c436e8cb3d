#pragma once
// The test seam of OffloadStack::build and OffloadWorker::build (Note [Initialisation failures] in
// kvoffload/offload_stack.hpp): internal, so an engine's include path does not show it. Suites
// that use it link the library's objects (INTERNAL).

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/file_tier.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/remote_tier.hpp>
#include <kvoffload/tier.hpp>

namespace kvoffload {

struct InitHooks {
  // Called before each step; throwing from it fails that step (tests).
  std::function<void(InitStep step, std::size_t index)> before_step;
  // Factories; empty: the real ones (Region::create_or_join, FileTier::open, make_runtime).
  std::function<Region(const RegionOptions&)> make_region;
  std::function<std::unique_ptr<SecondaryTier>(const FileTierOptions&)> make_file_tier;
  std::function<std::unique_ptr<SecondaryTier>(const RemoteTierOptions&)> make_remote_tier;
  std::function<std::unique_ptr<DeviceRuntime>(std::string_view, const RuntimeOptions&)>
      make_runtime;
  // Called by close() right after each resource is released (also on a failed build), so tests
  // can record the release order. Kept by the built object; must not throw.
  std::function<void(InitStep step, std::size_t index)> after_release;
};

}  // namespace kvoffload
