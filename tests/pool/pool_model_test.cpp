// The node pool against a reference model of one shared LRU over random multi-tenant operation
// streams: every outcome (hits, cross-engine hits, slots, positions, evicted keys, skip counts)
// and the whole index after every operation (each slot's state, key, owner, pins; the LRU order)
// must be the model's, and check_invariants must hold throughout.
#include <algorithm>
#include <deque>
#include <list>
#include <optional>
#include <random>

#include <gtest/gtest.h>

#include "pool_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload::pool {
namespace {

using test::small_options;

// One shared LRU, slot by slot: free slots are taken most recently freed first (slot 0 first at
// the start), an evicted slot is reused at once, ready unpinned slots form the LRU (front most
// recent), a tenant at its cap evicts its own least recent chunk only.
class Model {
 public:
  struct Slot {
    SlotState state = SlotState::kFree;
    BlockKey key;
    std::uint32_t owner = kNoTenant;
    std::uint32_t engine = kNoTenant;  // which tenant's engine stored it
    std::vector<std::uint32_t> pins;
  };
  Model(std::uint32_t n, std::uint32_t tenants) : slots_(n), caps_(tenants, 0) {
    for (auto& s : slots_) s.pins.assign(tenants, 0);
    for (std::uint32_t i = 0; i < n; ++i) free_.push_back(i);
  }
  void set_cap(std::uint32_t t, std::uint32_t cap) { caps_[t] = cap; }

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
        if (!pinned(s)) lru_.remove(s);
        ++slots_[s].pins[t];
      } else if (!pinned(s)) {
        lru_.remove(s);
        lru_.push_front(s);
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
    int stopped = 0;  // 1 no room, 2 cap
    for (std::uint32_t i = first; i < keys.size(); ++i) {
      const std::uint32_t p = find(keys[i]);
      if (p != kNoTenant) {
        if (slots_[p].state == SlotState::kReady) {
          prot[p] = true;
          ++out.present;
        } else {
          ++out.writing;
        }
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
        for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
          if (prot[*it] || (own_only && slots_[*it].owner != t)) continue;
          s = *it;
          break;
        }
        if (s == kNoTenant) {
          stopped = own_only ? 2 : 1;
          ++(stopped == 2 ? out.cap : out.no_room);
          continue;
        }
        out.evicted.push_back(slots_[s].key);
        lru_.remove(s);
      }
      slots_[s].state = SlotState::kWriting;
      slots_[s].key = keys[i];
      slots_[s].owner = t;
      slots_[s].engine = t;
      out.positions.push_back(i);
      out.slots.push_back(s);
    }
    return out;
  }
  void commit(const std::vector<std::uint32_t>& slots) {
    for (const auto s : slots) {
      slots_[s].state = SlotState::kReady;
      lru_.push_front(s);
    }
  }
  void abort(const std::vector<std::uint32_t>& slots) {
    for (const auto s : slots) free_slot(s);
  }
  void unpin(std::uint32_t t, const std::vector<std::uint32_t>& slots) {
    for (const auto s : slots) {
      --slots_[s].pins[t];
      if (!pinned(s)) lru_.push_front(s);
    }
  }
  void detach(std::uint32_t t) {
    for (std::uint32_t s = 0; s < slots_.size(); ++s) {
      Slot& r = slots_[s];
      if (r.state == SlotState::kWriting && r.owner == t) {
        free_slot(s);
        continue;
      }
      if (r.state == SlotState::kReady && r.owner == t) r.owner = kNoTenant;
      if (r.pins[t] != 0) {
        r.pins[t] = 0;
        if (!pinned(s)) lru_.push_front(s);
      }
    }
  }
  std::uint32_t occupancy(std::uint32_t t) const {
    return static_cast<std::uint32_t>(
        std::count_if(slots_.begin(), slots_.end(),
                      [t](const Slot& s) { return s.state != SlotState::kFree && s.owner == t; }));
  }

  // Differences between the pool's snapshot and the model ("" when none). tenant_of maps the
  // pool's tenant index to the model's.
  std::string compare(const std::vector<SlotView>& snap,
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
          (m.state != SlotState::kFree && (v.key != m.key || v.owner != owner)) ||
          v.pin_mask != mask)
        diff += "slot " + std::to_string(s) + " differs; ";
    }
    std::vector<std::pair<std::uint64_t, std::uint32_t>> order;
    for (const SlotView& v : snap)
      if (v.state == SlotState::kReady && v.pin_mask == 0) order.emplace_back(v.stamp, v.slot);
    std::sort(order.rbegin(), order.rend());
    std::vector<std::uint32_t> pool_lru;
    pool_lru.reserve(order.size());
    for (const auto& o : order) pool_lru.push_back(o.second);
    if (pool_lru != std::vector<std::uint32_t>(lru_.begin(), lru_.end()))
      diff += "LRU order differs; ";
    return diff;
  }

 private:
  void free_slot(std::uint32_t s) {
    slots_[s].state = SlotState::kFree;
    slots_[s].owner = kNoTenant;
    free_.push_front(s);
  }
  std::vector<Slot> slots_;
  std::deque<std::uint32_t> free_;
  std::list<std::uint32_t> lru_;
  std::vector<std::uint32_t> caps_;
};

