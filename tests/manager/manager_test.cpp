// Manager API rules, for both policies (parameterised) unless a rule is policy-specific.
#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "manager_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

class ManagerApi : public ::testing::TestWithParam<PolicyKind> {};

// Every kind of the list (policy_kinds.h).
std::vector<PolicyKind> all_policy_kinds() {
  std::vector<PolicyKind> out;
  for (const PolicyKindName& k : kPolicyKinds) out.push_back(k.kind);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Policies, ManagerApi, ::testing::ValuesIn(all_policy_kinds()),
                         [](const auto& pi) { return std::string(to_string(pi.param)); });

TEST(ManagerConfig, Validation) {
  ManagerConfig c;
  EXPECT_EQ(code_of([&] { Manager m(c); }), ErrorCode::kInvalidArgument);  // 0 chunks
  c.num_chunks = 0x1'0000'0000ull;
  EXPECT_EQ(code_of([&] { Manager m(c); }), ErrorCode::kInvalidArgument);
  c.num_chunks = 8;
  c.policy = static_cast<PolicyKind>(9);
  EXPECT_EQ(code_of([&] { Manager m(c); }), ErrorCode::kInvalidArgument);
  c.policy = PolicyKind::kArc;
  EXPECT_EQ(code_of([&] { Manager m(c, make_lru_policy(4)); }), ErrorCode::kInvalidArgument);
  Manager ok(c, make_lru_policy(8));
  EXPECT_EQ(ok.policy().kind(), PolicyKind::kLru);  // the caller's policy wins over config.policy
  EXPECT_EQ(parse_policy_kind("ARC"), PolicyKind::kArc);
  EXPECT_EQ(code_of([] { (void)parse_policy_kind("lfu"); }), ErrorCode::kInvalidArgument);
}

// The policy kinds come from one list (policy_kinds.h): names, parsing, factories and the message
// that lists the allowed kinds all follow it.
TEST(ManagerConfig, PolicyKindsFromOneList) {
  ASSERT_EQ(std::size(kPolicyKinds), 2u);
  for (const PolicyKindName& k : kPolicyKinds) {
    EXPECT_EQ(to_string(k.kind), k.name);
    EXPECT_EQ(parse_policy_kind(k.name), k.kind);
    EXPECT_TRUE(is_policy_kind(k.kind));
    EXPECT_EQ(make_policy(k.kind, 4)->kind(), k.kind);
    EXPECT_EQ(make_policy(k.kind, 4)->name(), k.name);
    EXPECT_EQ(make_vllm_policy(k.kind, 4)->kind(), k.kind);
    EXPECT_EQ(make_vllm_policy(k.kind, 4)->name(), k.name);
  }
  EXPECT_EQ(to_string(PolicyKind::kLru), "lru");
  EXPECT_EQ(to_string(PolicyKind::kArc), "arc");
  EXPECT_EQ(to_string(static_cast<PolicyKind>(9)), "unknown");
  EXPECT_FALSE(is_policy_kind(static_cast<PolicyKind>(9)));
  EXPECT_EQ(policy_kind_names(), "lru or arc");
  EXPECT_NE(message_of([] {
              (void)parse_policy_kind("lfu");
            }).find("eviction policy 'lfu': unknown; expected lru or arc"),
            std::string::npos);
  ManagerConfig c;
  c.num_chunks = 8;
  c.policy = static_cast<PolicyKind>(9);
  EXPECT_NE(message_of([&] { Manager m(c); }).find("manager: policy 9 is unknown"),
            std::string::npos);
}

