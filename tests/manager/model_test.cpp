// Randomised check of the Manager against a small reference model: long random operation
// sequences (valid and invalid calls), both policies, several sizes, with and without a store
// threshold. After every operation the observable state must match exactly: per-key state and
// pins, lookup results, store plans (keys, victims in order, reason), the slot of every key
// (native order: the most recently freed slot first, slot 0 first at the start), events,
// statistics and the policy counters (ARC list sizes and p). The model uses plain vectors and maps,
// O(n) per operation, written from the rules in manager.hpp / eviction_policy.hpp / arc_policy.cpp.
// Over 500 lines on purpose: the reference policy and Manager, most of it, serve this one test.
#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "manager_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;
using Key = std::uint64_t;

// ---------------------------------------------------------------------------- reference policy
struct RefPolicy {
  PolicyKind kind;
  std::uint64_t c;
  // Evictable members per list, front = most recent. LRU uses l1 only.
  std::vector<Key> l1, l2;
  std::map<Key, int> member;  // 1 = T1 (or LRU), 2 = T2
  std::vector<Key> b1, b2;    // ghosts, front = most recent
  std::uint64_t p = 0;

  std::uint64_t count(int list) const {
    return static_cast<std::uint64_t>(
        std::count_if(member.begin(), member.end(), [&](auto& e) { return e.second == list; }));
  }
  std::vector<Key>& list(int l) { return l == 1 ? l1 : l2; }
  static bool erase(std::vector<Key>& v, Key k) {
    auto it = std::find(v.begin(), v.end(), k);
    if (it == v.end()) return false;
    v.erase(it);
    return true;
  }
  bool listed(Key k) const {
    return std::find(l1.begin(), l1.end(), k) != l1.end() ||
           std::find(l2.begin(), l2.end(), k) != l2.end();
  }

  void insert(const std::vector<Key>& keys) {
    for (Key k : keys) {
      if (kind == PolicyKind::kLru) {
        member[k] = 1;
        continue;
      }
      if (erase(b1, k)) {
        // sizes before removal: |B1| + 1
        const std::uint64_t nb1 = b1.size() + 1;
        p = std::min<std::uint64_t>(c, p + std::max<std::uint64_t>(1, b2.size() / nb1));
        member[k] = 2;
      } else if (erase(b2, k)) {
        const std::uint64_t nb2 = b2.size() + 1;
        const std::uint64_t d = std::max<std::uint64_t>(1, b1.size() / nb2);
        p = p > d ? p - d : 0;
        member[k] = 2;
      } else {
        member[k] = 1;
        while (count(1) + b1.size() > c && !b1.empty()) b1.pop_back();
      }
    }
  }
  void release(const std::vector<Key>& keys) {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      auto& l = list(member.at(*it));
      erase(l, *it);
      l.insert(l.begin(), *it);
    }
  }
  void hold(const std::vector<Key>& keys) {
    for (Key k : keys) erase(list(member.at(k)), k);
  }
  void touch(const std::vector<Key>& keys) {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      const Key k = *it;
      const int m = member.at(k);
      const bool was_listed = listed(k);
      if (kind == PolicyKind::kArc && m == 1) {
        member[k] = 2;
        if (was_listed) {
          erase(l1, k);
          l2.insert(l2.begin(), k);
        }
      } else if (was_listed) {
        auto& l = list(m);
        erase(l, k);
        l.insert(l.begin(), k);
      }
    }
  }
  void remove(const std::vector<Key>& keys) {
    for (Key k : keys) {
      erase(l1, k);
      erase(l2, k);
      member.erase(k);
    }
  }
  std::vector<Key> evict(std::uint64_t n, const std::set<Key>& prot) {
    std::vector<Key> out;
    auto last_unprotected = [&](const std::vector<Key>& l) -> std::optional<Key> {
      for (auto it = l.rbegin(); it != l.rend(); ++it)
        if (!prot.count(*it)) return *it;
      return std::nullopt;
    };
    while (out.size() < n) {
      const auto c1 = last_unprotected(l1);
      const auto c2 = kind == PolicyKind::kArc ? last_unprotected(l2) : std::nullopt;
      const bool from1 = c1 && (kind == PolicyKind::kLru || count(1) > p || !c2);
      if (!from1 && !c2) break;
      const Key v = from1 ? *c1 : *c2;
      erase(from1 ? l1 : l2, v);
      member.erase(v);
      if (kind == PolicyKind::kArc) {
        if (b1.size() + b2.size() == c) {
          if (!b1.empty() && (count(1) + b1.size() >= c || b2.empty()))
            b1.pop_back();
          else
            b2.pop_back();
        }
        (from1 ? b1 : b2).insert((from1 ? b1 : b2).begin(), v);
      }
      out.push_back(v);
    }
    return out;
  }
  void reset() {
    l1.clear();
    l2.clear();
    member.clear();
    b1.clear();
    b2.clear();
    p = 0;
  }
  PolicyCounters counters() const {
    PolicyCounters pc;
    pc.resident = member.size();
    pc.evictable = l1.size() + l2.size();
    if (kind == PolicyKind::kLru) {
      pc.recent = member.size();
      return pc;
    }
    pc.recent = count(1);
    pc.frequent = count(2);
    pc.ghost_recent = b1.size();
    pc.ghost_frequent = b2.size();
    pc.recent_target = p;
    return pc;
  }
};

