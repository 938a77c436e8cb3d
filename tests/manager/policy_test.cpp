// LRU and ARC scenarios, through the Manager and on the policies directly.
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/eviction_policy.hpp>

#include "manager_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

TEST(LruPolicy, DirectBatchOperations) {
  auto lru = make_lru_policy(4);
  EXPECT_EQ(lru->name(), "lru");
  const std::vector<SlotIndex> slots{0, 1, 2, 3};
  const std::vector<BlockKey> keys = Ks({10, 11, 12, 13});
  lru->insert(slots, keys);
  EXPECT_EQ(lru->evictable_count(), 0u);  // write pending
  lru->release(slots);                    // slot 0 most recent
  EXPECT_EQ(lru->evictable_count(), 4u);
  std::vector<std::uint32_t> marks(4, 0);
  marks[3] = 5;  // protect slot 3 in epoch 5
  std::vector<SlotIndex> out(4);
  EXPECT_EQ(lru->evict(2, VictimFilter{marks.data(), 5}, keys, out), 2u);
  EXPECT_EQ(out[0], 2u);
  EXPECT_EQ(out[1], 1u);
  lru->hold(std::vector<SlotIndex>{0});
  EXPECT_EQ(lru->evictable_count(), 1u);
  // Only slot 3 is a candidate and it is protected: nothing is evicted.
  EXPECT_EQ(lru->evict(1, VictimFilter{marks.data(), 5}, keys, out), 0u);
  EXPECT_EQ(lru->evict(1, VictimFilter{}, keys, out), 1u);
  EXPECT_EQ(out[0], 3u);
  lru->remove(std::vector<SlotIndex>{0});
  EXPECT_EQ(lru->counters().resident, 0u);
  lru->reset();
  EXPECT_EQ(lru->counters().resident, 0u);
}

TEST(ArcPolicy, PromotionT1ToT2) {
  Manager m = make(4, PolicyKind::kArc);
  store(m, Ks({1}));
  EXPECT_EQ(m.stats().policy.recent, 1u);
  EXPECT_EQ(m.stats().policy.frequent, 0u);
  m.touch(Ks({1}));
  EXPECT_EQ(m.stats().policy.recent, 0u);
  EXPECT_EQ(m.stats().policy.frequent, 1u);
  m.touch(Ks({1}));
  EXPECT_EQ(m.stats().policy.frequent, 1u);
  // A pinned T1 member is promoted too, and becomes evictable in T2 when released.
  store(m, Ks({2}));
  (void)m.prepare_load(Ks({2}));
  m.touch(Ks({2}));
  EXPECT_EQ(m.stats().policy.frequent, 2u);
  EXPECT_EQ(m.stats().policy.evictable, 1u);
  m.complete_load(Ks({2}));
  EXPECT_EQ(m.stats().policy.evictable, 2u);
  // A key stored for the first time after the request's touch stays in T1 (seen once).
  m.touch(Ks({3}));
  store(m, Ks({3}));
  EXPECT_EQ(m.stats().policy.recent, 1u);
}

TEST(ArcPolicy, FullT1KeepsNoRecencyGhosts) {
  // |T1| + |B1| <= c: with T1 full, a T1 victim's ghost is dropped at once (the paper's case IV).
  Manager m = make(2, PolicyKind::kArc);
  store(m, Ks({1}));
  store(m, Ks({2}));
  EXPECT_EQ(store(m, Ks({3})), Ks({1}));
  EXPECT_EQ(m.stats().policy.ghost_recent, 0u);
  store(m, Ks({1}));  // no ghost hit: p stays 0, 1 enters T1
  EXPECT_EQ(m.stats().policy.recent_target, 0u);
  EXPECT_EQ(m.stats().policy.frequent, 0u);
}

TEST(ArcPolicy, GhostHitsAdaptTheTarget) {
  Manager m = make(4, PolicyKind::kArc);
  store(m, Ks({1}));
  m.touch(Ks({1}));                            // T2 = {1}
  for (auto k : Ks({2, 3, 4})) store(m, {k});  // T1 = {4, 3, 2}
  EXPECT_EQ(store(m, Ks({5})), Ks({2}));       // |T1| = 3 > p = 0: T1's LRU -> B1
  PolicyCounters c = m.stats().policy;
  EXPECT_EQ(c.ghost_recent, 1u);
  EXPECT_EQ(c.recent_target, 0u);
  // 2 comes back from B1: the victim (chosen before the batch adapts p) is T1's LRU 3; then p
  // grows by max(1, |B2| / |B1|) = 1 and 2 enters T2.
  EXPECT_EQ(store(m, Ks({2})), Ks({3}));
  c = m.stats().policy;
  EXPECT_EQ(c.recent_target, 1u);
  EXPECT_EQ(c.recent, 2u);        // 5, 4
  EXPECT_EQ(c.frequent, 2u);      // 2, 1
  EXPECT_EQ(c.ghost_recent, 1u);  // 3
  EXPECT_EQ(c.ghost_frequent, 0u);
  EXPECT_EQ(store(m, Ks({6})), Ks({4}));
  EXPECT_EQ(store(m, Ks({7})), Ks({5}));  // admitting 7 drops B1's oldest (3): |T1| + |B1| <= 4
  EXPECT_EQ(m.stats().policy.ghost_recent, 2u);
  m.touch(Ks({6}));  // T1 = {7}, T2 = {6, 2, 1}
  // |T1| = 1 is not above p = 1: the victim is T2's LRU.
  EXPECT_EQ(store(m, Ks({8})), Ks({1}));
  c = m.stats().policy;
  EXPECT_EQ(c.ghost_recent, 2u);
  EXPECT_EQ(c.ghost_frequent, 1u);
  // 1 comes back from B2 after T1's LRU 7 went to B1: p shrinks by max(1, |B1| / |B2|) = 3,
  // clamped at 0.
  EXPECT_EQ(store(m, Ks({1})), Ks({7}));
  c = m.stats().policy;
  EXPECT_EQ(c.recent_target, 0u);
  EXPECT_EQ(c.recent, 1u);    // 8
  EXPECT_EQ(c.frequent, 3u);  // 1, 6, 2
  EXPECT_EQ(c.ghost_recent, 3u);
  EXPECT_EQ(c.ghost_frequent, 0u);
}