// Note [Ready slots]: while the region comes up, only slots of ready rows are handed out; a store
// that finds no ready room is skipped (never blocks), and its keys then miss.
TEST_P(ManagerApi, HandsOutOnlyReadySlotsAndGrowsWithReadiness) {
  ManagerConfig c;
  c.num_chunks = 8;
  c.policy = GetParam();
  c.ready_chunks = 0;
  Manager m(c);
  EXPECT_EQ(m.ready_chunks(), 0u);
  const StorePlan none = m.prepare_store(Ks({1}));
  EXPECT_FALSE(none.ok());
  EXPECT_EQ(none.reason, CannotStoreReason::kNoEvictableSpace);
  EXPECT_EQ(none.slots_available, 0u);
  EXPECT_EQ(m.lookup(Ks({1})), 0u);
  EXPECT_EQ(m.stats().used, 0u);

  m.set_ready_chunks(3);
  const StorePlan p = m.prepare_store(Ks({1, 2, 3, 4}));
  EXPECT_FALSE(p.ok());  // 4 keys, 3 ready slots
  EXPECT_EQ(p.slots_available, 3u);
  store(m, Ks({1, 2, 3}));
  for (auto k : Ks({1, 2, 3})) EXPECT_LT(m.slot_of(k), 3u);
  // Full: the next store evicts within the ready slots instead of taking an unready one.
  const StorePlan e = m.prepare_store(Ks({4}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e.evicted.size(), 1u);
  EXPECT_LT(e.slots[0], 3u);
  m.complete_store(Ks({4}), true);

  m.set_ready_chunks(8);
  const StorePlan more = m.prepare_store(Ks({5, 6, 7, 8, 9}));
  ASSERT_TRUE(more.ok());
  EXPECT_TRUE(more.evicted.empty());
  std::set<SlotIndex> got(more.slots.begin(), more.slots.end());
  EXPECT_EQ(got, (std::set<SlotIndex>{3, 4, 5, 6, 7}));
  m.complete_store(Ks({5, 6, 7, 8, 9}), true);
  EXPECT_EQ(m.stats().ready_chunks, 8u);
  EXPECT_EQ(m.stats().used, 8u);
  // reset keeps readiness: every ready slot is free again.
  m.reset();
  EXPECT_EQ(m.stats().used, 0u);
  EXPECT_TRUE(m.prepare_store(Ks({1, 2, 3, 4, 5, 6, 7, 8})).ok());

  // Readiness only grows, up to num_chunks.
  EXPECT_EQ(code_of([&] { m.set_ready_chunks(7); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { m.set_ready_chunks(9); }), ErrorCode::kInvalidArgument);
  c.ready_chunks = 9;
  EXPECT_EQ(code_of([&] { Manager bad(c); }), ErrorCode::kInvalidArgument);
}

TEST_P(ManagerApi, LookupHitPendingMissAndPrefix) {
  Manager m = make(8, GetParam());
  ASSERT_TRUE(m.prepare_store(Ks({1, 2, 3})).ok());
  m.complete_store(Ks({1, 2}), true);
  std::vector<LookupResult> r(4);
  EXPECT_EQ(m.lookup(Ks({1, 2, 3, 4}), r), 2u);
  EXPECT_EQ(r, (std::vector<LookupResult>{LookupResult::kHit, LookupResult::kHit,
                                          LookupResult::kHitPending, LookupResult::kMiss}));
  EXPECT_EQ(m.lookup(Ks({3, 1})), 0u);  // a pending head is no prefix
  EXPECT_EQ(m.lookup(Ks({4, 1})), 0u);  // neither is a miss
  EXPECT_EQ(m.lookup(Ks({2, 4, 1})), 1u);
  EXPECT_EQ(m.lookup({}), 0u);
  std::vector<LookupResult> small(1);
  EXPECT_EQ(code_of([&] { m.lookup(Ks({1, 2}), small); }), ErrorCode::kInvalidArgument);
  const ManagerStats s = m.stats();
  EXPECT_EQ(s.lookup_keys, 4u + 2 + 2 + 3);
  EXPECT_EQ(s.hits, 2u + 1 + 1 + 2);
  EXPECT_EQ(s.hits_pending, 2u);
  EXPECT_EQ(s.misses, 1u + 1 + 1);
}

TEST_P(ManagerApi, PrepareStoreDropsPresentAndRepeatedKeys) {
  Manager m = make(8, GetParam());
  store(m, Ks({1, 2}));
  ASSERT_TRUE(m.prepare_store(Ks({3})).ok());  // 3 pending
  const StorePlan p = m.prepare_store(Ks({1, 3, 4, 5, 4, 2}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.keys), Ks({4, 5}));
  EXPECT_EQ(p.skipped_present, 4u);  // 1, 3 (pending), the second 4, 2
  ASSERT_EQ(p.slots.size(), 2u);
  EXPECT_TRUE(p.evicted.empty());
  // Slots are distinct and not those of other keys.
  std::set<SlotIndex> used;
  for (auto k : Ks({1, 2, 3})) used.insert(m.slot_of(k));
  for (auto s : p.slots) {
    EXPECT_LT(s, 8u);
    EXPECT_TRUE(used.insert(s).second);
  }
  EXPECT_EQ(m.slot_of(K(4)), p.slots[0]);
  EXPECT_EQ(m.slot_of(K(99)), kNoSlot);
  EXPECT_EQ(m.state_of(K(4)), LookupResult::kHitPending);
  EXPECT_EQ(m.stats().write_pending, 3u);
  // Nothing new: ok with no slots.
  const StorePlan none = m.prepare_store(Ks({1, 2}));
  EXPECT_TRUE(none.ok());
  EXPECT_TRUE(none.keys.empty());
}

TEST_P(ManagerApi, EvictsWhenFullAndReusesTheSlots) {
  Manager m = make(4, GetParam());
  store(m, Ks({1}));
  store(m, Ks({2}));
  store(m, Ks({3}));
  store(m, Ks({4}));
  const SlotIndex slot1 = m.slot_of(K(1));
  const StorePlan p = m.prepare_store(Ks({5}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({1}));  // oldest, for LRU and (all in T1) for ARC
  EXPECT_EQ(p.slots[0], slot1);
  EXPECT_FALSE(m.contains(K(1)));
  EXPECT_EQ(m.stats().evictions, 1u);
}

TEST_P(ManagerApi, CannotStoreChangesNothing) {
  Manager m = make(4, GetParam());
  store(m, Ks({1, 2, 3, 4}));
  (void)m.prepare_load(Ks({1, 2, 3}));  // only 4 is evictable
  (void)m.take_events();
  const ManagerStats before = m.stats();
  const StorePlan p = m.prepare_store(Ks({5, 6}));
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.reason, CannotStoreReason::kNoEvictableSpace);
  EXPECT_EQ(p.slots_needed, 2u);
  EXPECT_EQ(p.slots_available, 1u);
  EXPECT_TRUE(p.keys.empty());
  EXPECT_TRUE(p.evicted.empty());
  EXPECT_NE(p.describe().find("only 1 slots"), std::string::npos);
  for (auto k : Ks({1, 2, 3, 4})) EXPECT_TRUE(m.contains(k));
  EXPECT_FALSE(m.contains(K(5)));
  EXPECT_TRUE(m.take_events().empty());
  const ManagerStats after = m.stats();
  EXPECT_EQ(after.allocation_failures, before.allocation_failures + 1);
  EXPECT_EQ(after.evictions, before.evictions);
  EXPECT_EQ(after.used, 4u);
  // One key fits.
  const StorePlan one = m.prepare_store(Ks({5}));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(copy(one.evicted), Ks({4}));
}

TEST_P(ManagerApi, TooManyKeys) {
  Manager m = make(4, GetParam());
  const StorePlan p = m.prepare_store(Ks({1, 2, 3, 4, 5}));
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.reason, CannotStoreReason::kTooManyKeys);
  EXPECT_EQ(m.stats().used, 0u);
  EXPECT_EQ(to_string(p.reason), "too_many_keys");
}

TEST_P(ManagerApi, NeverEvictsProtectedKeys) {
  Manager m = make(4, GetParam());
  for (auto k : Ks({1, 2, 3, 4})) store(m, {k});  // 1 oldest
  // The call's own present key 1 is protected: 2 goes instead.
  StorePlan p = m.prepare_store(Ks({1, 5}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({2}));
  m.complete_store(Ks({5}), true);
  // An extra protected set: 3 and 4 (the oldest two) are skipped, 1 goes.
  p = m.prepare_store(Ks({6}), Ks({3, 4, 77}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({1}));
  m.complete_store(Ks({6}), true);
  // Everything protected: cannot store.
  p = m.prepare_store(Ks({7, 3}), Ks({4, 5, 6}));
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.reason, CannotStoreReason::kNoEvictableSpace);
  EXPECT_EQ(p.slots_available, 0u);
}

TEST_P(ManagerApi, PinnedAndPendingAreNeverEvicted) {
  Manager m = make(4, GetParam());
  store(m, Ks({1}));
  store(m, Ks({2}));
  ASSERT_TRUE(m.prepare_store(Ks({3})).ok());  // pending, never completed
  (void)m.prepare_load(Ks({1}));               // pinned
  StorePlan p = m.prepare_store(Ks({4, 5}));   // 1 free + 2 evictable
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({2}));
  EXPECT_TRUE(m.contains(K(1)));
  EXPECT_TRUE(m.contains(K(3)));
  p = m.prepare_store(Ks({6}));
  EXPECT_FALSE(p.ok());  // 1 pinned, 3, 4, 5 pending
  m.complete_load(Ks({1}));
  p = m.prepare_store(Ks({6}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({1}));
}

TEST_P(ManagerApi, CompleteStoreFailureFreesSlots) {
  Manager m = make(2, GetParam());
  ASSERT_TRUE(m.prepare_store(Ks({1, 2})).ok());
  (void)m.take_events();
  m.complete_store(Ks({2, 1}), false);
  EXPECT_FALSE(m.contains(K(1)));
  EXPECT_FALSE(m.contains(K(2)));
  EXPECT_EQ(m.stats().used, 0u);
  EXPECT_EQ(m.stats().write_pending, 0u);
  EXPECT_EQ(m.stats().stores_failed, 2u);
  EXPECT_TRUE(m.take_events().empty());  // never announced, so nothing removed
  EXPECT_EQ(m.stats().policy.resident, 0u);
  const StorePlan p = m.prepare_store(Ks({3, 4}));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p.evicted.empty());
}

TEST_P(ManagerApi, CompleteStoreMisuse) {
  Manager m = make(4, GetParam());
  store(m, Ks({1}));
  ASSERT_TRUE(m.prepare_store(Ks({2})).ok());
  EXPECT_EQ(code_of([&] { m.complete_store(Ks({2, 9}), true); }), ErrorCode::kNotFound);
  EXPECT_EQ(code_of([&] { m.complete_store(Ks({2, 1}), true); }), ErrorCode::kState);
  EXPECT_EQ(code_of([&] { m.complete_store(Ks({2, 2}), false); }), ErrorCode::kState);
  EXPECT_NE(message_of([&] { m.complete_store(Ks({1}), true); }).find(K(1).to_hex()),
            std::string::npos);
  // Each refused call changed nothing: 2 is still pending and completes now.
  EXPECT_EQ(m.state_of(K(2)), LookupResult::kHitPending);
  m.complete_store(Ks({2}), true);
  EXPECT_EQ(m.state_of(K(2)), LookupResult::kHit);
  EXPECT_EQ(code_of([&] { m.complete_store(Ks({2}), true); }), ErrorCode::kState);
}

TEST_P(ManagerApi, LoadsPinWithRefcounts) {
  Manager m = make(2, GetParam());
  store(m, Ks({1, 2}));
  std::vector<SlotIndex> slots(2);
  m.prepare_load(Ks({1, 2}), slots);
  EXPECT_EQ(slots[0], m.slot_of(K(1)));
  EXPECT_EQ(slots[1], m.slot_of(K(2)));
  const auto view = m.prepare_load(Ks({1}));
  EXPECT_EQ(view[0], m.slot_of(K(1)));
  EXPECT_EQ(m.pin_count(K(1)), 2u);
  EXPECT_EQ(m.stats().pinned, 2u);
  m.complete_load(Ks({1, 2}));
  EXPECT_EQ(m.pin_count(K(1)), 1u);
  EXPECT_EQ(m.pin_count(K(2)), 0u);
  StorePlan p = m.prepare_store(Ks({3}));  // only 2 is evictable
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(copy(p.evicted), Ks({2}));
  m.complete_store(Ks({3}), true);
  m.complete_load(Ks({1}));
  EXPECT_EQ(m.stats().pinned, 0u);
  p = m.prepare_store(Ks({4, 5}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.evicted.size(), 2u);
}

TEST_P(ManagerApi, LoadMisuse) {
  Manager m = make(4, GetParam());
  store(m, Ks({1, 2}));
  ASSERT_TRUE(m.prepare_store(Ks({3})).ok());
  EXPECT_EQ(code_of([&] { (void)m.prepare_load(Ks({1, 9})); }), ErrorCode::kNotFound);
  EXPECT_EQ(code_of([&] { (void)m.prepare_load(Ks({1, 3})); }), ErrorCode::kState);
  EXPECT_EQ(m.pin_count(K(1)), 0u);  // refused calls pinned nothing
  std::vector<SlotIndex> small(1);
  EXPECT_EQ(code_of([&] { m.prepare_load(Ks({1, 2}), small); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { m.complete_load(Ks({1})); }), ErrorCode::kState);  // not pinned
  EXPECT_NE(message_of([&] { m.complete_load(Ks({1})); }).find("not pinned"), std::string::npos);
  EXPECT_EQ(code_of([&] { m.complete_load(Ks({9})); }), ErrorCode::kNotFound);
  (void)m.prepare_load(Ks({1, 2}));
  EXPECT_EQ(code_of([&] { m.complete_load(Ks({2, 1, 1})); }), ErrorCode::kState);  // 1 pinned once
  EXPECT_EQ(m.pin_count(K(1)), 1u);  // refused call released nothing
  EXPECT_EQ(m.pin_count(K(2)), 1u);
  (void)m.prepare_load(Ks({1}));
  m.complete_load(Ks({2, 1, 1}));  // now 1 has two pins
  EXPECT_EQ(m.stats().pinned, 0u);
}

TEST(ManagerLru, TouchLeavesThePrefixHeadMostRecent) {
  Manager m = make(4, PolicyKind::kLru);
  store(m, Ks({1, 2, 3, 4}));  // one request: 1 is the head, evicted last
  EXPECT_EQ(store(m, Ks({5})), Ks({4}));
  m.touch(Ks({1, 2, 3, 99}));  // absent keys are ignored
  m.touch(Ks({3, 5}));         // 3 most recent, then 5, then 1, 2
  EXPECT_EQ(store(m, Ks({6})), Ks({2}));
  EXPECT_EQ(store(m, Ks({7, 8})), Ks({1, 5}));
  EXPECT_TRUE(m.contains(K(3)));
}

TEST_P(ManagerApi, ResetRules) {
  Manager m = make(4, GetParam());
  store(m, Ks({1, 2}));
  (void)m.prepare_load(Ks({1}));
  EXPECT_EQ(code_of([&] { m.reset(); }), ErrorCode::kState);
  m.complete_load(Ks({1}));
  ASSERT_TRUE(m.prepare_store(Ks({3})).ok());
  EXPECT_NE(message_of([&] { m.reset(); }).find("1 stores pending"), std::string::npos);
  m.complete_store(Ks({3}), true);
  (void)m.take_events();
  m.lookup(Ks({1}));
  m.reset();
  for (auto k : Ks({1, 2, 3})) EXPECT_FALSE(m.contains(k));
  const auto events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, EventKind::kRemoved);
  std::vector<BlockKey> removed = copy(events[0].keys);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, Ks({1, 2, 3}));
  const ManagerStats s = m.stats();
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.policy.resident, 0u);
  EXPECT_EQ(s.policy.ghost_recent + s.policy.ghost_frequent, 0u);
  EXPECT_EQ(s.hits, 1u);  // counters survive reset; reset_stats clears them
  m.reset_stats();
  EXPECT_EQ(m.stats().hits, 0u);
  // Fully usable again.
  store(m, Ks({5, 6, 7, 8}));
  EXPECT_EQ(m.stats().used, 4u);
}