// ---------------------------------------------------------------------------- reference manager
struct RefManager {
  enum State { kPending, kReady };
  struct Entry {
    State state;
    std::uint32_t pins = 0;
    SlotIndex slot = kNoSlot;
  };
  std::uint64_t c;
  std::uint32_t threshold;
  std::uint64_t tracker_cap;
  RefPolicy policy;
  std::map<Key, Entry> entries;
  std::deque<std::pair<Key, std::uint32_t>> tracker;  // oldest first
  std::vector<std::pair<EventKind, std::vector<Key>>> events;
  ManagerStats stats;
  // Free slots as a stack (back = next handed out): native semantics reuse the most recently
  // freed slot first, and start with slot 0 on top.
  std::vector<SlotIndex> free_stack;

  RefManager(std::uint64_t chunks, PolicyKind kind, std::uint32_t thr, std::uint64_t cap)
      : c(chunks), threshold(thr), tracker_cap(cap), policy{kind, chunks} {
    reset_slots();
  }
  void reset_slots() {
    free_stack.clear();
    for (std::uint64_t s = c; s > 0; --s) free_stack.push_back(static_cast<SlotIndex>(s - 1));
  }
  SlotIndex slot_of(Key k) const {
    const auto it = entries.find(k);
    return it == entries.end() ? kNoSlot : it->second.slot;
  }

  bool evictable(Key k) const {
    auto it = entries.find(k);
    return it != entries.end() && it->second.state == kReady && it->second.pins == 0;
  }
  std::uint32_t tracked(Key k) const {
    for (auto& [key, n] : tracker)
      if (key == k) return n;
    return 0;
  }
  void track(Key k) {
    for (auto& [key, n] : tracker)
      if (key == k) {
        ++n;
        return;
      }
    if (tracker.size() == tracker_cap) tracker.pop_front();
    tracker.emplace_back(k, 1);
  }

  std::size_t lookup(const std::vector<Key>& keys, std::vector<LookupResult>& res) {
    std::size_t prefix = 0;
    bool in = true;
    res.clear();
    for (Key k : keys) {
      auto it = entries.find(k);
      LookupResult r = LookupResult::kMiss;
      if (it == entries.end())
        ++stats.misses;
      else if (it->second.state == kReady)
        r = LookupResult::kHit, ++stats.hits;
      else
        r = LookupResult::kHitPending, ++stats.hits_pending;
      if (in && r == LookupResult::kHit)
        ++prefix;
      else
        in = false;
      res.push_back(r);
      if (threshold > 0) track(k);
    }
    stats.lookup_keys += keys.size();
    return prefix;
  }

