// OffloadStack's initialisation builders with a failure injected at every step: the original
// error surfaces, nothing is leaked, release is the reverse of construction (with and without a
// remote tier), and an invalid configuration creates nothing.

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stack/init_hooks.hpp"
#include "tiered_store_test_util.hpp"

namespace kvoffload {
namespace {

using test::Injected;
using test::kChunks;
using test::kSlotBytes;
using test::Snapshot;
using test::TieredFixture;

// ---- initialisation ---------------------------------------------------------------------------

// A tier whose close reports failure: cleanup trouble must not replace the original error.
class FailingCloseTier : public SecondaryTier {
 public:
  explicit FailingCloseTier(std::unique_ptr<SecondaryTier> inner) : inner_(std::move(inner)) {}
  const std::string& name() const noexcept override { return inner_->name(); }
  TierBatch put(std::span<const TierPut> i) override { return inner_->put(i); }
  TierBatch get(std::span<const TierGet> i) override { return inner_->get(i); }
  bool contains(const BlockKey& k) const override { return inner_->contains(k); }
  TierBatch remove(std::span<const BlockKey> k) override { return inner_->remove(k); }
  void drain() override { inner_->drain(); }
  TierStats stats() const override { return inner_->stats(); }
  bool close() noexcept override {
    inner_->close();
    closed = true;
    return false;
  }
  bool closed = false;

 private:
  std::unique_ptr<SecondaryTier> inner_;
};

TEST_F(TieredFixture, FailureAtEachStackStepSurfacesOriginalErrorAndLeaksNothing) {
  // Warm up once so lazily loaded libraries and loggers are in the "before" snapshot.
  OffloadStack::build(config(2))->close();
  std::filesystem::remove_all(disk_.path() / "tier0");
  std::filesystem::remove_all(disk_.path() / "tier1");

  struct Case {
    InitStep step;
    std::size_t index;
  };
  const Case cases[] = {{InitStep::kRegion, 0},
                        {InitStep::kPrimary, 0},
                        {InitStep::kSecondary, 0},
                        {InitStep::kSecondary, 1},
                        {InitStep::kTieredStore, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.step)) + " #" + std::to_string(c.index));
    const std::string message =
        "injected at " + std::string(to_string(c.step)) + " " + std::to_string(c.index);
    const Snapshot before;
    std::vector<InitStep> seen;
    InitHooks hooks;
    bool region_existed = false;
    hooks.before_step = [&](InitStep step, std::size_t index) {
      seen.push_back(step);
      if (step == InitStep::kPrimary) region_existed = !test::files_under(shm_.path()).empty();
      if (step == c.step && index == c.index) throw Injected(message);
    };
    std::vector<FailingCloseTier*> made;
    hooks.make_file_tier = [&](const FileTierOptions& o) {
      auto t = std::make_unique<FailingCloseTier>(FileTier::open(o));
      made.push_back(t.get());
      return t;
    };
    try {
      (void)OffloadStack::build(config(2), hooks);
      ADD_FAILURE() << "build succeeded";
    } catch (const Injected& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
    EXPECT_EQ(seen.back(), c.step);
    // The check below means something: past the region step its file did exist.
    if (c.step != InitStep::kRegion) {
      EXPECT_TRUE(region_existed);
    }
    EXPECT_TRUE(test::files_under(shm_.path()).empty());
    for (const char* root : {"tier0", "tier1"}) {
      for (const auto& f : test::files_under(disk_.path() / root)) {
        EXPECT_EQ(f, ".kvoffload-tier.lock") << "left behind: " << f;
      }
    }
    const Snapshot after;
    EXPECT_EQ(after.fds, before.fds);
    EXPECT_EQ(after.maps, before.maps);
  }
}

// A tier that records its close in a shared log (the release order of the stack).
class RecordingTier : public FailingCloseTier {
 public:
  RecordingTier(std::unique_ptr<SecondaryTier> inner, std::vector<std::string>* events)
      : FailingCloseTier(std::move(inner)), events_(events) {}
  bool close() noexcept override {
    if (!closed) events_->push_back(name() + ".close");
    (void)FailingCloseTier::close();
    return true;
  }

