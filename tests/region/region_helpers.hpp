#pragma once
// Helpers shared by the region suites.

#include <optional>
#include <string>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "test_env.hpp"

namespace kvoffload::test {

inline RegionOptions small_options(const std::filesystem::path& dir, const std::string& id,
                                   std::optional<std::uint32_t> rank = 0) {
  RegionOptions o;
  o.engine_id = id;
  o.layout = {.num_chunks = 4, .slot_bytes = 3000, .world_size = 2};
  o.rank = rank;
  o.shm_dir = dir;
  o.join_timeout = std::chrono::milliseconds(10'000);
  return o;
}

// Runs `fn`, which must throw kvoffload::Error; returns it (or an kOk error after a test failure).
template <typename F>
Error expect_error(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a kvoffload::Error";
  return Error(ErrorCode::kOk, "no error");
}

// A region whose only user exited without closing: the file stays, nobody holds its lock.
inline void make_stale_region(const RegionOptions& options) {
  const pid_t pid = fork_child([&] {
    Region r = Region::create_or_join(options);
    ::_exit(r.role() == RegionRole::kCreator ? 0 : 1);  // exits with r open: no close, no unlink
    return 2;
  });
  const int status = wait_child(pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace kvoffload::test