  struct Plan {
    bool ok = true;
    CannotStoreReason reason = CannotStoreReason::kNone;
    std::vector<Key> keys, evicted;
    std::vector<SlotIndex> slots, evicted_slots;
    std::uint64_t skipped_present = 0, skipped_threshold = 0, needed = 0, available = 0;
  };
  Plan prepare_store(const std::vector<Key>& keys, const std::vector<Key>& prot_keys) {
    Plan plan;
    std::set<Key> prot;
    for (Key k : prot_keys)
      if (entries.count(k)) prot.insert(k);
    std::set<Key> seen;
    for (Key k : keys) {
      if (entries.count(k)) {
        prot.insert(k);
        ++plan.skipped_present;
      } else if (threshold > 0 && tracked(k) < threshold) {
        ++plan.skipped_threshold;
      } else if (!seen.insert(k).second) {
        ++plan.skipped_present;
      } else {
        plan.keys.push_back(k);
      }
    }
    stats.stores_skipped_threshold += plan.skipped_threshold;
    std::uint64_t evictable_unprot = 0;
    for (auto& [k, e] : entries)
      if (evictable(k) && !prot.count(k)) ++evictable_unprot;
    const std::uint64_t free_slots = c - entries.size();
    plan.needed = plan.keys.size();
    plan.available = free_slots + evictable_unprot;
    if (plan.needed > c) {
      plan.ok = false;
      plan.reason = CannotStoreReason::kTooManyKeys;
      plan.available = c;
    } else if (plan.needed > plan.available) {
      plan.ok = false;
      plan.reason = CannotStoreReason::kNoEvictableSpace;
    }
    if (!plan.ok) {
      ++stats.allocation_failures;
      plan.keys.clear();
      return plan;
    }
    if (plan.needed > free_slots) {
      plan.evicted = policy.evict(plan.needed - free_slots, prot);
      for (Key v : plan.evicted) {
        plan.evicted_slots.push_back(entries.at(v).slot);
        free_stack.push_back(entries.at(v).slot);
        entries.erase(v);
      }
      stats.evictions += plan.evicted.size();
      events.emplace_back(EventKind::kRemoved, plan.evicted);
    }
    for (Key k : plan.keys) {
      entries[k] = Entry{kPending, 0, free_stack.back()};
      plan.slots.push_back(free_stack.back());
      free_stack.pop_back();
    }
    policy.insert(plan.keys);
    stats.stores_prepared += plan.needed;
    return plan;
  }

  // Returns the error code the real manager must throw (kOk when valid).
  ErrorCode complete_store(const std::vector<Key>& keys, bool success) {
    std::set<Key> seen;
    for (Key k : keys) {
      auto it = entries.find(k);
      if (it == entries.end()) return ErrorCode::kNotFound;
      if (it->second.state != kPending) return ErrorCode::kState;
      if (!seen.insert(k).second) return ErrorCode::kState;
    }
    if (success) {
      for (Key k : keys) entries[k].state = kReady;
      policy.release(keys);
      stats.stores_completed += keys.size();
      if (!keys.empty()) events.emplace_back(EventKind::kStored, keys);
    } else {
      policy.remove(keys);
      for (Key k : keys) {
        free_stack.push_back(entries.at(k).slot);
        entries.erase(k);
      }
      stats.stores_failed += keys.size();
    }
    return ErrorCode::kOk;
  }

  ErrorCode prepare_load(const std::vector<Key>& keys) {
    for (Key k : keys) {
      auto it = entries.find(k);
      if (it == entries.end()) return ErrorCode::kNotFound;
      if (it->second.state != kReady) return ErrorCode::kState;
    }
    std::vector<Key> held;
    for (Key k : keys)
      if (entries[k].pins++ == 0) held.push_back(k);
    policy.hold(held);
    stats.loads_prepared += keys.size();
    return ErrorCode::kOk;
  }