 private:
  std::vector<std::string>* events_;
};

// Note [Initialisation failures]: release is the reverse of construction, on success and after a
// failure at every step. Evidence comes from the resources themselves (the region's teardown
// hook runs inside Region::close, a tier's close) interleaved with the stack's after_release
// reports, so closing the region first, or the tiers in build order, changes the sequence.
struct ReleaseCase {
  std::optional<InitStep> fail;  // nullopt: build succeeds, then close()
  std::size_t index = 0;
  std::vector<std::string> want;
};

void expect_release_order(const StackConfig& config, const ReleaseCase& c,
                          const std::filesystem::path& shm) {
  SCOPED_TRACE(c.fail ? std::string(to_string(*c.fail)) + " #" + std::to_string(c.index)
                      : "success");
  std::vector<std::string> events;
  InitHooks hooks;
  hooks.before_step = [&](InitStep step, std::size_t index) {
    if (c.fail && step == *c.fail && index == c.index) throw Injected("injected");
  };
  hooks.make_region = [&](const RegionOptions& o) {
    Region r = Region::create_or_join(o);
    r.add_teardown_hook([&events] { events.push_back("region.teardown"); });
    return r;
  };
  hooks.make_file_tier = [&](const FileTierOptions& o) {
    return std::make_unique<RecordingTier>(FileTier::open(o), &events);
  };
  hooks.make_remote_tier = [&](const RemoteTierOptions& o) {
    return std::make_unique<RecordingTier>(RemoteTier::open(o), &events);
  };
  hooks.after_release = [&](InitStep step, std::size_t index) {
    events.push_back("released:" + std::string(to_string(step)) +
                     (step == InitStep::kSecondary ? "#" + std::to_string(index) : std::string()));
  };
  if (c.fail) {
    EXPECT_THROW((void)OffloadStack::build(config, hooks), Injected);
  } else {
    auto s = OffloadStack::build(config, hooks);
    EXPECT_TRUE(events.empty());
    EXPECT_TRUE(s->close());
    EXPECT_TRUE(s->close());  // idempotent: nothing released twice
  }
  EXPECT_EQ(events, c.want);
  EXPECT_TRUE(test::files_under(shm).empty());
}

TEST_F(TieredFixture, ReleaseOrderIsTheReverseOfConstructionAtEveryStep) {
  const std::vector<std::string> all = {
      "released:tiered_store", "tier1.close",      "released:secondary#1", "tier0.close",
      "released:secondary#0",  "released:primary", "region.teardown",      "released:region"};
  const std::vector<ReleaseCase> cases = {
      {std::nullopt, 0, all},
      {InitStep::kRegion, 0, {}},
      {InitStep::kPrimary, 0, {"region.teardown", "released:region"}},
      {InitStep::kSecondary, 0, {"released:primary", "region.teardown", "released:region"}},
      {InitStep::kSecondary,
       1,
       {"tier0.close", "released:secondary#0", "released:primary", "region.teardown",
        "released:region"}},
      {InitStep::kTieredStore, 0, std::vector<std::string>(all.begin() + 1, all.end())},
  };
  for (const ReleaseCase& c : cases) expect_release_order(config(2), c, shm_.path());
}

// The same with a remote tier behind the file tiers: it is built last of the secondaries and
// released first (before the file tiers, the Manager and the region), on success and after a
// failure at its own step or after it.
TEST_F(TieredFixture, ReleaseOrderWithARemoteTierIsTheReverseOfConstruction) {
  if (!remote_tier_built()) {
    // -DKVOFFLOAD_REMOTE_TIER=OFF: the remote tier's step refuses, and what came before it is
    // released in reverse (the file tiers, the primary, the region), nothing left behind.
    StackConfig with_remote = config(2);
    with_remote.remote_tiers.push_back(remote_tier());
    try {
      (void)OffloadStack::build(with_remote);
      ADD_FAILURE() << "a stack with a remote tier was built without the remote tier";
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("this build has no remote tier"));
    }
    EXPECT_TRUE(test::files_under(shm_.path()).empty());
    return;
  }
  const std::vector<std::string> all = {
      "released:tiered_store", "remote.close",   "released:secondary#2", "tier1.close",
      "released:secondary#1",  "tier0.close",    "released:secondary#0", "released:primary",
      "region.teardown",       "released:region"};
  const std::vector<ReleaseCase> cases = {
      {std::nullopt, 0, all},
      {InitStep::kSecondary, 2, std::vector<std::string>(all.begin() + 3, all.end())},
      {InitStep::kTieredStore, 0, std::vector<std::string>(all.begin() + 1, all.end())},
  };
  for (const ReleaseCase& c : cases) {
    StackConfig with_remote = config(2);
    with_remote.remote_tiers.push_back(remote_tier());
    expect_release_order(with_remote, c, shm_.path());
  }
}

