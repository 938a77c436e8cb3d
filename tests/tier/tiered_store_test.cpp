// TieredStore over a real region + Manager + FileTier, and the initialisation builders with a
// failure injected at every step (original error surfaces, nothing leaked).

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string_view>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/remote_tier.hpp>

#include "remote_servers.hpp"
#include "tier_test_util.hpp"

namespace kvoffload {
namespace {

using TempDir = test::DiskTempDir;

constexpr std::uint64_t kSlotBytes = 5000;  // not page-aligned: rows carry padding
constexpr std::uint32_t kWorld = 2;
constexpr std::uint64_t kChunks = 4;

std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

std::vector<BlockKey> keys_of(std::initializer_list<std::uint64_t> ids) {
  std::vector<BlockKey> k;
  for (auto id : ids) k.push_back(BlockKey::from_u64(id));
  return k;
}

class TieredFixture : public ::testing::Test {
 protected:
  TieredFixture() : shm_(std::filesystem::path("/dev/shm")) {}

  StackConfig config(std::size_t tiers = 1) {
    StackConfig c;
    c.region.engine_id =
        "tier-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++);
    c.region.layout = {.num_chunks = kChunks, .slot_bytes = kSlotBytes, .world_size = kWorld};
    c.region.shm_dir = shm_.path();
    for (std::size_t i = 0; i < tiers; ++i) {
      FileTierOptions t;
      t.root = disk_.path() / ("tier" + std::to_string(i));
      t.capacity_bytes = 64 << 20;
      t.io_threads = 2;
      t.name = "tier" + std::to_string(i);
      c.file_tiers.push_back(t);
    }
    return c;
  }

  // A remote tier matching config()'s region, at an address where nothing listens: open() warns
  // and the tier answers misses (no server is needed to build, validate or release it).
  static RemoteTierOptions remote_tier() {
    RemoteTierOptions t;
    t.url = RemoteUrl::parse("redis://127.0.0.1:" + std::to_string(test::free_port()));
    t.geometry = {
        .slot_bytes = kSlotBytes,
        .world_size = kWorld,
        .tensor_layout = "test",
        .slot_stride = RegionGeometry::compute(
                           {.num_chunks = kChunks, .slot_bytes = kSlotBytes, .world_size = kWorld},
                           static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)))
                           .slot_stride()};
    t.connect_timeout = std::chrono::milliseconds(200);
    t.name = "remote";
    return t;
  }

  // Stores `ids` in the primary through the tiered store, each row filled with pattern(id).
  static void store(OffloadStack& s, const std::vector<BlockKey>& keys) {
    const StorePlan plan = s.manager().prepare_store(keys);
    ASSERT_TRUE(plan.ok()) << plan.describe();
    const PrimaryRows rows = PrimaryRows::of(s.region());
    for (std::size_t i = 0; i < plan.keys.size(); ++i) {
      const auto p = pattern(rows.row_bytes, static_cast<std::uint32_t>(plan.keys[i].lo()));
      std::memcpy(rows.row(plan.slots[i]).data(), p.data(), p.size());
    }
    const std::vector<BlockKey> stored(plan.keys.begin(), plan.keys.end());
    s.store().complete_store(stored, true);
  }

  static void expect_row(OffloadStack& s, BlockKey key) {
    const SlotIndex slot = s.manager().slot_of(key);
    ASSERT_NE(slot, kNoSlot);
    const PrimaryRows rows = PrimaryRows::of(s.region());
    const auto want = pattern(rows.row_bytes, static_cast<std::uint32_t>(key.lo()));
    const auto row = rows.row(slot);
    EXPECT_EQ(std::memcmp(row.data(), want.data(), want.size()), 0) << key.to_hex();
  }

  TempDir shm_;
  TempDir disk_;
  int counter_ = 0;
};

TEST_F(TieredFixture, StoredChunksReachTheFileTierAndPromoteBackIdentical) {
  auto s = OffloadStack::build(config());
  const auto first = keys_of({1, 2, 3, 4});
  store(*s, first);
  // Each key stays pinned until the store sees its tier write finish.
  EXPECT_EQ(s->manager().pin_count(first[0]), 1u);
  s->store().drain();
  EXPECT_EQ(s->manager().pin_count(first[0]), 0u);
  for (const auto& k : first) EXPECT_TRUE(s->tiers()[0]->contains(k));
  EXPECT_EQ(s->store().stats().offload_ok, 4u);

  // Four new keys evict the first four from the primary (all evictable now).
  store(*s, keys_of({5, 6, 7, 8}));
  s->store().drain();
  for (const auto& k : first) EXPECT_EQ(s->manager().state_of(k), LookupResult::kMiss);

  std::vector<TierLocation> loc(5);
  const auto probe = keys_of({1, 2, 5, 9, 3});
  const TieredLookup l = s->store().lookup(probe, loc);
  EXPECT_EQ(loc[0], TierLocation::kSecondary);
  EXPECT_EQ(loc[1], TierLocation::kSecondary);
  EXPECT_EQ(loc[2], TierLocation::kPrimary);
  EXPECT_EQ(loc[3], TierLocation::kMiss);
  EXPECT_EQ(loc[4], TierLocation::kSecondary);
  EXPECT_EQ(l.primary_prefix, 0u);
  EXPECT_EQ(l.available_prefix, 3u);

  // Promote 1 and 2 while protecting 5: 6 and 7 (least recent) go.
  const auto want = keys_of({1, 2});
  const auto keep = keys_of({5});
  const PromoteTicket t = s->store().promote(want, keep);
  ASSERT_NE(t.id, 0u);
  EXPECT_EQ(t.keys, want);
  EXPECT_EQ(t.evicted.size(), 2u);
  for (const auto& k : want) EXPECT_EQ(s->manager().state_of(k), LookupResult::kHitPending);
  const auto done = s->store().drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, t.id);
  EXPECT_EQ(done[0].promoted.size(), 2u);
  EXPECT_TRUE(done[0].failed.empty());
  for (const auto& k : want) {
    EXPECT_EQ(s->manager().state_of(k), LookupResult::kHit);
    expect_row(*s, k);
  }
  EXPECT_EQ(s->manager().state_of(BlockKey::from_u64(5)), LookupResult::kHit);
  EXPECT_TRUE(s->close());
}

