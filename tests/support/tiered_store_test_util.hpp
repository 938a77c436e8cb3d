#pragma once
// The kit of the tiered store and stack suites (tiered_store_test.cpp, stack_init_test.cpp,
// offload_worker_test.cpp): TieredFixture builds StackConfigs over a /dev/shm region and disk file
// tiers (and a remote tier where nothing listens), stores rows filled with pattern(id) and checks
// them; Snapshot and Injected serve the failure-injection cases.

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/remote_tier.hpp>

#include "remote_servers.hpp"
#include "tier_test_util.hpp"

namespace kvoffload::test {

inline constexpr std::uint64_t kSlotBytes = 5000;  // not page-aligned: rows carry padding
inline constexpr std::uint32_t kWorld = 2;
inline constexpr std::uint64_t kChunks = 4;

inline std::vector<BlockKey> keys_of(std::initializer_list<std::uint64_t> ids) {
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

  DiskTempDir shm_;
  DiskTempDir disk_;
  int counter_ = 0;
};

struct Snapshot {
  std::map<int, std::string> fds = test::fd_snapshot();
  std::vector<std::string> maps = test::maps_snapshot();
};

struct Injected : Error {
  explicit Injected(std::string what) : Error(ErrorCode::kInternal, std::move(what)) {}
};

}  // namespace kvoffload::test
