// vLLM's LRU and ARC cache policies (vllm/v1/kv_offload/cpu/policies/lru.py and arc.py), in C++
// for ManagerSemantics::kVllm (Note [vLLM semantics] in manager.cpp).
//
// vLLM's ARC keeps every resident block in T1/T2 whatever its ref_cnt, and its eviction walks
// from the least recent end past blocks that are pinned (ref_cnt > 0) or write-pending (-1). So
// there, unlike the native policies (Note [Parked slots]), hold() and release() only flip a flag
// and a slot never moves when a load or store ends. vLLM's LRU keeps a separate list of the
// evictable blocks only (see VllmLruPolicy). Eviction costs O(victims + slots walked past), as
// vLLM's does; everything else is O(1) per slot.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/eviction_policy.hpp>

#include "manager/ghost_lists.hpp"
#include "manager/index_list.hpp"

namespace kvoffload {
namespace {

using detail::GhostLists;
using detail::IndexList;
using detail::kNil;
using detail::Link;

// lru.py (since vLLM 68567ef2df): `blocks` holds every resident; `evictable_blocks`, an
// OrderedDict, holds only the ready and unpinned ones (ref_cnt 0) in recency order. A block enters
// it at the most recent end when its store completes or its last load completes (mark_evictable
// appends: the last key of the call ends most recent), leaves it when a load pins it, and touch
// moves only the blocks in it. Pinned and write-pending blocks are in no list, so eviction walks
// only evictable slots: O(victims + protected slots met).
class VllmLruPolicy final : public EvictionPolicy {
 public:
  explicit VllmLruPolicy(std::uint32_t capacity)
      : capacity_(capacity), links_(capacity), state_(capacity, kAbsent) {}

  PolicyKind kind() const noexcept override { return PolicyKind::kLru; }
  std::string_view name() const noexcept override { return to_string(kind()); }
  std::uint32_t capacity() const noexcept override { return capacity_; }

  void insert(std::span<const SlotIndex> slots, std::span<const BlockKey> /*keys*/) override {
    // A new BlockStatus has ref_cnt -1: resident, not evictable.
    for (const SlotIndex s : slots) {
      if (state_[s] == kAbsent) ++resident_;
      if (state_[s] == kEvictable) list_.erase(links_.data(), s);
      state_[s] = kParked;
    }
  }

  void release(std::span<const SlotIndex> slots) override {
    // mark_evictable: `evictable_blocks[key] = None` appends a new key at the most recent end and
    // leaves a key that is already there where it is.
    for (const SlotIndex s : slots) {
      if (state_[s] != kParked) continue;
      list_.push_front(links_.data(), s);
      state_[s] = kEvictable;
    }
  }

  void hold(std::span<const SlotIndex> slots) override {
    // mark_non_evictable: `del evictable_blocks[key]`.
    for (const SlotIndex s : slots) {
      if (state_[s] != kEvictable) continue;
      list_.erase(links_.data(), s);
      state_[s] = kParked;
    }
  }

  void touch(std::span<const SlotIndex> slots) override {
    // reversed(keys) + move_to_end, evictable keys only: slots[0] ends most recent; pinned and
    // write-pending blocks keep no place to move.
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
      if (state_[*it] == kEvictable) list_.move_to_front(links_.data(), *it);
    }
  }

  void remove(std::span<const SlotIndex> slots) override {
    for (const SlotIndex s : slots) {
      if (state_[s] == kAbsent) continue;
      if (state_[s] == kEvictable) list_.erase(links_.data(), s);
      state_[s] = kAbsent;
      --resident_;
    }
  }

  std::size_t evict(std::size_t count, const VictimFilter& filter,
                    std::span<const BlockKey> /*slot_keys*/,
                    std::span<SlotIndex> victims_out) override {
    // Candidates from the least recent end, protected ones skipped; fewer than `count` found
    // means vLLM returns None and changes nothing.
    std::size_t found = 0;
    for (std::uint32_t cursor = list_.back(); found < count && cursor != kNil;
         cursor = links_[cursor].prev) {
      if (!filter.is_protected(cursor)) victims_out[found++] = cursor;
    }
    if (found < count) return 0;
    for (std::size_t i = 0; i < found; ++i) {
      list_.erase(links_.data(), victims_out[i]);
      state_[victims_out[i]] = kAbsent;
    }
    resident_ -= found;
    return found;
  }

  void reset() override {
    for (auto& l : links_) l = Link{};
    std::fill(state_.begin(), state_.end(), kAbsent);
    list_.clear();
    resident_ = 0;
  }

  std::size_t evictable_count() const noexcept override { return list_.size(); }

  PolicyCounters counters() const noexcept override {
    PolicyCounters c;
    c.resident = resident_;
    c.evictable = list_.size();
    c.recent = resident_;
    return c;
  }

