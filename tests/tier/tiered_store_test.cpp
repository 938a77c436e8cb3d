// TieredStore over a real region + Manager + FileTier: stored chunks reach the file tier and are
// promoted back identical, a damaged record promotes as a failure, a promotion that misses in the
// first tier tries the next, and a promotion without room changes nothing. The stack's
// initialisation is tested in stack_init_test.cpp, the worker's in offload_worker_test.cpp.

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tiered_store_test_util.hpp"

namespace kvoffload {
namespace {

using test::keys_of;
using test::TieredFixture;

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

}  // namespace
}  // namespace kvoffload
