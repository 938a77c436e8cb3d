// The node pool against a reference model of one shared LRU or ARC over random multi-tenant
// operation streams: every outcome (hits, cross-engine hits, slots, positions, evicted keys, skip
// counts) and the whole index after every operation (each slot's state, key, owner, pins, list;
// the LRU / T1 / T2 order; ARC's ghosts, counts and target) must be the model's, and
// check_invariants must hold throughout. The ARC model is held to the private Manager's ARC on
// single-tenant streams (ArcAgreesWithTheManager), so it is not a second invention.
#include <algorithm>
#include <deque>
#include <list>
#include <optional>
#include <random>
#include <tuple>

#include <gtest/gtest.h>

#include <kvoffload/manager.hpp>

#include "pool_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload::pool {
namespace {

using test::small_options;

// One shared LRU or ARC, slot by slot: free slots are taken most recently freed first (slot 0
// first at the start), an evicted slot is reused at once, the evictable (ready, unpinned) slots
// form the LRU (ARC: T1 and T2; front most recent), every key of a store call that is ready
// already is protected, a tenant at its cap evicts its own least recent chunk only. ARC is the
// paper's as the private Manager has it (ArcAgreesWithTheManager below holds the two together).
class Model {
 public:
  struct Slot {
    SlotState state = SlotState::kFree;
    BlockKey key;
    std::uint32_t owner = kNoTenant;
    std::uint32_t engine = kNoTenant;  // which tenant's engine stored it
    std::vector<std::uint32_t> pins;
    std::uint32_t list = 0;  // 0: the LRU / T1, 1: T2
  };
  Model(std::uint32_t n, std::uint32_t tenants, PolicyKind policy)
      : slots_(n), caps_(tenants, 0), own_(tenants), arc_(policy == PolicyKind::kArc) {
    for (auto& s : slots_) s.pins.assign(tenants, 0);
    for (std::uint32_t i = 0; i < n; ++i) free_.push_back(i);
  }
  void set_cap(std::uint32_t t, std::uint32_t cap) { caps_[t] = cap; }
  std::uint64_t ghost_hits() const { return ghost_hits_; }
  std::uint64_t promotions() const { return promotions_; }

  std::uint32_t find(const BlockKey& k) const {
    for (std::uint32_t s = 0; s < slots_.size(); ++s)
      if (slots_[s].state != SlotState::kFree && slots_[s].key == k) return s;
    return kNoTenant;
  }
  bool pinned(std::uint32_t s) const {
    return std::any_of(slots_[s].pins.begin(), slots_[s].pins.end(), [](auto p) { return p != 0; });
  }

  struct Lookup {
    std::vector<std::uint32_t> slots;
    std::uint32_t cross = 0;
  };
  Lookup lookup(std::uint32_t t, const std::vector<BlockKey>& keys, bool pin) {
    Lookup out;
    for (const auto& k : keys) {
      const std::uint32_t s = find(k);
      if (s == kNoTenant || slots_[s].state != SlotState::kReady) break;
      out.slots.push_back(s);
      if (slots_[s].engine != t) ++out.cross;
    }
    for (std::size_t j = out.slots.size(); j-- > 0;) {
      const std::uint32_t s = out.slots[j];
      if (pin) {
        if (!pinned(s)) leave(s);
        ++slots_[s].pins[t];
        promote(s);
      } else if (!pinned(s)) {
        leave(s);
        promote(s);
        enter(s);
      } else {
        promote(s);
      }
    }
    return out;
  }