 private:
  enum : std::uint8_t { kAbsent = 0, kParked = 1, kEvictable = 2 };

  std::uint32_t capacity_;
  std::vector<Link> links_;
  std::vector<std::uint8_t> state_;  // kParked: write-pending or pinned (ref_cnt != 0)
  IndexList list_;                   // evictable_blocks; front = most recent
  std::uint64_t resident_ = 0;
};

// arc.py: T1/T2 hold every resident; B1/B2 are ghost keys, each at most `capacity` long; the T1
// target is a float that only touches of ghost keys change.
class VllmArcPolicy final : public EvictionPolicy {
 public:
  explicit VllmArcPolicy(std::uint32_t capacity)
      : capacity_(capacity),
        links_(capacity),
        where_(capacity, kAbsent),
        pending_(capacity, 0),
        evictable_(capacity, 0),
        ghosts_(2 * static_cast<std::size_t>(capacity)) {}

  PolicyKind kind() const noexcept override { return PolicyKind::kArc; }
  std::string_view name() const noexcept override { return to_string(kind()); }
  std::uint32_t capacity() const noexcept override { return capacity_; }

  void insert(std::span<const SlotIndex> slots, std::span<const BlockKey> keys) override {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const SlotIndex s = slots[i];
      if (where_[s] != kAbsent) remove_one(s);
      t1_.push_front(links_.data(), s);
      where_[s] = kT1;
      pending_[s] = 1;
      // insert() pops the key from B1 and B2 without adapting the target.
      const std::uint32_t g = ghosts_.find(keys[i]);
      if (g != GhostLists::kNone) ghosts_.drop(g);
    }
  }

  void release(std::span<const SlotIndex> slots) override {
    for (const SlotIndex s : slots) {
      if (where_[s] == kAbsent) continue;
      pending_[s] = 0;  // ready from its first release on (the store completed)
      set_evictable(s, 1);
    }
  }

  void hold(std::span<const SlotIndex> slots) override {
    for (const SlotIndex s : slots) set_evictable(s, 0);
  }

