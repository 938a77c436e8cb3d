// OffloadWorker's builder (one rank's region, runtime and transfer engine over KV groups): it
// builds and closes, releases its region after a failure at each step in reverse construction
// order, checks the whole worker configuration before the region exists, and passes a runtime
// factory's error through unchanged.

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/fault_runtime.hpp"
#include "stack/init_hooks.hpp"
#include "test_env.hpp"
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
  for (InitStep step : {InitStep::kRuntime, InitStep::kRegion, InitStep::kTransferEngine}) {
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
  // Note [Rank assembly]: runtime, region (its teardown: the test's hook, then the pieces), engine.
  const std::vector<Case> cases = {
      {std::nullopt,
       {"released:transfer_engine", "region.teardown", "released:pieces", "released:region",
        "released:runtime"}},
      {InitStep::kRuntime, {}},
      {InitStep::kRegion, {"released:runtime"}},
      {InitStep::kTransferEngine,
       {"region.teardown", "released:pieces", "released:region", "released:runtime"}},
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

// Note [Rank assembly], in both bring-up modes and on a failed bring-up: every piece is registered
// as it comes up (5 pieces of 1, 2, 2, 2 and 1 rows: Note [Growing pieces]) and told to the
// engine, whose kernel path opens once they cover the region; close() drains the engine, frees
// the caches, unregisters every piece while its pages are still mapped (a piece released after
// the unmap shows up as "(unmapped!)" and fails the comparison), unmaps, and releases the runtime
// last. The runtime is the fault-injecting decorator over the host runtime, which reports each
// registration call.
class PieceOrderFixture : public WorkerFixture {
 protected:
  struct Run {
    std::vector<std::string> events;
    std::unique_ptr<DeviceRuntime> host = make_runtime("host");
    InitHooks hooks;
  };
  void SetUp() override {
    WorkerFixture::SetUp();
    run_ = std::make_unique<Run>();
  }
  // Hooks that record the worker's releases and the runtime's registrations; registration
  // `fail_at` (0-based, -1: none) is refused.
  InitHooks& hooks(int fail_at = -1) {
    Run& r = *run_;
    r.hooks.after_release = [&r](InitStep step, std::size_t) {
      r.events.push_back("released:" + std::string(to_string(step)));
    };
    r.hooks.make_runtime = [&r, fail_at](std::string_view, const RuntimeOptions&) {
      FaultPlan plan{.fail_registration_at = fail_at};
      plan.on_registration = [&r](bool registered, const void* p, std::size_t) {
        const std::lock_guard lock(mu_);
        r.events.push_back(std::string(registered ? "register" : "unregister") +
                           (test::is_mapped(p) ? "" : " (unmapped!)"));
      };
      return std::unique_ptr<DeviceRuntime>(std::make_unique<FaultInjectingRuntime>(*r.host, plan));
    };
    return r.hooks;
  }
  WorkerConfig config(BringupMode mode) {
    WorkerConfig w = worker_config();
    w.region.layout = {.num_chunks = 8, .slot_bytes = 16384, .world_size = 1};  // 16 KiB rows
    w.region.bringup = mode;
    w.region.bringup_first_piece_bytes = 16384;
    w.region.bringup_piece_bytes = 2 * 16384;
    w.groups.clear();
    w.caches = DeviceCaches{.tensors = 2, .num_blocks = 8, .block_bytes = 4096};
    return w;
  }
  std::vector<std::string> events() {
    const std::lock_guard lock(mu_);
    return run_->events;
  }
  static std::vector<std::string> repeat(const std::string& e, int n) {
    return std::vector<std::string>(static_cast<std::size_t>(n), e);
  }
  static std::vector<std::string> cat(std::vector<std::string> a,
                                      const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static inline std::mutex mu_;
  std::unique_ptr<Run> run_;
};

TEST_F(PieceOrderFixture, EveryPieceIsRegisteredAndReleasedInTheSafeOrderInBothModes) {
  for (BringupMode mode : {BringupMode::kBlocking, BringupMode::kBackground}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    run_ = std::make_unique<Run>();
    const Snapshot before;
    auto w = OffloadWorker::build(config(mode), hooks());
    if (mode == BringupMode::kBlocking) {
      EXPECT_EQ(events(), repeat("register", 5)) << "blocking: every piece before build returns";
    }
    w->region().wait_bringup();
    const WorkerRegistration reg = w->registration();
    EXPECT_EQ(reg.pieces, 5U);
    EXPECT_EQ(reg.bytes, w->region().geometry().data_bytes());
    EXPECT_TRUE(w->engine().host_registered()) << "told of every piece: they cover the region";
    ASSERT_EQ(w->caches().size(), 2U);
    EXPECT_EQ(w->groups().at(0).tensors.at(1).base,
              reinterpret_cast<std::uint64_t>(w->caches()[1].data()));
    EXPECT_TRUE(w->close());
    EXPECT_TRUE(w->close());
    EXPECT_EQ(events(), cat(cat(repeat("register", 5),
                                {"released:transfer_engine", "released:device_caches"}),
                            cat(repeat("unregister", 5),
                                {"released:pieces", "released:region", "released:runtime"})));
    EXPECT_TRUE(test::files_under(shm_.path()).empty());
    const Snapshot after;
    EXPECT_EQ(after.fds, before.fds);
    EXPECT_EQ(after.maps, before.maps);
  }
}

// A blocking bring-up whose third registration fails: build() throws the runtime's error, and the
// two pieces registered before are unregistered before the unmap (this was the gap: the worker
// held them past the region's close).
TEST_F(PieceOrderFixture, AFailedBlockingBringupUnregistersItsPiecesBeforeTheUnmap) {
  const Snapshot before;
  try {
    (void)OffloadWorker::build(config(BringupMode::kBlocking), hooks(2));
    FAIL() << "build succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDevice) << e.what();
    EXPECT_EQ(e.call(), "register_host");
  }
  // The region closed inside create_or_join (so never reported as the worker's), its
  // on_teardown first.
  EXPECT_EQ(events(), cat(repeat("register", 2),
                          cat(repeat("unregister", 2), {"released:pieces", "released:runtime"})));
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
  const Snapshot after;
  EXPECT_EQ(after.fds, before.fds);
  EXPECT_EQ(after.maps, before.maps);
}

// In the background the same failure is a failed bring-up the rank reports, with the rows before
// it still serving; close() releases in the same order.
TEST_F(PieceOrderFixture, AFailedBackgroundBringupKeepsItsPiecesUntilTheSafeClose) {
  auto w = OffloadWorker::build(config(BringupMode::kBackground), hooks(2));
  EXPECT_THROW(w->region().wait_bringup(), Error);
  EXPECT_EQ(w->region().bringup_status().state, BringupState::kFailed);
  EXPECT_EQ(w->region().bringup_status().ready_chunks, 3U);  // pieces of 1 and 2 rows
  EXPECT_EQ(w->registration().pieces, 2U);
  EXPECT_FALSE(w->engine().host_registered()) << "two pieces do not cover the region";
  EXPECT_TRUE(w->close());
  EXPECT_EQ(events(),
            cat(cat(repeat("register", 2), {"released:transfer_engine", "released:device_caches"}),
                cat(repeat("unregister", 2),
                    {"released:pieces", "released:region", "released:runtime"})));
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
}

// A rank on the simulated device takes device rank mod the device count, or the one `devices`
// names; a device the backend lacks is refused before a runtime exists.
TEST_F(WorkerFixture, TheRankTakesItsDeviceFromTheProbe) {
  ::setenv("KVOFFLOAD_SIM_DEVICES", "2", 1);
  auto w = worker_config();
  w.backend = "sim";
  w.region.layout.world_size = 2;
  w.region.rank = 1;
  w.groups.clear();
  w.caches = DeviceCaches{.tensors = 1, .num_blocks = 8, .block_bytes = 4096};
  {
    auto built = OffloadWorker::build(w);
    EXPECT_EQ(built->device(), 1);
    EXPECT_EQ(built->runtime().name(), "sim");
  }
  w.devices = {0};
  EXPECT_EQ(OffloadWorker::build(w)->device(), 0);
  w.devices = {0, 3};
  try {
    (void)OffloadWorker::build(w);
    ADD_FAILURE() << "device 3 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("devices 0,3: rank 1 would use device 3, but the "
                                               "sim backend has 2 device(s), 0 to 1"));
  }
  ::unsetenv("KVOFFLOAD_SIM_DEVICES");
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
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
                 "backend 'nvidia' is not a backend name (auto, host, sim, cuda or hip)");
  w = worker_config();
  w.caches = DeviceCaches{.tensors = 1, .num_blocks = 8, .block_bytes = 4096};
  expect_refused(w, ErrorCode::kInvalidArgument, "both KV groups and caches to allocate");
  w.groups.clear();
  w.caches->num_blocks = 0;
  expect_refused(w, ErrorCode::kInvalidArgument, "each must be > 0");
  w.caches.reset();
  expect_refused(w, ErrorCode::kInvalidArgument, "no KV groups and no caches to allocate");
  w = worker_config();
  w.region.on_piece_ready = [](std::span<std::byte>, std::uint64_t, std::uint64_t) {};
  expect_refused(w, ErrorCode::kInvalidArgument, "the worker registers the bring-up pieces");
  w = worker_config();
  w.devices = {0, -1};
  expect_refused(w, ErrorCode::kInvalidArgument, "devices 0,-1: a device ordinal must be >= 0");
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