TEST_P(ManagerApi, EventsRemovedBeforeStoredAndViewsStable) {
  Manager m = make(2, GetParam());
  store(m, Ks({1}));
  store(m, Ks({2}));
  const StorePlan p = m.prepare_store(Ks({3, 4}));
  ASSERT_TRUE(p.ok());
  m.complete_store(Ks({3, 4}), true);
  const auto events = m.take_events();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].kind, EventKind::kStored);
  EXPECT_EQ(copy(events[0].keys), Ks({1}));
  EXPECT_EQ(events[1].kind, EventKind::kStored);
  EXPECT_EQ(events[2].kind, EventKind::kRemoved);  // one batch with both victims
  std::vector<BlockKey> removed = copy(events[2].keys);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, Ks({1, 2}));
  EXPECT_EQ(events[3].kind, EventKind::kStored);
  EXPECT_EQ(copy(events[3].keys), Ks({3, 4}));
  // More operations do not disturb the drained view.
  const std::vector<BlockKey> first = copy(events[0].keys);
  store(m, Ks({5, 6}));
  EXPECT_EQ(copy(events[0].keys), first);
  EXPECT_EQ(m.take_events().size(), 2u);
  EXPECT_TRUE(m.take_events().empty());
}

TEST(ManagerEvents, OffRecordsNothing) {
  ManagerConfig c;
  c.num_chunks = 1;
  c.record_events = false;
  Manager m(c);
  store(m, Ks({1}));
  store(m, Ks({2}));
  EXPECT_TRUE(m.take_events().empty());
}