  struct Store {
    std::vector<std::uint32_t> positions, slots;
    std::vector<BlockKey> evicted;
    std::uint32_t present = 0, writing = 0, no_room = 0, cap = 0;
  };
  Store prepare(std::uint32_t t, const std::vector<BlockKey>& keys, std::uint32_t first,
                const std::vector<std::uint32_t>& protect_slots) {
    Store out;
    std::vector<bool> prot(slots_.size(), false);
    for (std::uint32_t i = 0; i < first; ++i) prot[protect_slots[i]] = true;
    for (std::uint32_t i = first; i < keys.size(); ++i) {
      const std::uint32_t p = find(keys[i]);
      if (p != kNoTenant && slots_[p].state == SlotState::kReady) prot[p] = true;
    }
    int stopped = 0;  // 1 no room, 2 cap
    for (std::uint32_t i = first; i < keys.size(); ++i) {
      const std::uint32_t p = find(keys[i]);
      if (p != kNoTenant) {
        ++(slots_[p].state == SlotState::kReady ? out.present : out.writing);
        continue;
      }
      if (stopped != 0) {
        ++(stopped == 2 ? out.cap : out.no_room);
        continue;
      }
      const bool own_only = caps_[t] != 0 && occupancy(t) >= caps_[t];
      std::uint32_t s = kNoTenant;
      if (!own_only && !free_.empty()) {
        s = free_.front();
        free_.pop_front();
      } else {
        s = victim(t, own_only, prot);
        if (s == kNoTenant) {
          stopped = own_only ? 2 : 1;
          ++(stopped == 2 ? out.cap : out.no_room);
          continue;
        }
        out.evicted.push_back(slots_[s].key);
        leave(s);
        slots_[s].state = SlotState::kFree;
        --count_[slots_[s].list];
        add_ghost(slots_[s].key, slots_[s].list);
      }
      const std::uint32_t list = admit(keys[i]);
      slots_[s].state = SlotState::kWriting;
      slots_[s].key = keys[i];
      slots_[s].owner = t;
      slots_[s].engine = t;
      slots_[s].list = list;
      ++count_[list];
      out.positions.push_back(i);
      out.slots.push_back(s);
    }
    return out;
  }
  void commit(const std::vector<std::uint32_t>& slots) {
    for (const auto s : slots) {
      slots_[s].state = SlotState::kReady;
      enter(s);
    }
  }
  void abort(const std::vector<std::uint32_t>& slots) {
    for (const auto s : slots) free_slot(s);
  }
  void unpin(std::uint32_t t, const std::vector<std::uint32_t>& slots) {
    for (const auto s : slots) {
      --slots_[s].pins[t];
      if (!pinned(s)) enter(s);
    }
  }
  void detach(std::uint32_t t) {
    for (std::uint32_t s = 0; s < slots_.size(); ++s) {
      Slot& r = slots_[s];
      if (r.state == SlotState::kWriting && r.owner == t) {
        free_slot(s);
        continue;
      }
      if (r.state == SlotState::kReady && r.owner == t) {
        if (!pinned(s)) own_[t].remove(s);
        r.owner = kNoTenant;
      }
      if (r.pins[t] != 0) {
        r.pins[t] = 0;
        if (!pinned(s)) enter(s);
      }
    }
  }
  std::uint32_t occupancy(std::uint32_t t) const {
    return static_cast<std::uint32_t>(
        std::count_if(slots_.begin(), slots_.end(),
                      [t](const Slot& s) { return s.state != SlotState::kFree && s.owner == t; }));
  }