  void touch(std::span<const SlotIndex> slots) override {
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
      const SlotIndex s = *it;
      if (where_[s] == kT1) {
        t1_.erase(links_.data(), s);
        if (pending_[s] != 0) {
          // Just prepared for a store, not really seen twice: stays in T1, most recent.
          t1_.push_front(links_.data(), s);
        } else {
          t2_.push_front(links_.data(), s);
          where_[s] = kT2;
        }
      } else if (where_[s] == kT2) {
        t2_.move_to_front(links_.data(), s);
      }
    }
  }

  void touch_missing(std::span<const BlockKey> keys) override {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      const std::uint32_t g = ghosts_.find(*it);
      if (g == GhostLists::kNone) continue;
      const auto b1 = static_cast<double>(ghosts_.size(kB1));
      const auto b2 = static_cast<double>(ghosts_.size(kB2));
      if (ghosts_.list_of(g) == kB1)
        target_ = std::min(target_ + std::max(1.0, b2 / b1), static_cast<double>(capacity_));
      else
        target_ = std::max(target_ - std::max(1.0, b1 / b2), 0.0);
      ghosts_.move_to_front(g);
    }
  }

  void remove(std::span<const SlotIndex> slots) override {
    for (const SlotIndex s : slots) {
      if (where_[s] != kAbsent) remove_one(s);
    }
  }

  std::size_t evict(std::size_t count, const VictimFilter& filter,
                    std::span<const BlockKey> slot_keys,
                    std::span<SlotIndex> victims_out) override {
    // One cursor per list from its least recent end; |T1| as if the chosen T1 victims were gone.
    // A cursor only moves forward, as vLLM's iterators do.
    const auto floor_target = static_cast<std::size_t>(std::floor(target_));
    std::size_t virtual_t1 = t1_.size();
    std::uint32_t c1 = t1_.back();
    std::uint32_t c2 = t2_.back();
    const auto next_candidate = [&](std::uint32_t& cursor) -> std::uint32_t {
      while (cursor != kNil) {
        const std::uint32_t s = cursor;
        cursor = links_[s].prev;
        if (evictable_[s] != 0 && !filter.is_protected(s)) return s;
      }
      return kNil;
    };
    std::size_t written = 0;
    while (written < count) {
      std::uint32_t victim = kNil;
      bool from_t1 = false;
      if (virtual_t1 >= floor_target) {
        victim = next_candidate(c1);
        if (victim != kNil) {
          from_t1 = true;
          --virtual_t1;
        }
      }
      if (victim == kNil) victim = next_candidate(c2);
      if (victim == kNil) break;
      victims_out[written++] = victim;
      // Mark now, move at the end: the lists must stay intact under the cursors.
      where_[victim] = from_t1 ? kEvictT1 : kEvictT2;
    }
    if (written < count) {
      // vLLM's ARC stops when T1 is below its target and T2 has no candidate left, even if T1
      // has some; the eviction fails as a whole and nothing changes.
      for (std::size_t i = 0; i < written; ++i) {
        where_[victims_out[i]] = where_[victims_out[i]] == kEvictT1 ? kT1 : kT2;
      }
      return 0;
    }
    // Commit in selection order: each victim leaves its list and becomes the newest ghost of the
    // matching ghost list; a ghost list past `capacity` drops its oldest (vLLM trims after the
    // batch; dropping as it grows gives the same lists, both keep the newest `capacity`).
    for (std::size_t i = 0; i < written; ++i) {
      const SlotIndex v = victims_out[i];
      const bool from_t1 = where_[v] == kEvictT1;
      where_[v] = from_t1 ? kT1 : kT2;
      remove_one(v);
      add_ghost(slot_keys[v], from_t1 ? kB1 : kB2);
    }
    return written;
  }

  void reset() override {
    for (auto& l : links_) l = Link{};
    std::fill(where_.begin(), where_.end(), kAbsent);
    std::fill(pending_.begin(), pending_.end(), 0);
    std::fill(evictable_.begin(), evictable_.end(), 0);
    t1_.clear();
    t2_.clear();
    evictable_count_ = 0;
    target_ = 0;
    ghosts_.clear();
  }

  std::size_t evictable_count() const noexcept override { return evictable_count_; }

  PolicyCounters counters() const noexcept override {
    PolicyCounters c;
    c.resident = t1_.size() + t2_.size();
    c.evictable = evictable_count_;
    c.recent = t1_.size();
    c.frequent = t2_.size();
    c.ghost_recent = ghosts_.size(kB1);
    c.ghost_frequent = ghosts_.size(kB2);
    c.recent_target = static_cast<std::uint64_t>(target_);
    return c;
  }

 private:
  enum : std::uint8_t { kAbsent = 0, kT1 = 1, kT2 = 2, kEvictT1 = 3, kEvictT2 = 4 };
  static constexpr GhostLists::List kB1 = GhostLists::List::kB1;
  static constexpr GhostLists::List kB2 = GhostLists::List::kB2;

  void set_evictable(SlotIndex s, std::uint8_t on) noexcept {
    if (where_[s] == kAbsent || evictable_[s] == on) return;
    evictable_[s] = on;
    if (on != 0)
      ++evictable_count_;
    else
      --evictable_count_;
  }

  void remove_one(SlotIndex s) noexcept {
    set_evictable(s, 0);
    (where_[s] == kT1 ? t1_ : t2_).erase(links_.data(), s);
    where_[s] = kAbsent;
    pending_[s] = 0;
  }

  void add_ghost(const BlockKey& key, GhostLists::List list) {
    if (ghosts_.size(list) >= capacity_) ghosts_.drop(ghosts_.oldest(list));
    // B1 and B2 hold at most `capacity` each, so the pool of 2 * capacity never runs dry.
    ghosts_.add(key, list);
  }

  std::uint32_t capacity_;
  std::vector<Link> links_;
  std::vector<std::uint8_t> where_;
  std::vector<std::uint8_t> pending_;    // inserted, store not completed yet (vLLM ref_cnt -1)
  std::vector<std::uint8_t> evictable_;  // ready and unpinned (vLLM ref_cnt 0)
  IndexList t1_;
  IndexList t2_;
  std::size_t evictable_count_ = 0;
  double target_ = 0;  // vLLM's target_t1_size

  GhostLists ghosts_;  // B1 and B2, at most `capacity` each, in a pool of 2 * capacity nodes
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_vllm_lru_policy(std::uint32_t capacity) {
  return std::make_unique<VllmLruPolicy>(capacity);
}

std::unique_ptr<EvictionPolicy> make_vllm_arc_policy(std::uint32_t capacity) {
  return std::make_unique<VllmArcPolicy>(capacity);
}

std::unique_ptr<EvictionPolicy> make_vllm_policy(PolicyKind kind, std::uint32_t capacity) {
  switch (kind) {
#define KVOFFLOAD_MAKE_VLLM_POLICY_CASE_(value, upper, camel, name) \
  case PolicyKind::k##camel:                                        \
    return make_vllm_##name##_policy(capacity);
    KVOFFLOAD_POLICY_KINDS(KVOFFLOAD_MAKE_VLLM_POLICY_CASE_)
#undef KVOFFLOAD_MAKE_VLLM_POLICY_CASE_
  }
  throw_invalid("eviction policy " + std::to_string(static_cast<int>(kind)) + ": unknown");
}

}  // namespace kvoffload