TEST_P(ManagerApi, StatsFractions) {
  Manager m = make(10, GetParam());
  store(m, Ks({1, 2, 3, 4}));
  ASSERT_TRUE(m.prepare_store(Ks({5, 6})).ok());
  (void)m.prepare_load(Ks({1, 2, 3}));
  (void)m.prepare_load(Ks({1}));
  const ManagerStats s = m.stats();
  EXPECT_EQ(s.num_chunks, 10u);
  EXPECT_EQ(s.used, 6u);
  EXPECT_EQ(s.write_pending, 2u);
  EXPECT_EQ(s.pinned, 3u);
  EXPECT_EQ(s.evictable, 1u);
  EXPECT_DOUBLE_EQ(s.usage, 0.6);
  EXPECT_DOUBLE_EQ(s.write_pending_fraction, 0.2);
  EXPECT_DOUBLE_EQ(s.pinned_fraction, 0.3);
  EXPECT_EQ(s.stores_prepared, 6u);
  EXPECT_EQ(s.stores_completed, 4u);
  EXPECT_EQ(s.loads_prepared, 4u);
  EXPECT_EQ(s.policy.resident, 6u);
  EXPECT_EQ(s.policy.evictable, 1u);
}

TEST_P(ManagerApi, StoreThreshold) {
  Manager m = make(8, GetParam(), /*threshold=*/2);
  m.lookup(Ks({1, 2}));
  StorePlan p = m.prepare_store(Ks({1, 2}));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p.keys.empty());
  EXPECT_EQ(p.skipped_threshold, 2u);
  m.lookup(Ks({1}));
  EXPECT_EQ(m.threshold_count(K(1)), 2u);
  p = m.prepare_store(Ks({1, 2}));
  EXPECT_EQ(copy(p.keys), Ks({1}));
  EXPECT_EQ(p.skipped_threshold, 1u);
  EXPECT_EQ(m.stats().stores_skipped_threshold, 3u);
  // Never looked up: never stored.
  EXPECT_TRUE(m.prepare_store(Ks({3})).keys.empty());
}