class PoolModel : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(PoolModel, RandomMultiTenantStreamsMatchOneSharedLru) {
  constexpr std::uint32_t kSlots = 12, kTenants = 3, kUniverse = 20, kOps = 2000;
  const kvoffload::test::TempDir dir;
  std::mt19937_64 rng(GetParam());
  Model model(kSlots, kTenants);
  std::vector<std::optional<NodePool>> pools(kTenants);
  std::vector<std::uint32_t> index_of(kTenants);
  std::vector<std::vector<std::uint32_t>> writing(kTenants), pins(kTenants);
  // Tenant 2 has a cap of 4 chunks: it may only evict its own once it holds 4.
  auto attach = [&](std::uint32_t t) {
    auto o = small_options(dir.path(), "engine" + std::to_string(t), kSlots);
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
      const auto ks = request();
      const bool cycle = what < 35;
      const bool pin = pick(2) == 0;
      StoreOutcome got;
      Model::Store want;
      if (cycle) {
        const NodePool::Cycle c = p.lookup_and_prepare(ks, pin);
        const Model::Lookup wl = model.lookup(t, ks, pin);
        ASSERT_EQ(std::vector<std::uint32_t>(c.lookup.slots.begin(), c.lookup.slots.end()),
                  wl.slots)
            << step;
        if (pin) pins[t].insert(pins[t].end(), wl.slots.begin(), wl.slots.end());
        got = c.store;
        want = model.prepare(t, ks, c.lookup.hits, wl.slots);
      } else {
        got = p.prepare_stores(ks);
        want = model.prepare(t, ks, 0, {});
      }
      ASSERT_EQ(std::vector<std::uint32_t>(got.slots.begin(), got.slots.end()), want.slots)
          << step << "prepare";
      ASSERT_EQ(std::vector<std::uint32_t>(got.positions.begin(), got.positions.end()),
                want.positions)
          << step;
      ASSERT_EQ(std::vector<BlockKey>(got.evicted.begin(), got.evicted.end()), want.evicted)
          << step;
      ASSERT_EQ(got.skipped_present, want.present) << step;
      ASSERT_EQ(got.skipped_writing, want.writing) << step;
      ASSERT_EQ(got.skipped_no_room, want.no_room) << step;
      ASSERT_EQ(got.skipped_cap, want.cap) << step;
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
    ASSERT_EQ(model.compare(pools[observer]->snapshot(), index_of), "") << step;
    ASSERT_EQ(test::joined(pools[observer]->check_invariants()), "") << step;
  }
  // The streams reach every rule the model states.
  EXPECT_GT(hits, 0U);
  EXPECT_GT(cross, 0U);
  EXPECT_GT(evictions, 0U);
  EXPECT_GT(cap_skips, 0U);
  EXPECT_GT(no_room, 0U);
  (void)std::printf(
      "seed %u: %lu hits (%lu cross-engine), %lu evictions, %lu cap skips, %lu no-room skips\n",
      GetParam(), static_cast<unsigned long>(hits), static_cast<unsigned long>(cross),
      static_cast<unsigned long>(evictions), static_cast<unsigned long>(cap_skips),
      static_cast<unsigned long>(no_room));
}

INSTANTIATE_TEST_SUITE_P(Seeds, PoolModel, ::testing::Values(1U, 2U, 3U, 4U));

}  // namespace
}  // namespace kvoffload::pool
