// ManagerSemantics::kVllm (Note [vLLM semantics] in manager.cpp): the rules vLLM's
// CPUOffloadingManager follows where they differ from the native ones. The full output-by-output
// comparison with vLLM's own CPUOffloadingManager is python/tests/test_vllm_manager.py; these run
// the same code under the sanitizers (the asan/tsan presets build no Python).
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "manager_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

Manager make_vllm(std::uint64_t n, PolicyKind policy, std::uint32_t threshold = 0,
                  std::uint64_t tracker = 0) {
  ManagerConfig c;
  c.num_chunks = n;
  c.policy = policy;
  c.store_threshold = threshold;
  c.threshold_tracker_capacity = tracker;
  c.semantics = ManagerSemantics::kVllm;
  return Manager(c);
}

std::vector<SlotIndex> slots(const StorePlan& p) {
  return {p.slots.begin(), p.slots.end()};
}

class VllmSemantics : public ::testing::TestWithParam<PolicyKind> {};

INSTANTIATE_TEST_SUITE_P(Policies, VllmSemantics,
                         ::testing::Values(PolicyKind::kLru, PolicyKind::kArc),
                         [](const auto& pi) { return std::string(to_string(pi.param)); });

TEST(VllmSemanticsConfig, NamesAndValidation) {
  EXPECT_EQ(to_string(ManagerSemantics::kNative), "native");
  EXPECT_EQ(to_string(ManagerSemantics::kVllm), "vllm");
  ManagerConfig c;
  c.num_chunks = 4;
  c.semantics = static_cast<ManagerSemantics>(7);
  EXPECT_EQ(code_of([&] { Manager m(c); }), ErrorCode::kInvalidArgument);
}

TEST_P(VllmSemantics, FreshSlotsAscendingThenMostRecentlyFreed) {
  Manager m = make_vllm(4, GetParam());
  auto p = m.prepare_store(Ks({1, 2, 3}));
  EXPECT_EQ(slots(p), (std::vector<SlotIndex>{0, 1, 2}));
  m.complete_store(Ks({1, 2, 3}), false);  // frees 0, 1, 2 in that order
  p = m.prepare_store(Ks({4, 5, 6}));
  EXPECT_EQ(slots(p), (std::vector<SlotIndex>{3, 2, 1}));
  m.reset();
  EXPECT_EQ(slots(m.prepare_store(Ks({7}))), (std::vector<SlotIndex>{0}));
}