  ErrorCode complete_load(const std::vector<Key>& keys) {
    std::map<Key, std::uint32_t> n;
    for (Key k : keys) {
      auto it = entries.find(k);
      if (it == entries.end()) return ErrorCode::kNotFound;
      if (++n[k] > it->second.pins) return ErrorCode::kState;
    }
    std::vector<Key> released;
    for (Key k : keys)
      if (--entries[k].pins == 0) released.push_back(k);
    policy.release(released);
    stats.loads_completed += keys.size();
    return ErrorCode::kOk;
  }

  void touch(const std::vector<Key>& keys) {
    std::vector<Key> present;
    for (Key k : keys)
      if (entries.count(k)) present.push_back(k);
    policy.touch(present);
  }

  ErrorCode reset() {
    for (auto& [k, e] : entries)
      if (e.state == kPending || e.pins > 0) return ErrorCode::kState;
    std::vector<Key> removed;
    for (auto& [k, e] : entries) removed.push_back(k);
    if (!removed.empty()) events.emplace_back(EventKind::kRemoved, removed);
    entries.clear();
    policy.reset();
    tracker.clear();
    reset_slots();
    return ErrorCode::kOk;
  }
};

// ---------------------------------------------------------------------------- the test
struct ModelParams {
  PolicyKind policy;
  std::uint64_t chunks;
  std::uint32_t threshold;
};

class ManagerModel : public ::testing::TestWithParam<ModelParams> {};

std::vector<BlockKey> to_keys(const std::vector<Key>& v) {
  std::vector<BlockKey> out;
  out.reserve(v.size());
  for (Key k : v) out.push_back(K(k));
  return out;
}
std::vector<Key> from_keys(std::span<const BlockKey> v) {
  std::vector<Key> out;
  for (const auto& k : v) out.push_back(k.lo());
  return out;
}