TEST_F(TieredFixture, FailureInsideATierStepReleasesEarlierTiersAndRegion) {
  OffloadStack::build(config(2))->close();
  const Snapshot before;
  auto fault = std::make_shared<test::FaultSyscalls>();
  fault->set_rule(
      [](const test::FaultSyscalls::Call& c) { return c.op == test::Op::kFlock ? ENOLCK : 0; });
  InitHooks hooks;
  hooks.make_file_tier = [&](const FileTierOptions& o) -> std::unique_ptr<SecondaryTier> {
    FileTierOptions copy = o;
    if (o.name == "tier1") copy.syscalls = fault->get();
    return FileTier::open(copy);
  };
  try {
    (void)OffloadStack::build(config(2), hooks);
    FAIL() << "build succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kSystem);
    EXPECT_EQ(e.sys_errno(), ENOLCK);
    EXPECT_EQ(e.call(), "flock");
  }
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
  const Snapshot after;
  EXPECT_EQ(after.fds, before.fds);
  EXPECT_EQ(after.maps, before.maps);
}

TEST_F(TieredFixture, InvalidConfigurationCreatesNothing) {
  auto expect_invalid = [&](const StackConfig& c, std::string_view needle) {
    ASSERT_FALSE(needle.empty()) << "an empty needle matches any message";
    bool region_factory_called = false;
    InitHooks hooks;
    hooks.make_region = [&](const RegionOptions& o) {
      region_factory_called = true;
      return Region::create_or_join(o);
    };
    try {
      (void)OffloadStack::build(c, hooks);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(region_factory_called) << needle;
    EXPECT_TRUE(test::files_under(shm_.path()).empty()) << needle;
  };
  auto c = config();
  c.file_tiers[0].root = disk_.path() / "missing" / "deeper";
  expect_invalid(c, "parent");
  c = config();
  c.file_tiers[0].capacity_bytes = 0;
  expect_invalid(c, "capacity_bytes is 0");
  c = config();
  c.file_tiers[0].capacity_bytes = 4096;  // smaller than one row
  expect_invalid(c, "cannot hold one chunk row");
  c = config(2);
  c.file_tiers[1].root = c.file_tiers[0].root;
  expect_invalid(c, "used by another tier");
  c = config();
  c.manager.num_chunks = kChunks + 1;
  expect_invalid(c, "num_chunks");
  c = config();
  c.manager.threshold_tracker_capacity = 10;
  expect_invalid(c, "store_threshold is 0");
  c = config();
  c.region.engine_id = "../escape";
  expect_invalid(c, "engine id '../escape' contains the character '/'");
  c = config();
  c.region.layout.slot_bytes = 0;
  expect_invalid(c, "slot_bytes is 0");
  // A remote tier must hold the region's rows exactly: any difference in the geometry is refused
  // before anything is built (its values would not fit the slots they come back to).
  c = config();
  c.remote_tiers.push_back(remote_tier());
  c.remote_tiers[0].connections_per_node = 0;
  expect_invalid(c, "connections_per_node 0");
  const auto remote_differs = [&](const std::function<void(RemoteGeometry&)>& change,
                                  std::string_view field) {
    SCOPED_TRACE(std::string(field));
    StackConfig bad = config();
    bad.remote_tiers.push_back(remote_tier());
    change(bad.remote_tiers[0].geometry);
    expect_invalid(bad, "remote tier 'remote': geometry");
    expect_invalid(bad, field);
  };
  remote_differs([](RemoteGeometry& g) { g.slot_bytes = kSlotBytes - 8; }, "slot_bytes 4992");
  remote_differs([](RemoteGeometry& g) { g.world_size = 1; }, "world_size 1");
  remote_differs([](RemoteGeometry& g) { g.replicated = true; }, "replicated yes");
  remote_differs([](RemoteGeometry& g) { g.slot_stride = 0; }, "slot_stride 5000");
  EXPECT_FALSE(std::filesystem::exists(disk_.path() / "tier0"));
  // The same remote tier, matching: the stack builds (the check above is not a blanket refusal).
  c = config();
  c.remote_tiers.push_back(remote_tier());
  if (!remote_tier_built()) {  // -DKVOFFLOAD_REMOTE_TIER=OFF: refused, naming the option
    try {
      (void)OffloadStack::build(c);
      ADD_FAILURE() << "a stack with a remote tier was built without the remote tier";
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("-DKVOFFLOAD_REMOTE_TIER=ON"));
    }
    return;
  }
  auto built = OffloadStack::build(c);
  EXPECT_EQ(built->tiers().size(), 2u);
  EXPECT_TRUE(built->close());
}

}  // namespace
}  // namespace kvoffload