TEST(VllmSemanticsArc, LoadsAndStoresDoNotMoveChunks) {
  Manager m = make_vllm(3, PolicyKind::kArc);
  ASSERT_TRUE(m.prepare_store(Ks({1, 2, 3})).ok());
  m.complete_store(Ks({1, 2, 3}), true);
  (void)m.prepare_load(Ks({1}));
  m.complete_load(Ks({1}));
  const auto p = m.prepare_store(Ks({4, 5}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({1, 2}));  // key 1 stayed the least recent
  EXPECT_EQ(std::vector<SlotIndex>(p.evicted_slots.begin(), p.evicted_slots.end()),
            (std::vector<SlotIndex>{0, 1}));
  EXPECT_EQ(slots(p), (std::vector<SlotIndex>{1, 0}));
}

// vLLM's LRU since 68567ef2df: a block joins the evictable list at the most recent end when its
// store or its last load completes, and touch moves only blocks in that list.
TEST(VllmSemanticsLru, ACompletedLoadMakesTheChunkMostRecent) {
  Manager m = make_vllm(3, PolicyKind::kLru);
  ASSERT_TRUE(m.prepare_store(Ks({1, 2, 3})).ok());
  m.complete_store(Ks({1, 2, 3}), true);
  (void)m.prepare_load(Ks({1}));
  (void)m.prepare_load(Ks({1}));
  m.complete_load(Ks({1}));  // still pinned once: not evictable, no place in the list
  EXPECT_FALSE(m.prepare_store(Ks({4, 5, 6})).ok());
  m.complete_load(Ks({1}));  // the last reader: 1 re-enters as the most recent
  const auto p = m.prepare_store(Ks({4, 5}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({2, 3}));
  EXPECT_EQ(slots(p), (std::vector<SlotIndex>{2, 1}));
}

TEST(VllmSemanticsLru, CompletionOrderNotInsertionOrderSetsRecency) {
  Manager m = make_vllm(2, PolicyKind::kLru);
  ASSERT_TRUE(m.prepare_store(Ks({1, 2})).ok());
  m.complete_store(Ks({2, 1}), true);  // mark_evictable in call order: 1 ends most recent
  const auto p = m.prepare_store(Ks({3}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({2}));
}

TEST(VllmSemanticsLru, TouchMovesOnlyEvictableChunks) {
  Manager m = make_vllm(3, PolicyKind::kLru);
  ASSERT_TRUE(m.prepare_store(Ks({1})).ok());
  m.complete_store(Ks({1}), true);
  ASSERT_TRUE(m.prepare_store(Ks({2, 3})).ok());
  m.complete_store(Ks({2}), true);  // list: 1, 2 (2 most recent); 3 write-pending
  (void)m.prepare_load(Ks({2}));    // list: 1
  m.touch(Ks({3, 2, 1}));           // only 1 is in the list: nothing else moves
  m.complete_store(Ks({3}), true);  // list: 1, 3
  m.complete_load(Ks({2}));         // list: 1, 3, 2
  m.touch(Ks({1, 3}));              // reversed: 3, then 1 to the recent end: list 2, 3, 1
  const auto p = m.prepare_store(Ks({4}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({2}));
  const auto q = m.prepare_store(Ks({5}));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(copy(q.evicted), Ks({3}));
}

TEST(VllmSemanticsLru, AnEvictionShortOfCandidatesChangesNothing) {
  // The Manager checks the count before it asks; the policy is atomic on its own as vLLM's evict()
  // (None, nothing removed) when the protected set leaves too few candidates.
  auto policy = make_vllm_lru_policy(4);
  const std::vector<SlotIndex> all{0, 1, 2, 3};
  const std::vector<BlockKey> keys = Ks({1, 2, 3, 4});
  policy->insert(all, keys);
  policy->release(all);
  std::vector<std::uint32_t> marks(4, 0);
  marks[0] = marks[2] = 1;
  std::vector<SlotIndex> victims(3);
  EXPECT_EQ(policy->evict(3, VictimFilter{marks.data(), 1}, keys, victims), 0u);
  EXPECT_EQ(policy->evictable_count(), 4u);
  ASSERT_EQ(policy->evict(2, VictimFilter{marks.data(), 1}, keys, victims), 2u);
  EXPECT_EQ(victims[0], 1u);
  EXPECT_EQ(victims[1], 3u);
  EXPECT_EQ(policy->counters().resident, 2u);
}

TEST_P(VllmSemantics, ZeroChunksRefuseEveryStoreAsVllmDoes) {
  Manager m = make_vllm(0, GetParam());
  EXPECT_EQ(m.state_of(K(1)), LookupResult::kMiss);
  const auto p = m.prepare_store(Ks({1}));
  EXPECT_FALSE(p.ok());
  EXPECT_TRUE(m.prepare_store(Ks({})).ok());
  m.touch(Ks({1}));
  m.reset();
  const auto s = m.stats();
  EXPECT_EQ(s.usage, 0.0);
  EXPECT_EQ(s.write_pending_fraction, 0.0);
  ManagerConfig native;
  native.num_chunks = 0;
  EXPECT_EQ(code_of([&] { Manager n(native); }), ErrorCode::kInvalidArgument);
}

TEST_P(VllmSemantics, CompleteStoreSkipsWhatIsNotPending) {
  Manager m = make_vllm(4, GetParam());
  ASSERT_TRUE(m.prepare_store(Ks({1, 2})).ok());
  const auto done = m.complete_store(Ks({9, 1, 1, 2}), true);
  EXPECT_EQ(std::vector<std::uint32_t>(done.begin(), done.end()),
            (std::vector<std::uint32_t>{1, 3}));
  const auto events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(copy(events[0].keys), Ks({1, 2}));
  EXPECT_TRUE(m.complete_store(Ks({1}), false).empty());  // ready: untouched
  EXPECT_EQ(m.state_of(K(1)), LookupResult::kHit);
}

TEST_P(VllmSemantics, ResetWithWorkInFlightIsSilentAndKeepsCounts) {
  Manager m = make_vllm(4, GetParam(), 2, 8);
  (void)m.lookup(Ks({1}));
  (void)m.lookup(Ks({1}));
  ASSERT_EQ(m.prepare_store(Ks({1})).keys.size(), 1u);
  m.reset();  // a store in flight: allowed here
  EXPECT_TRUE(m.take_events().empty());
  EXPECT_EQ(m.stats().write_pending, 0u);
  EXPECT_EQ(m.threshold_count(K(1)), 2u);
  EXPECT_EQ(m.prepare_store(Ks({1})).keys.size(), 1u);
}

TEST_P(VllmSemantics, ThresholdTrackerForgetsTheLeastRecentlyLookedUp) {
  Manager m = make_vllm(8, GetParam(), 2, 2);
  (void)m.lookup(Ks({1}));
  (void)m.lookup(Ks({2}));
  (void)m.lookup(Ks({1}));  // 1 is now the most recent
  (void)m.lookup(Ks({3}));  // forgets 2 (native would forget 1, the first to enter)
  EXPECT_EQ(m.threshold_count(K(1)), 2u);
  EXPECT_EQ(m.threshold_count(K(2)), 0u);
  const auto p = m.prepare_store(Ks({1, 2, 3}));
  EXPECT_EQ(copy(p.keys), Ks({1}));
  EXPECT_EQ(p.skipped_threshold, 2u);
}

TEST(VllmSemanticsArc, EvictionCanFailWithCandidatesLeftInT1) {
  // T1 below its target and no T2 candidate: vLLM's ARC gives up, and nothing changes.
  Manager m = make_vllm(4, PolicyKind::kArc);
  ASSERT_TRUE(m.prepare_store(Ks({1, 2, 3, 4})).ok());
  m.complete_store(Ks({1, 2, 3, 4}), true);
  for (std::uint64_t k : {5, 6}) {  // evict 1, then 2, into B1
    ASSERT_TRUE(m.prepare_store(Ks({k})).ok());
    m.complete_store(Ks({k}), true);
  }
  m.touch(Ks({1, 2}));  // two B1 ghost hits raise the T1 target to 2
  EXPECT_EQ(m.policy().counters().recent_target, 2u);
  m.touch(Ks({3, 4, 5}));               // promoted to T2; T1 = {6}
  (void)m.prepare_load(Ks({3, 4, 5}));  // T2 has no candidate left
  const auto p = m.prepare_store(Ks({7}));
  EXPECT_FALSE(p.ok());  // although 6 is evictable: |T1| = 1 < target 2
  EXPECT_EQ(p.reason, CannotStoreReason::kNoEvictableSpace);
  EXPECT_EQ(m.state_of(K(6)), LookupResult::kHit);
  EXPECT_EQ(m.stats().evictions, 2u);
  EXPECT_EQ(m.stats().evictable, 1u);
  m.complete_load(Ks({3}));
  const auto q = m.prepare_store(Ks({7}));  // now T2 has 3
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(copy(q.evicted), Ks({3}));
}

// Random operations under the sanitizers; the invariants tie the Manager's counts to the policy's.
TEST_P(VllmSemantics, RandomOperationsKeepCountsConsistent) {
  Manager m = make_vllm(16, GetParam(), 2, 32);
  std::mt19937_64 rng(42);
  std::vector<std::vector<BlockKey>> loads, stores;
  for (int step = 0; step < 20000; ++step) {
    const auto op = rng() % 10;
    std::vector<BlockKey> keys;
    for (int i = 0, n = 1 + static_cast<int>(rng() % 6); i < n; ++i) keys.push_back(K(rng() % 64));
    if (op < 4) {
      (void)m.lookup(keys);
      m.touch(keys);
      std::vector<BlockKey> ready;
      for (const auto& k : keys) {
        if (m.state_of(k) == LookupResult::kHit) ready.push_back(k);
      }
      if (!ready.empty()) {
        (void)m.prepare_load(ready);
        loads.push_back(ready);
      }
      const auto p = m.prepare_store(keys);
      if (p.ok() && !p.keys.empty()) stores.push_back(copy(p.keys));
    } else if (op < 6 && !loads.empty()) {
      m.complete_load(loads.back());
      loads.pop_back();
    } else if (op < 9 && !stores.empty()) {
      (void)m.complete_store(stores.back(), rng() % 4 != 0);
      stores.pop_back();
    } else if (step % 997 == 0) {
      m.reset();
      loads.clear();
      stores.clear();
    }
    const auto s = m.stats();
    ASSERT_EQ(s.policy.evictable, s.evictable);
    ASSERT_EQ(s.policy.resident, s.used);
  }
}

// The Python comparison with vLLM's manager (python/tests/test_vllm_manager.py) checks the events
// kvoffload.vllm announces, which the binding builds from prepare_store's evictions and
// complete_store's completed keys; it never reads the Manager's own event list (the adapter turns
// it off). This holds that list to the same source, on random streams: a removed event with the
// victims of every prepare_store that evicted, a stored event with exactly the keys complete_store
// completed (skipped keys, failed stores and resets announce nothing), in call order.
TEST_P(VllmSemantics, EventListIsWhatTheResultsAnnounce) {
  std::mt19937_64 rng(GetParam() == PolicyKind::kLru ? 71 : 72);
  int removed = 0;
  int stored = 0;
  for (const std::uint64_t n : {3, 8, 21}) {
    Manager m = make_vllm(n, GetParam());
    using Want = std::pair<EventKind, std::vector<BlockKey>>;
    std::vector<Want> want;
    std::vector<std::vector<BlockKey>> stores;
    std::vector<std::vector<BlockKey>> loads;
    auto random_keys = [&](std::uint64_t max_len) {
      std::vector<BlockKey> keys(1 + rng() % max_len);
      for (auto& k : keys) k = K(rng() % (3 * n));
      return keys;
    };
    for (int step = 0; step < 3000; ++step) {
      SCOPED_TRACE("chunks " + std::to_string(n) + " step " + std::to_string(step));
      const auto op = rng() % 100;
      if (op < 40) {
        const StorePlan p = m.prepare_store(random_keys(n + 1));
        if (p.ok() && !p.evicted.empty()) want.emplace_back(EventKind::kRemoved, copy(p.evicted));
        if (p.ok() && !p.keys.empty()) stores.push_back(copy(p.keys));
      } else if (op < 70 && !stores.empty()) {
        std::vector<BlockKey> keys = stores.back();
        stores.pop_back();
        if (rng() % 4 == 0) keys.push_back(K(rng() % (3 * n)));  // maybe not pending: skipped
        if (rng() % 4 == 0) keys.push_back(keys.front());        // a repeat: skipped
        const bool success = rng() % 5 != 0;
        const auto done = m.complete_store(keys, success);
        std::vector<BlockKey> completed;
        for (const std::uint32_t i : done) completed.push_back(keys[i]);
        if (success && !completed.empty()) want.emplace_back(EventKind::kStored, completed);
      } else if (op < 85) {
        std::vector<BlockKey> ready;
        for (const BlockKey& k : random_keys(4)) {
          if (m.state_of(k) == LookupResult::kHit) ready.push_back(k);
        }
        if (!ready.empty()) {
          (void)m.prepare_load(ready);
          loads.push_back(ready);
        }
      } else if (op < 97 && !loads.empty()) {
        m.complete_load(loads.back());
        loads.pop_back();
      } else if (op >= 99) {
        m.reset();  // vLLM's reset_cache: silent
        stores.clear();
        loads.clear();
      }
      if (rng() % 6 == 0 || step == 2999) {
        const auto events = m.take_events();
        ASSERT_EQ(events.size(), want.size());
        for (std::size_t i = 0; i < events.size(); ++i) {
          ASSERT_EQ(events[i].kind, want[i].first) << "event " << i;
          ASSERT_EQ(copy(events[i].keys), want[i].second) << "event " << i;
          (events[i].kind == EventKind::kRemoved ? removed : stored) += 1;
        }
        want.clear();
      }
    }
  }
  EXPECT_GT(removed, 0);
  EXPECT_GT(stored, 0);
}

}  // namespace
}  // namespace kvoffload