void run_model(const ModelParams& prm, std::uint64_t seed, int steps) {
  const std::uint64_t tracker_cap = 6;
  ManagerConfig cfg;
  cfg.num_chunks = prm.chunks;
  cfg.policy = prm.policy;
  cfg.store_threshold = prm.threshold;
  cfg.threshold_tracker_capacity = tracker_cap;
  Manager m(cfg);
  RefManager ref(prm.chunks, prm.policy, prm.threshold, tracker_cap);
  std::mt19937_64 rng(seed);
  const Key universe = 3 * prm.chunks + 4;
  auto rnd = [&](std::uint64_t n) { return static_cast<std::uint64_t>(rng() % n); };
  auto random_keys = [&](std::uint64_t max_len) {
    std::vector<Key> v(rnd(max_len + 1));
    for (auto& k : v) k = rnd(universe);
    return v;
  };
  // Keys of the reference in a given state (for mostly-valid calls).
  auto pick = [&](auto pred, std::uint64_t max_len) {
    std::vector<Key> cands;
    for (auto& [k, e] : ref.entries)
      if (pred(e)) cands.push_back(k);
    std::shuffle(cands.begin(), cands.end(), rng);
    cands.resize(std::min<std::size_t>(cands.size(), rnd(max_len + 1)));
    return cands;
  };
  const std::uint64_t max_len = std::max<std::uint64_t>(2, prm.chunks + 1);

  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " step " + std::to_string(step));
    const int op = static_cast<int>(rnd(100));
    std::string what;
    if (op < 20) {
      const auto keys = random_keys(max_len);
      std::vector<LookupResult> want;
      const std::size_t want_prefix = ref.lookup(keys, want);
      std::vector<LookupResult> got(keys.size());
      ASSERT_EQ(m.lookup(to_keys(keys), got), want_prefix) << "lookup";
      ASSERT_EQ(got, want) << "lookup results";
    } else if (op < 45) {
      const auto keys = random_keys(max_len);
      const auto prot = rnd(3) == 0 ? random_keys(3) : std::vector<Key>{};
      const auto want = ref.prepare_store(keys, prot);
      const StorePlan got = m.prepare_store(to_keys(keys), to_keys(prot));
      ASSERT_EQ(got.ok(), want.ok) << "prepare_store status";
      ASSERT_EQ(got.reason, want.reason);
      ASSERT_EQ(from_keys(got.keys), want.keys) << "prepare_store keys";
      ASSERT_EQ(from_keys(got.evicted), want.evicted) << "prepare_store victims";
      ASSERT_EQ(std::vector<SlotIndex>(got.slots.begin(), got.slots.end()), want.slots)
          << "prepare_store slots";
      ASSERT_EQ(std::vector<SlotIndex>(got.evicted_slots.begin(), got.evicted_slots.end()),
                want.evicted_slots)
          << "prepare_store victims' slots";
      ASSERT_EQ(got.skipped_present, want.skipped_present);
      ASSERT_EQ(got.skipped_threshold, want.skipped_threshold);
      ASSERT_EQ(got.slots_needed, want.needed);
      ASSERT_EQ(got.slots_available, want.available);
      for (std::size_t i = 0; i < got.keys.size(); ++i)
        ASSERT_EQ(m.slot_of(got.keys[i]), got.slots[i]);
    } else if (op < 62) {
      // Mostly pending keys; sometimes a random (likely invalid) set.
      const auto keys =
          rnd(6) == 0 ? random_keys(3)
                      : pick([](auto& e) { return e.state == RefManager::kPending; }, max_len);
      const bool success = rnd(5) != 0;
      const ErrorCode want = ref.complete_store(keys, success);
      ASSERT_EQ(code_of([&] { m.complete_store(to_keys(keys), success); }), want)
          << "complete_store";
    } else if (op < 74) {
      const auto keys = rnd(6) == 0
                            ? random_keys(3)
                            : pick([](auto& e) { return e.state == RefManager::kReady; }, 3);
      const ErrorCode want = ref.prepare_load(keys);
      std::vector<SlotIndex> slots(keys.size());
      ASSERT_EQ(code_of([&] { m.prepare_load(to_keys(keys), slots); }), want) << "prepare_load";
      if (want == ErrorCode::kOk) {
        for (std::size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(slots[i], ref.slot_of(keys[i]));
      }
    } else if (op < 86) {
      auto keys = rnd(6) == 0 ? random_keys(3) : pick([](auto& e) { return e.pins > 0; }, 3);
      if (!keys.empty() && rnd(4) == 0) keys.push_back(keys[0]);  // a repeat: valid if pinned twice
      const ErrorCode want = ref.complete_load(keys);
      ASSERT_EQ(code_of([&] { m.complete_load(to_keys(keys)); }), want) << "complete_load";
    } else if (op < 98) {
      const auto keys = random_keys(max_len);
      ref.touch(keys);
      m.touch(to_keys(keys));
    } else {
      const ErrorCode want = ref.reset();
      ASSERT_EQ(code_of([&] { m.reset(); }), want) << "reset";
    }

    // Whole-state comparison.
    for (Key k = 0; k < universe; ++k) {
      auto it = ref.entries.find(k);
      const LookupResult want = it == ref.entries.end() ? LookupResult::kMiss
                                : it->second.state == RefManager::kReady
                                    ? LookupResult::kHit
                                    : LookupResult::kHitPending;
      ASSERT_EQ(m.state_of(K(k)), want) << "key " << k;
      ASSERT_EQ(m.slot_of(K(k)), ref.slot_of(k)) << "key " << k;
      ASSERT_EQ(m.pin_count(K(k)), it == ref.entries.end() ? 0u : it->second.pins) << "key " << k;
      if (prm.threshold > 0) {
        ASSERT_EQ(m.threshold_count(K(k)), ref.tracked(k)) << "key " << k;
      }
    }
    std::set<SlotIndex> slots;
    for (auto& [k, e] : ref.entries) {
      const SlotIndex s = m.slot_of(K(k));
      ASSERT_LT(s, prm.chunks);
      ASSERT_TRUE(slots.insert(s).second) << "slot " << s << " held twice";
    }
    const ManagerStats s = m.stats();
    ASSERT_EQ(s.used, ref.entries.size());
    const PolicyCounters want_pc = ref.policy.counters();
    ASSERT_EQ(s.policy.resident, want_pc.resident);
    ASSERT_EQ(s.policy.evictable, want_pc.evictable);
    ASSERT_EQ(s.evictable, want_pc.evictable);
    ASSERT_EQ(s.policy.recent, want_pc.recent);
    ASSERT_EQ(s.policy.frequent, want_pc.frequent);
    ASSERT_EQ(s.policy.ghost_recent, want_pc.ghost_recent);
    ASSERT_EQ(s.policy.ghost_frequent, want_pc.ghost_frequent);
    ASSERT_EQ(s.policy.recent_target, want_pc.recent_target);
    ASSERT_LE(s.policy.recent + s.policy.ghost_recent, prm.chunks);
    ASSERT_LE(s.policy.resident + s.policy.ghost_recent + s.policy.ghost_frequent, 2 * prm.chunks);
    ASSERT_EQ(s.hits, ref.stats.hits);
    ASSERT_EQ(s.misses, ref.stats.misses);
    ASSERT_EQ(s.hits_pending, ref.stats.hits_pending);
    ASSERT_EQ(s.evictions, ref.stats.evictions);
    ASSERT_EQ(s.allocation_failures, ref.stats.allocation_failures);
    ASSERT_EQ(s.stores_prepared, ref.stats.stores_prepared);
    ASSERT_EQ(s.stores_completed, ref.stats.stores_completed);
    ASSERT_EQ(s.stores_failed, ref.stats.stores_failed);
    ASSERT_EQ(s.stores_skipped_threshold, ref.stats.stores_skipped_threshold);
    ASSERT_EQ(s.loads_prepared, ref.stats.loads_prepared);
    ASSERT_EQ(s.loads_completed, ref.stats.loads_completed);
    if (rnd(8) == 0) {
      const auto events = m.take_events();
      ASSERT_EQ(events.size(), ref.events.size()) << "events";
      for (std::size_t i = 0; i < events.size(); ++i) {
        ASSERT_EQ(events[i].kind, ref.events[i].first);
        std::vector<Key> got = from_keys(events[i].keys);
        std::vector<Key> want = ref.events[i].second;
        if (events[i].kind == EventKind::kRemoved) {  // reset lists by slot; compare as sets
          std::sort(got.begin(), got.end());
          std::sort(want.begin(), want.end());
        }
        ASSERT_EQ(got, want);
      }
      ref.events.clear();
    }
  }
}

TEST_P(ManagerModel, RandomSequencesMatchTheReference) {
  const ModelParams prm = GetParam();
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    run_model(prm, seed * 7919 + prm.chunks, 2500);
    if (HasFatalFailure()) {
      ADD_FAILURE() << "reproduce with seed " << seed * 7919 + prm.chunks << " (policy "
                    << to_string(prm.policy) << ", chunks " << prm.chunks << ", threshold "
                    << prm.threshold << ")";
      return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, ManagerModel,
    ::testing::Values(ModelParams{PolicyKind::kLru, 1, 0}, ModelParams{PolicyKind::kLru, 4, 0},
                      ModelParams{PolicyKind::kLru, 13, 0}, ModelParams{PolicyKind::kLru, 6, 2},
                      ModelParams{PolicyKind::kArc, 1, 0}, ModelParams{PolicyKind::kArc, 4, 0},
                      ModelParams{PolicyKind::kArc, 13, 0}, ModelParams{PolicyKind::kArc, 6, 2}),
    [](const auto& pi) {
      return std::string(to_string(pi.param.policy)) + "_c" + std::to_string(pi.param.chunks) +
             "_t" + std::to_string(pi.param.threshold);
    });

}  // namespace
}  // namespace kvoffload