TEST_F(TieredFixture, DamagedRecordPromotesAsFailureAndFreesItsSlot) {
  auto s = OffloadStack::build(config());
  store(*s, keys_of({1, 2}));
  s->store().drain();
  auto* tier = dynamic_cast<FileTier*>(s->tiers()[0].get());
  ASSERT_NE(tier, nullptr);
  // Forget 1 and 2 in the primary (evict by filling), then damage 2's record.
  store(*s, keys_of({11, 12, 13, 14}));
  s->store().drain();
  std::filesystem::resize_file(tier->record_path(BlockKey::from_u64(2)), 4096);
  const auto want = keys_of({1, 2});
  const PromoteTicket t = s->store().promote(want);
  ASSERT_EQ(t.keys.size(), 2u);
  const auto done = s->store().drain();
  ASSERT_EQ(done.size(), 1u);
  ASSERT_EQ(done[0].promoted.size(), 1u);
  EXPECT_EQ(done[0].promoted[0], BlockKey::from_u64(1));
  ASSERT_EQ(done[0].failed.size(), 1u);
  EXPECT_EQ(done[0].failed[0].key, BlockKey::from_u64(2));
  EXPECT_EQ(done[0].failed[0].status, TierItemStatus::kMiss);
  expect_row(*s, BlockKey::from_u64(1));
  EXPECT_EQ(s->manager().state_of(BlockKey::from_u64(2)), LookupResult::kMiss);
  EXPECT_EQ(s->manager().stats().write_pending, 0u);
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(2)));
}

// Note [Promotion fall-through]: the first tier holding a key misses (its record is damaged);
// the promotion reads the key from the next tier that holds it instead of failing it.
TEST_F(TieredFixture, PromotionThatMissesInTheFirstTierTriesTheNext) {
  auto s = OffloadStack::build(config(2));
  store(*s, keys_of({1, 2, 3}));
  s->store().drain();
  auto* first = dynamic_cast<FileTier*>(s->tiers()[0].get());
  auto* second = dynamic_cast<FileTier*>(s->tiers()[1].get());
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  store(*s, keys_of({11, 12, 13, 14}));
  s->store().drain();
  std::filesystem::resize_file(first->record_path(BlockKey::from_u64(2)), 4096);   // miss in tier0
  std::filesystem::resize_file(first->record_path(BlockKey::from_u64(3)), 4096);   // ... and in
  std::filesystem::resize_file(second->record_path(BlockKey::from_u64(3)), 4096);  // tier1 too
  const auto want = keys_of({1, 2, 3});
  const PromoteTicket t = s->store().promote(want);
  ASSERT_EQ(t.keys.size(), 3u);
  const auto done = s->store().drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].promoted, keys_of({1, 2}));
  ASSERT_EQ(done[0].failed.size(), 1u);
  EXPECT_EQ(done[0].failed[0].key, BlockKey::from_u64(3));
  EXPECT_EQ(done[0].failed[0].status, TierItemStatus::kMiss);
  expect_row(*s, BlockKey::from_u64(1));
  expect_row(*s, BlockKey::from_u64(2));
  EXPECT_EQ(s->manager().state_of(BlockKey::from_u64(3)), LookupResult::kMiss);
  EXPECT_EQ(s->manager().stats().write_pending, 0u);
  EXPECT_FALSE(first->contains(BlockKey::from_u64(2)));  // dropped as damaged
  EXPECT_TRUE(second->contains(BlockKey::from_u64(2)));
  EXPECT_EQ(s->store().stats().promoted, 2u);
  EXPECT_EQ(s->store().stats().promote_failed, 1u);
  EXPECT_TRUE(s->close());
}

TEST_F(TieredFixture, PromoteWithoutRoomChangesNothing) {
  auto s = OffloadStack::build(config());
  store(*s, keys_of({1}));
  s->store().drain();
  store(*s, keys_of({2, 3, 4, 5}));
  s->store().drain();
  // Pin every primary chunk: nothing is evictable.
  const auto all = keys_of({2, 3, 4, 5});
  (void)s->manager().prepare_load(all);
  const PromoteTicket t = s->store().promote(keys_of({1}));
  EXPECT_EQ(t.id, 0u);
  EXPECT_EQ(t.status, StoreStatus::kCannotStore);
  EXPECT_EQ(s->manager().state_of(BlockKey::from_u64(1)), LookupResult::kMiss);
  s->manager().complete_load(all);
}

// ---- initialisation ---------------------------------------------------------------------------

struct Snapshot {
  std::map<int, std::string> fds = test::fd_snapshot();
  std::vector<std::string> maps = test::maps_snapshot();
};

struct Injected : Error {
  explicit Injected(std::string what) : Error(ErrorCode::kInternal, std::move(what)) {}
};

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
  auto expect_invalid = [&](StackConfig c, std::string_view needle) {
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
  auto built = OffloadStack::build(c);
  EXPECT_EQ(built->tiers().size(), 2u);
  EXPECT_TRUE(built->close());
}

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
