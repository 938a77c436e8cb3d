// OffloadWorker's builder (one rank's region, runtime and transfer engine over KV groups): it
// builds and closes, releases its region after a failure at each step in reverse construction
// order, checks the whole worker configuration before the region exists, and passes a runtime
// factory's error through unchanged.

#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tiered_store_test_util.hpp"

namespace kvoffload {
namespace {

using test::Injected;
using test::Snapshot;
using test::TieredFixture;

// ---- worker ------------------------------------------------------------------------------------

class WorkerFixture : public TieredFixture {
 protected:
  WorkerConfig worker_config() {
    WorkerConfig w;
    w.region.engine_id = "tier-worker-" + std::to_string(::getpid());
    w.region.layout = {.num_chunks = 4, .slot_bytes = 8192, .world_size = 1};
    w.region.rank = 0;
    w.region.shm_dir = shm_.path();
    w.backend = "host";
    device_.assign(8 * 4096, std::byte{0});
    DeviceTensor t;
    t.base = reinterpret_cast<std::uint64_t>(device_.data());
    t.num_blocks = 8;
    t.page_bytes = 4096;
    w.groups = {KvGroup{{t}}};
    w.blocks_per_chunk = 2;
    return w;
  }
  std::vector<std::byte> device_;
};

TEST_F(WorkerFixture, BuildsAndCloses) {
  auto w = OffloadWorker::build(worker_config());
  EXPECT_EQ(w->runtime().name(), "host");
  EXPECT_TRUE(w->close());
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
}

TEST_F(WorkerFixture, FailureAtEachWorkerStepReleasesItsRegion) {
  OffloadWorker::build(worker_config())->close();
  for (InitStep step : {InitStep::kRegion, InitStep::kRuntime, InitStep::kTransferEngine}) {
    SCOPED_TRACE(std::string(to_string(step)));
    const Snapshot before;
    const std::string message = "injected at " + std::string(to_string(step));
    InitHooks hooks;
    hooks.before_step = [&](InitStep s, std::size_t) {
      if (s == step) throw Injected(message);
    };
    try {
      (void)OffloadWorker::build(worker_config(), hooks);
      ADD_FAILURE() << "build succeeded";
    } catch (const Injected& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
    EXPECT_TRUE(test::files_under(shm_.path()).empty());
    const Snapshot after;
    EXPECT_EQ(after.fds, before.fds);
    EXPECT_EQ(after.maps, before.maps);
  }
}

TEST_F(WorkerFixture, ReleaseOrderIsTheReverseOfConstructionAtEveryStep) {
  struct Case {
    std::optional<InitStep> fail;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {std::nullopt,
       {"released:transfer_engine", "released:runtime", "region.teardown", "released:region"}},
      {InitStep::kRegion, {}},
      {InitStep::kRuntime, {"region.teardown", "released:region"}},
      {InitStep::kTransferEngine, {"released:runtime", "region.teardown", "released:region"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fail ? std::string(to_string(*c.fail)) : "success");
    std::vector<std::string> events;
    InitHooks hooks;
    hooks.before_step = [&](InitStep step, std::size_t) {
      if (c.fail && step == *c.fail) throw Injected("injected");
    };
    hooks.make_region = [&](const RegionOptions& o) {
      Region r = Region::create_or_join(o);
      r.add_teardown_hook([&events] { events.push_back("region.teardown"); });
      return r;
    };
    hooks.after_release = [&](InitStep step, std::size_t) {
      events.push_back("released:" + std::string(to_string(step)));
    };
    if (c.fail) {
      EXPECT_THROW((void)OffloadWorker::build(worker_config(), hooks), Injected);
    } else {
      auto w = OffloadWorker::build(worker_config(), hooks);
      EXPECT_TRUE(w->close());
      EXPECT_TRUE(w->close());
    }
    EXPECT_EQ(events, c.want);
    EXPECT_TRUE(test::files_under(shm_.path()).empty());
  }
}

// The whole worker configuration is checked before the region exists.
TEST_F(WorkerFixture, InvalidConfigurationCreatesNothing) {
  auto expect_refused = [&](const WorkerConfig& w, ErrorCode code, std::string_view needle) {
    bool region_made = false;
    InitHooks hooks;
    hooks.make_region = [&](const RegionOptions& o) {
      region_made = true;
      return Region::create_or_join(o);
    };
    try {
      (void)OffloadWorker::build(w, hooks);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(region_made) << needle;
    EXPECT_TRUE(test::files_under(shm_.path()).empty()) << needle;
  };
  auto w = worker_config();
  w.backend = "nvidia";
  expect_refused(w, ErrorCode::kInvalidArgument,
                 "backend 'nvidia' is not a backend name (auto, host, cuda or hip)");
  w = worker_config();
  w.blocks_per_chunk = 3;  // 3 x 4096 bytes do not fit the 8192-byte slot
  expect_refused(
      w, ErrorCode::kInvalidArgument,
      "host slot of 8192 bytes is too small for 3 blocks per chunk x 4096 bytes per block");
  w = worker_config();
  w.groups[0].tensors[0].page_bytes = 0;
  expect_refused(w, ErrorCode::kInvalidArgument, "kv layout");
  w = worker_config();
  w.region.rank = 1;  // world_size 1
  expect_refused(w, ErrorCode::kInvalidArgument, "rank");
  for (const auto& b : list_backends()) {
    if (b.built) continue;
    w = worker_config();
    w.backend = b.name;
    expect_refused(w, ErrorCode::kNotAvailable, "backend '" + b.name + "' is not available");
  }
}

TEST_F(WorkerFixture, RuntimeFactoryErrorSurfacesUnchanged) {
  OffloadWorker::build(worker_config())->close();
  const Snapshot before;
  InitHooks hooks;
  hooks.make_runtime = [](std::string_view,
                          const RuntimeOptions&) -> std::unique_ptr<DeviceRuntime> {
    throw Error(ErrorCode::kNotAvailable, "backend 'cuda' is not built into this library");
  };
  try {
    (void)OffloadWorker::build(worker_config(), hooks);
    FAIL() << "build succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotAvailable);
    EXPECT_EQ(std::string(e.what()), "backend 'cuda' is not built into this library");
  }
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
  const Snapshot after;
  EXPECT_EQ(after.fds, before.fds);
  EXPECT_EQ(after.maps, before.maps);
}

TEST_F(WorkerFixture, WorkerValidationRefusesMissingRank) {
  auto w = worker_config();
  w.region.rank.reset();
  EXPECT_THROW((void)OffloadWorker::build(w), Error);
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
}

}  // namespace
}  // namespace kvoffload