TEST(ArcPolicy, TargetGrowsByGhostRatio) {
  // With six B2 ghosts and two B1 ghosts, a B1 hit moves p by |B2|/|B1| = 3.
  Manager m = make(8, PolicyKind::kArc);
  for (std::uint64_t k = 1; k <= 8; ++k) {
    store(m, {K(k)});
    m.touch(Ks({k}));  // all in T2, 8 most recent
  }
  EXPECT_EQ(store(m, Ks({9, 10, 11, 12, 13, 14, 15})), Ks({1, 2, 3, 4, 5, 6, 7}));  // T1 empty
  EXPECT_EQ(m.stats().policy.ghost_frequent, 7u);
  EXPECT_EQ(store(m, Ks({16})), Ks({15}));  // |T1| = 7 > p = 0: T1's LRU (the request's tail)
  // The ghost pool (c = 8) is full: making room for 14's ghost drops B2's oldest (1).
  EXPECT_EQ(store(m, Ks({15})), Ks({14}));
  const PolicyCounters c = m.stats().policy;
  EXPECT_EQ(c.recent_target, 3u);
  EXPECT_EQ(c.ghost_frequent, 6u);
  EXPECT_EQ(c.ghost_recent, 1u);
  EXPECT_EQ(c.frequent, 2u);  // 8 and 15
}

TEST(ArcPolicy, VictimsSkipPinnedAndComeFromT2WhenT1HasNone) {
  Manager m = make(4, PolicyKind::kArc);
  store(m, Ks({1, 2}));
  m.touch(Ks({1, 2}));  // T2, 1 most recent
  store(m, Ks({3, 4}));
  (void)m.prepare_load(Ks({3, 4}));
  // |T1| = 2 > p = 0 but both are pinned: T2's LRU goes.
  EXPECT_EQ(store(m, Ks({5})), Ks({2}));
  EXPECT_EQ(m.stats().policy.recent, 3u);  // 3, 4 still T1 members, 5 new
}

TEST(ArcPolicy, BatchEvictionScansEachListOnce) {
  Manager m = make(6, PolicyKind::kArc);
  for (auto k : Ks({1, 2, 3})) store(m, {k});
  m.touch(Ks({1, 2, 3}));  // T2: 1 most recent, 3 least
  for (auto k : Ks({4, 5, 6})) store(m, {k});
  // T1 while |T1| > p (= 0), then T2.
  EXPECT_EQ(store(m, Ks({7, 8, 9, 10})), Ks({4, 5, 6, 3}));
  const PolicyCounters c = m.stats().policy;
  EXPECT_EQ(c.recent, 4u);
  EXPECT_EQ(c.frequent, 2u);
  EXPECT_EQ(c.ghost_recent, 2u);  // 4 dropped to keep |T1| + |B1| <= c
  EXPECT_EQ(c.ghost_frequent, 1u);
  // Protected members are skipped within the single scan.
  const StorePlan p = m.prepare_store(Ks({11, 12}), Ks({10, 2}));  // T1 LRU is 10
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({9, 8}));
}

TEST(ArcPolicy, GhostListsStayBounded) {
  for (std::uint64_t c : {1u, 3u, 8u}) {
    Manager m = make(c, PolicyKind::kArc);
    for (std::uint64_t i = 0; i < 400; ++i) {
      // A mix of new keys and returning ones (ghost hits in both lists).
      const std::uint64_t k = (i % 7 == 0) ? i / 2 : i;
      m.lookup(Ks({k}));
      m.touch(Ks({k}));
      if (!m.contains(K(k))) store(m, {K(k)});
      if (i % 3 == 0) m.touch(Ks({k}));
      const PolicyCounters pc = m.stats().policy;
      ASSERT_LE(pc.recent + pc.ghost_recent, c) << "c=" << c << " i=" << i;
      ASSERT_LE(pc.recent + pc.frequent + pc.ghost_recent + pc.ghost_frequent, 2 * c);
      ASSERT_LE(pc.recent_target, c);
    }
  }
}

TEST(ArcPolicy, FailedStoreLeavesNoGhost) {
  Manager m = make(2, PolicyKind::kArc);
  ASSERT_TRUE(m.prepare_store(Ks({1})).ok());
  m.complete_store(Ks({1}), false);
  const PolicyCounters c = m.stats().policy;
  EXPECT_EQ(c.resident, 0u);
  EXPECT_EQ(c.ghost_recent + c.ghost_frequent, 0u);
}

}  // namespace
}  // namespace kvoffload