  // Differences between the pool's snapshot and ARC state and the model ("" when none).
  // index_of maps the model's tenant to the pool's tenant index.
  std::string compare(const std::vector<SlotView>& snap, const ArcState& arc,
                      const std::vector<std::uint32_t>& index_of) const {
    std::string diff;
    for (std::uint32_t s = 0; s < slots_.size(); ++s) {
      const Slot& m = slots_[s];
      const SlotView& v = snap[s];
      std::uint64_t mask = 0;
      for (std::uint32_t t = 0; t < m.pins.size(); ++t)
        if (m.pins[t] != 0) mask |= std::uint64_t{1} << index_of[t];
      const std::uint32_t owner = m.owner == kNoTenant ? kNoTenant : index_of[m.owner];
      if (v.state != m.state ||
          (m.state != SlotState::kFree &&
           (v.key != m.key || v.owner != owner || v.list != m.list)) ||
          v.pin_mask != mask)
        diff += "slot " + std::to_string(s) + " differs; ";
    }
    for (std::uint32_t list = 0; list < 2; ++list) {
      std::vector<std::pair<std::uint64_t, std::uint32_t>> order;
      for (const SlotView& v : snap)
        if (v.state == SlotState::kReady && v.pin_mask == 0 && v.list == list)
          order.emplace_back(v.stamp, v.slot);
      std::sort(order.rbegin(), order.rend());
      std::vector<std::uint32_t> pool_list;
      pool_list.reserve(order.size());
      for (const auto& o : order) pool_list.push_back(o.second);
      if (pool_list != std::vector<std::uint32_t>(lists_[list].begin(), lists_[list].end()))
        diff += (list == 0 ? "LRU/T1" : "T2") + std::string(" order differs; ");
    }
    if (arc.t1 != count_[0] || arc.t2 != count_[1] || arc.target != p_)
      diff += "|T1| " + std::to_string(arc.t1) + " / |T2| " + std::to_string(arc.t2) + " / p " +
              std::to_string(arc.target) + ", the model's " + std::to_string(count_[0]) + " / " +
              std::to_string(count_[1]) + " / " + std::to_string(p_) + "; ";
    if (arc.b1 != std::vector<BlockKey>(ghosts_[0].begin(), ghosts_[0].end()))
      diff += "B1 differs; ";
    if (arc.b2 != std::vector<BlockKey>(ghosts_[1].begin(), ghosts_[1].end()))
      diff += "B2 differs; ";
    return diff;
  }