TEST(ManagerThreshold, TrackerIsBoundedAndForgetsTheOldest) {
  Manager m = make(8, PolicyKind::kLru, /*threshold=*/2, /*tracker=*/2);
  m.lookup(Ks({1}));
  m.lookup(Ks({2}));
  m.lookup(Ks({1}));  // 1 counted twice, still the oldest entry
  m.lookup(Ks({3}));  // full: 1 is forgotten
  EXPECT_EQ(m.threshold_count(K(1)), 0u);
  EXPECT_EQ(m.threshold_count(K(2)), 1u);
  EXPECT_EQ(m.threshold_count(K(3)), 1u);
  EXPECT_TRUE(m.prepare_store(Ks({1})).keys.empty());
  m.lookup(Ks({3}));
  EXPECT_EQ(copy(m.prepare_store(Ks({3})).keys), Ks({3}));
  ManagerConfig c;
  c.num_chunks = 8;
  c.store_threshold = 1;
  EXPECT_EQ(Manager(c).stats().num_chunks, 8u);  // tracker capacity defaulted
}

TEST_P(ManagerApi, ManyChunksKeepsIndexConsistent) {
  // Enough churn to wrap the key index many times (backward-shift deletion paths).
  Manager m = make(1000, GetParam());
  for (std::uint64_t round = 0; round < 20; ++round) {
    std::vector<BlockKey> keys;
    for (std::uint64_t i = 0; i < 300; ++i) keys.push_back(K(round * 300 + i));
    store(m, keys);
  }
  EXPECT_EQ(m.stats().used, 1000u);
  EXPECT_EQ(m.stats().evictions, 5000u);
  std::set<SlotIndex> slots;
  for (std::uint64_t k = 0; k < 6000; ++k) {
    if (m.contains(K(k))) {
      EXPECT_TRUE(slots.insert(m.slot_of(K(k))).second);
    }
  }
  EXPECT_EQ(slots.size(), 1000u);
}

TEST(ManagerMove, MovedManagerWorks) {
  Manager a = make(4, PolicyKind::kArc);
  store(a, Ks({1}));
  Manager b = std::move(a);
  EXPECT_TRUE(b.contains(K(1)));
}

}  // namespace
}  // namespace kvoffload
