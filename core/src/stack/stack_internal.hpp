#pragma once
// What OffloadStack (offload_stack.cpp) and OffloadWorker (offload_worker.cpp) build with: the
// region options checked without touching a file, and the InitHooks calls of
// Note [Initialisation failures].

#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/offload_stack.hpp>

#include "stack/init_hooks.hpp"
#include "util/log.hpp"

namespace kvoffload::detail {

// The region options as Region::create_or_join checks them, without touching a file.
inline RegionGeometry validate_region(const RegionOptions& o) {
  const std::filesystem::path shm_dir = o.shm_dir.empty() ? default_shm_dir() : o.shm_dir;
  (void)region_path(shm_dir, o.engine_id);  // validates the engine id
  if (o.populate_threads == 0)
    throw_invalid("region: populate_threads is 0; it must be at least 1");
  if (o.join_timeout.count() < 0) {
    throw_invalid("region: join_timeout is " + std::to_string(o.join_timeout.count()) +
                  " ms; it must be >= 0");
  }
  const long page = ::sysconf(_SC_PAGESIZE);
  const RegionGeometry g =
      RegionGeometry::compute(o.layout, page > 0 ? static_cast<std::size_t>(page) : 4096);
  if (o.rank) (void)g.copy_index(*o.rank);
  return g;
}

inline void run_hook(const InitHooks& hooks, InitStep step, std::size_t index) {
  if (hooks.before_step) hooks.before_step(step, index);
}

// Reports one released resource to the test hook; a throwing hook must not stop the teardown.
inline void released(const std::function<void(InitStep, std::size_t)>& hook, InitStep step,
                     std::size_t index) noexcept {
  if (!hook) return;
  try {
    hook(step, index);
  } catch (...) {
    log().error("offload stack: after_release hook threw at {} #{}", to_string(step), index);
  }
}

inline Region make_region(const InitHooks& hooks, const RegionOptions& o) {
  run_hook(hooks, InitStep::kRegion, 0);
  return hooks.make_region ? hooks.make_region(o) : Region::create_or_join(o);
}

}  // namespace kvoffload::detail