 private:
  std::uint64_t capacity() const { return slots_.size(); }
  // An evictable slot joins its list and its owner's at the most recent end; leaving, both.
  void enter(std::uint32_t s) {
    lists_[slots_[s].list].push_front(s);
    if (slots_[s].owner != kNoTenant) own_[slots_[s].owner].push_front(s);
  }
  void leave(std::uint32_t s) {
    lists_[slots_[s].list].remove(s);
    if (slots_[s].owner != kNoTenant) own_[slots_[s].owner].remove(s);
  }
  void promote(std::uint32_t s) {
    if (!arc_ || slots_[s].list != 0) return;
    slots_[s].list = 1;
    --count_[0];
    ++count_[1];
    ++promotions_;
  }
  std::uint32_t last_unprotected(const std::list<std::uint32_t>& l,
                                 const std::vector<bool>& prot) const {
    for (auto it = l.rbegin(); it != l.rend(); ++it)
      if (!prot[*it]) return *it;
    return kNoTenant;
  }
  std::uint32_t victim(std::uint32_t t, bool own_only, const std::vector<bool>& prot) const {
    if (own_only) return last_unprotected(own_[t], prot);
    const std::uint32_t c1 = last_unprotected(lists_[0], prot);
    if (!arc_) return c1;
    const std::uint32_t c2 = last_unprotected(lists_[1], prot);
    return c1 != kNoTenant && (count_[0] > p_ || c2 == kNoTenant) ? c1 : c2;
  }
  void add_ghost(const BlockKey& k, std::uint32_t from) {
    if (!arc_) return;
    if (ghosts_[0].size() + ghosts_[1].size() == capacity()) {
      const bool b1 = !ghosts_[0].empty() &&
                      (count_[0] + ghosts_[0].size() >= capacity() || ghosts_[1].empty());
      ghosts_[b1 ? 0 : 1].pop_back();
    }
    ghosts_[from].push_front(k);
  }
  std::uint32_t admit(const BlockKey& k) {
    if (!arc_) return 0;
    for (std::uint32_t list = 0; list < 2; ++list) {
      const auto it = std::find(ghosts_[list].begin(), ghosts_[list].end(), k);
      if (it == ghosts_[list].end()) continue;
      const std::uint64_t b1 = ghosts_[0].size(), b2 = ghosts_[1].size();
      if (list == 0) {
        p_ = std::min<std::uint64_t>(capacity(), p_ + std::max<std::uint64_t>(1, b2 / b1));
      } else {
        const std::uint64_t d = std::max<std::uint64_t>(1, b1 / b2);
        p_ = p_ > d ? p_ - d : 0;
      }
      ghosts_[list].erase(it);
      ++ghost_hits_;
      return 1;
    }
    while (count_[0] + 1 + ghosts_[0].size() > capacity() && !ghosts_[0].empty())
      ghosts_[0].pop_back();
    return 0;
  }
  void free_slot(std::uint32_t s) {
    --count_[slots_[s].list];
    slots_[s].state = SlotState::kFree;
    slots_[s].owner = kNoTenant;
    free_.push_front(s);
  }
  std::vector<Slot> slots_;
  std::deque<std::uint32_t> free_;
  std::list<std::uint32_t> lists_[2];
  std::vector<std::uint32_t> caps_;
  std::vector<std::list<std::uint32_t>> own_;  // each tenant's evictable slots, most recent first
  bool arc_;
  std::uint64_t count_[2] = {0, 0};  // |T1|, |T2|: writing + ready
  std::uint64_t p_ = 0;
  std::list<BlockKey> ghosts_[2];  // B1, B2, most recent first
  std::uint64_t ghost_hits_ = 0, promotions_ = 0;
};

// One store by tenant t, prepare_stores (or with cycle, lookup_and_prepare, its hits pinned with
// pin and appended to pins), on the pool and the model: every outcome must be the model's.
// Returns the model's outcome; first is the lookup's hit count (0 without cycle).
Model::Store store_both(NodePool& p, Model& model, std::uint32_t t, const std::vector<BlockKey>& ks,
                        bool cycle, bool pin, std::vector<std::uint32_t>& pins,
                        std::uint32_t& first) {
  StoreOutcome got;
  Model::Store want;
  first = 0;
  if (cycle) {
    const NodePool::Cycle c = p.lookup_and_prepare(ks, pin);
    const Model::Lookup wl = model.lookup(t, ks, pin);
    EXPECT_EQ(std::vector<std::uint32_t>(c.lookup.slots.begin(), c.lookup.slots.end()), wl.slots)
        << "lookup";
    if (pin) pins.insert(pins.end(), wl.slots.begin(), wl.slots.end());
    got = c.store;
    first = c.lookup.hits;
    want = model.prepare(t, ks, first, wl.slots);
  } else {
    got = p.prepare_stores(ks);
    want = model.prepare(t, ks, 0, {});
  }
  EXPECT_EQ(std::vector<std::uint32_t>(got.slots.begin(), got.slots.end()), want.slots);
  EXPECT_EQ(std::vector<std::uint32_t>(got.positions.begin(), got.positions.end()), want.positions);
  EXPECT_EQ(std::vector<BlockKey>(got.evicted.begin(), got.evicted.end()), want.evicted);
  EXPECT_EQ(got.skipped_present, want.present);
  EXPECT_EQ(got.skipped_writing, want.writing);
  EXPECT_EQ(got.skipped_no_room, want.no_room);
  EXPECT_EQ(got.skipped_cap, want.cap);
  return want;
}

class PoolModel : public ::testing::TestWithParam<std::tuple<PolicyKind, std::uint32_t>> {};

TEST_P(PoolModel, RandomMultiTenantStreamsMatchTheReferenceModel) {
  constexpr std::uint32_t kSlots = 12, kTenants = 3, kUniverse = 20, kOps = 2000;
  const kvoffload::test::TempDir dir;
  const PolicyKind policy = std::get<0>(GetParam());
  const std::uint32_t seed = std::get<1>(GetParam());
  std::mt19937_64 rng(seed);
  Model model(kSlots, kTenants, policy);
  std::vector<std::optional<NodePool>> pools(kTenants);
  std::vector<std::uint32_t> index_of(kTenants);
  std::vector<std::vector<std::uint32_t>> writing(kTenants), pins(kTenants);
  // Tenant 2 has a cap of 4 chunks: it may only evict its own once it holds 4.
  auto attach = [&](std::uint32_t t) {
    auto o = small_options(dir.path(), "engine" + std::to_string(t), kSlots);
    o.policy = policy;
    if (t == 2) o.cap_bytes = 4 * 2 * 512;  // 4 chunks of 2 ranks x 512 bytes
    pools[t].emplace(NodePool::attach(o));
    index_of[t] = pools[t]->tenant_index();
    if (t == 2) model.set_cap(t, 4);
  };
  for (std::uint32_t t = 0; t < kTenants; ++t) attach(t);
  auto pick = [&](std::uint64_t n) { return static_cast<std::uint32_t>(rng() % n); };
  auto request = [&] {
    // A prefix-like run of keys from a small universe (shared prefixes across tenants).
    const std::uint32_t start = pick(kUniverse), len = 1 + pick(5);
    std::vector<BlockKey> ks;
    for (std::uint32_t i = 0; i < len; ++i) ks.push_back(test::key((start + i) % kUniverse));
    return ks;
  };
  auto take_some = [&](std::vector<std::uint32_t>& from) {
    std::shuffle(from.begin(), from.end(), rng);
    const std::size_t n = from.empty() ? 0 : 1 + pick(from.size());
    std::vector<std::uint32_t> out(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
    from.erase(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
    return out;
  };
  std::uint64_t evictions = 0, cap_skips = 0, no_room = 0, cross = 0, hits = 0;
  for (std::uint32_t op = 0; op < kOps; ++op) {
    const std::uint32_t t = pick(kTenants);
    NodePool& p = *pools[t];
    const std::uint32_t what = pick(100);
    std::string step = "op " + std::to_string(op) + " tenant " + std::to_string(t) + ": ";
    if (what < 20) {
      const auto ks = request();
      const bool pin = pick(2) == 0;
      const LookupOutcome got = p.lookup(ks, pin);
      const Model::Lookup want = model.lookup(t, ks, pin);
      ASSERT_EQ(std::vector<std::uint32_t>(got.slots.begin(), got.slots.end()), want.slots)
          << step << "lookup";
      ASSERT_EQ(got.cross_engine_hits, want.cross) << step;
      cross += want.cross;
      hits += want.slots.size();
      if (pin) pins[t].insert(pins[t].end(), want.slots.begin(), want.slots.end());
      step += "lookup";
    } else if (what < 50) {
      const bool cycle = what < 35;
      std::uint32_t first = 0;
      const Model::Store want =
          store_both(p, model, t, request(), cycle, pick(2) == 0, pins[t], first);
      ASSERT_FALSE(HasFailure()) << step << (cycle ? "lookup_and_prepare" : "prepare");
      writing[t].insert(writing[t].end(), want.slots.begin(), want.slots.end());
      evictions += want.evicted.size();
      cap_skips += want.cap;
      no_room += want.no_room;
      step += cycle ? "lookup_and_prepare" : "prepare";
    } else if (what < 75) {
      const auto done = take_some(writing[t]);
      if (pick(5) == 0) {
        p.abort_stores(done);
        model.abort(done);
      } else {
        p.commit_stores(done);
        model.commit(done);
      }
      step += "commit/abort";
    } else if (what < 97) {
      const auto done = take_some(pins[t]);
      p.unpin(done);
      model.unpin(t, done);
      step += "unpin";
    } else {
      p.detach();
      model.detach(t);
      writing[t].clear();
      pins[t].clear();
      attach(t);
      step += "detach and attach";
    }
    const std::uint32_t observer = (t + 1) % kTenants;
    ASSERT_EQ(model.compare(pools[observer]->snapshot(), pools[observer]->arc_state(), index_of),
              "")
        << step;
    ASSERT_EQ(test::joined(pools[observer]->check_invariants()), "") << step;
  }
  // The streams reach every rule the model states.
  EXPECT_GT(hits, 0U);
  EXPECT_GT(cross, 0U);
  EXPECT_GT(evictions, 0U);
  EXPECT_GT(cap_skips, 0U);
  EXPECT_GT(no_room, 0U);
  if (policy == PolicyKind::kArc) {
    EXPECT_GT(model.ghost_hits(), 0U);
    EXPECT_GT(model.promotions(), 0U);
  }
  (void)std::printf(
      "%s seed %u: %lu hits (%lu cross-engine), %lu evictions, %lu cap skips, %lu no-room skips, "
      "%lu ghost hits, %lu T1 -> T2\n",
      std::string(to_string(policy)).c_str(), seed, static_cast<unsigned long>(hits),
      static_cast<unsigned long>(cross), static_cast<unsigned long>(evictions),
      static_cast<unsigned long>(cap_skips), static_cast<unsigned long>(no_room),
      static_cast<unsigned long>(model.ghost_hits()),
      static_cast<unsigned long>(model.promotions()));
}

INSTANTIATE_TEST_SUITE_P(Seeds, PoolModel,
                         ::testing::Combine(::testing::Values(PolicyKind::kLru, PolicyKind::kArc),
                                            ::testing::Values(1U, 2U, 3U, 4U)),
                         [](const auto& param_info) {
                           return std::string(to_string(std::get<0>(param_info.param))) + "_" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

// The reference model (and the pool) against the private Manager with the same policy, on one
// tenant's random stream: the Manager's ARC (core/src/manager/arc_policy.cpp) is the definition
// the pool follows. A pool operation maps onto the Manager's as Note [Pool ARC] says: a lookup is
// lookup + touch (+ prepare_load with pin), each stored key one prepare_store with the call's keys
// protected, a commit or an unpin of several slots one complete_store / complete_load each in
// the same order, an abort one complete_store(false). After every operation the evicted keys,
// the hits, |T1|, |T2|, |B1|, |B2| and the target p must be the Manager's.
class PoolVsManager : public ::testing::TestWithParam<std::tuple<PolicyKind, std::uint32_t>> {};

TEST_P(PoolVsManager, SingleTenantStreamsAgreeWithThePrivateManager) {
  constexpr std::uint32_t kSlots = 12, kUniverse = 26, kOps = 3000;
  const kvoffload::test::TempDir dir;
  const PolicyKind policy = std::get<0>(GetParam());
  const std::uint32_t seed = std::get<1>(GetParam());
  std::mt19937_64 rng(seed);
  auto o = small_options(dir.path(), "solo", kSlots);
  o.policy = policy;
  NodePool pool = NodePool::attach(o);
  Model model(kSlots, 1, policy);
  ManagerConfig mc;
  mc.num_chunks = kSlots;
  mc.policy = policy;
  mc.record_events = false;
  Manager manager(mc);
  const std::vector<std::uint32_t> index_of{pool.tenant_index()};
  std::vector<std::uint32_t> writing, pins;
  auto pick = [&](std::uint64_t n) { return static_cast<std::uint32_t>(rng() % n); };
  auto request = [&] {
    const std::uint32_t start = pick(kUniverse), len = 1 + pick(5);
    std::vector<BlockKey> ks;
    for (std::uint32_t i = 0; i < len; ++i) ks.push_back(test::key((start + i) % kUniverse));
    return ks;
  };
  auto take_some = [&](std::vector<std::uint32_t>& from) {
    std::shuffle(from.begin(), from.end(), rng);
    const std::size_t n = from.empty() ? 0 : 1 + pick(from.size());
    std::vector<std::uint32_t> out(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
    from.erase(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
    return out;
  };
  // The Manager's side of a lookup of ks that hit `hits` keys.
  auto manager_lookup = [&](const std::vector<BlockKey>& ks, std::uint32_t hits, bool pin) {
    EXPECT_EQ(manager.lookup(ks), hits);
    const std::span<const BlockKey> prefix(ks.data(), hits);
    manager.touch(prefix);
    if (pin) (void)manager.prepare_load(prefix);
  };
  std::uint64_t evictions = 0;
  for (std::uint32_t op = 0; op < kOps; ++op) {
    const std::uint32_t what = pick(100);
    const std::string step = "op " + std::to_string(op) + ": ";
    const std::vector<SlotView> before = pool.snapshot();
    if (what < 25) {
      const auto ks = request();
      const bool pin = pick(2) == 0;
      const LookupOutcome got = pool.lookup(ks, pin);
      const Model::Lookup want = model.lookup(0, ks, pin);
      ASSERT_EQ(std::vector<std::uint32_t>(got.slots.begin(), got.slots.end()), want.slots) << step;
      manager_lookup(ks, got.hits, pin);
      if (pin) pins.insert(pins.end(), want.slots.begin(), want.slots.end());
    } else if (what < 55) {
      const auto ks = request();
      const bool cycle = what < 40;
      const bool pin = pick(2) == 0;
      std::uint32_t first = 0;
      const Model::Store want = store_both(pool, model, 0, ks, cycle, pin, pins, first);
      ASSERT_FALSE(HasFailure()) << step;
      if (cycle) manager_lookup(ks, first, pin);
      std::vector<BlockKey> manager_evicted;
      std::uint32_t manager_stored = 0;
      for (std::uint32_t i = first; i < ks.size(); ++i) {
        const StorePlan plan = manager.prepare_store(std::span(&ks[i], 1), ks);
        if (plan.ok()) manager_stored += static_cast<std::uint32_t>(plan.slots.size());
        manager_evicted.insert(manager_evicted.end(), plan.evicted.begin(), plan.evicted.end());
      }
      ASSERT_EQ(manager_stored, want.slots.size()) << step << "stores";
      ASSERT_EQ(manager_evicted, want.evicted) << step << "evicted keys";
      writing.insert(writing.end(), want.slots.begin(), want.slots.end());
      evictions += want.evicted.size();
    } else if (what < 80) {
      const auto done = take_some(writing);
      if (pick(5) == 0) {
        pool.abort_stores(done);
        model.abort(done);
        std::vector<BlockKey> ks;
        for (const auto s : done) ks.push_back(before[s].key);
        (void)manager.complete_store(ks, false);
      } else {
        pool.commit_stores(done);
        model.commit(done);
        for (const auto s : done) (void)manager.complete_store(std::span(&before[s].key, 1), true);
      }
    } else {
      const auto done = take_some(pins);
      pool.unpin(done);
      model.unpin(0, done);
      for (const auto s : done) manager.complete_load(std::span(&before[s].key, 1));
    }
    const ArcState arc = pool.arc_state();
    ASSERT_EQ(model.compare(pool.snapshot(), arc, index_of), "") << step;
    ASSERT_EQ(test::joined(pool.check_invariants()), "") << step;
    const PolicyCounters c = manager.stats().policy;
    ASSERT_EQ(c.recent, arc.t1) << step << "|T1|";
    ASSERT_EQ(c.frequent, arc.t2) << step << "|T2|";
    ASSERT_EQ(c.ghost_recent, arc.b1.size()) << step << "|B1|";
    ASSERT_EQ(c.ghost_frequent, arc.b2.size()) << step << "|B2|";
    ASSERT_EQ(c.recent_target, arc.target) << step << "p";
  }
  EXPECT_GT(evictions, 0U);
  if (policy == PolicyKind::kArc) {
    EXPECT_GT(model.ghost_hits(), 0U);
    EXPECT_GT(model.promotions(), 0U);
  }
  (void)std::printf("%s seed %u: %lu evictions, %lu ghost hits, %lu T1 -> T2, p ends at %lu\n",
                    std::string(to_string(policy)).c_str(), seed,
                    static_cast<unsigned long>(evictions),
                    static_cast<unsigned long>(model.ghost_hits()),
                    static_cast<unsigned long>(model.promotions()),
                    static_cast<unsigned long>(pool.arc_state().target));
}

INSTANTIATE_TEST_SUITE_P(Seeds, PoolVsManager,
                         ::testing::Combine(::testing::Values(PolicyKind::kLru, PolicyKind::kArc),
                                            ::testing::Values(5U, 6U, 7U)),
                         [](const auto& param_info) {
                           return std::string(to_string(std::get<0>(param_info.param))) + "_" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

}  // namespace
}  // namespace kvoffload::pool
