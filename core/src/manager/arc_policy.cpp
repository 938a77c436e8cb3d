// ARC (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST'03) adapted to
// a manager whose chunks can be unevictable (see Note [Parked slots] in eviction_policy.hpp).
//
// Residents are in T1 (seen once) or T2 (seen again); the counts |T1|, |T2| include parked slots,
// the lists hold only the evictable ones. Evicted keys become ghosts in B1 / B2 (keys only). A new
// key found in B1 raises the T1 target p by max(1, |B2|/|B1|), one found in B2 lowers it by
// max(1, |B1|/|B2|); either enters T2. The directory stays bounded as in the paper:
// |T1| + |B1| <= c, |B1| + |B2| <= c (so the total is <= 2c); ghosts live in a pool of c nodes.
//
// Batch eviction: REPLACE repeated n times with one cursor per list walking from its LRU end, so
// each list is scanned once: take T1's next candidate while |T1| > p (or T2 has none left),
// otherwise T2's. Differences from the paper, by design: p adapts when a key is admitted, which
// for a batch is after the batch's victims were chosen; REPLACE does not look at the incoming key
// (the "x in B2 and |T1| == p" tie-break), because a batch has many.
#include <algorithm>
#include <vector>

#include <kvoffload/eviction_policy.hpp>

#include "manager/ghost_lists.hpp"
#include "manager/index_list.hpp"

namespace kvoffload {
namespace {

using detail::GhostLists;
using detail::IndexList;
using detail::kNil;
using detail::Link;

class ArcPolicy final : public EvictionPolicy {
 public:
  explicit ArcPolicy(std::uint32_t capacity)
      : capacity_(capacity),
        links_(capacity),
        where_(capacity, kAbsent),
        listed_(capacity, 0),
        ghosts_(capacity) {}

  PolicyKind kind() const noexcept override { return PolicyKind::kArc; }
  std::string_view name() const noexcept override { return to_string(kind()); }
  std::uint32_t capacity() const noexcept override { return capacity_; }

  void insert(std::span<const SlotIndex> slots, std::span<const BlockKey> keys) override {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const SlotIndex s = slots[i];
      if (where_[s] != kAbsent) remove_one(s);
      const std::uint32_t g = ghosts_.find(keys[i]);
      if (g == GhostLists::kNone) {
        where_[s] = kT1;
        ++t1_count_;
        // Keep |T1| + |B1| <= c: the oldest recency ghosts go first.
        while (t1_count_ + ghosts_.size(kB1) > capacity_ && !ghosts_.empty(kB1))
          ghosts_.drop(ghosts_.oldest(kB1));
        continue;
      }
      // A ghost hit: the key was evicted recently, so the list it came from was too small.
      const std::uint64_t b1 = ghosts_.size(kB1);
      const std::uint64_t b2 = ghosts_.size(kB2);
      if (ghosts_.list_of(g) == kB1) {
        const std::uint64_t delta = std::max<std::uint64_t>(1, b2 / b1);
        p_ = std::min<std::uint64_t>(capacity_, p_ + delta);
      } else {
        const std::uint64_t delta = std::max<std::uint64_t>(1, b1 / b2);
        p_ = p_ > delta ? p_ - delta : 0;
      }
      ghosts_.drop(g);
      where_[s] = kT2;
      ++t2_count_;
    }
  }

  void release(std::span<const SlotIndex> slots) override {
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
      const SlotIndex s = *it;
      if (where_[s] == kAbsent) continue;
      if (listed_[s] != 0) list_of(s).erase(links_.data(), s);
      list_of(s).push_front(links_.data(), s);
      listed_[s] = 1;
    }
  }

  void hold(std::span<const SlotIndex> slots) override {
    for (const SlotIndex s : slots) {
      if (where_[s] != kAbsent && listed_[s] != 0) {
        list_of(s).erase(links_.data(), s);
        listed_[s] = 0;
      }
    }
  }

  void touch(std::span<const SlotIndex> slots) override {
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
      const SlotIndex s = *it;
      if (where_[s] == kT1) {
        // Second access: promote to T2 (a parked slot changes list membership now and enters the
        // T2 list when released).
        if (listed_[s] != 0) {
          t1_.erase(links_.data(), s);
          t2_.push_front(links_.data(), s);
        }
        where_[s] = kT2;
        --t1_count_;
        ++t2_count_;
      } else if (where_[s] == kT2 && listed_[s] != 0) {
        t2_.move_to_front(links_.data(), s);
      }
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
    std::uint32_t c1 = t1_.back();
    std::uint32_t c2 = t2_.back();
    std::size_t written = 0;
    while (written < count) {
      while (c1 != kNil && filter.is_protected(c1)) c1 = links_[c1].prev;
      while (c2 != kNil && filter.is_protected(c2)) c2 = links_[c2].prev;
      const bool from_t1 = c1 != kNil && (t1_count_ > p_ || c2 == kNil);
      if (!from_t1 && c2 == kNil) break;
      std::uint32_t& cursor = from_t1 ? c1 : c2;
      const SlotIndex victim = cursor;
      cursor = links_[victim].prev;
      (from_t1 ? t1_ : t2_).erase(links_.data(), victim);
      listed_[victim] = 0;
      where_[victim] = kAbsent;
      if (from_t1)
        --t1_count_;
      else
        --t2_count_;
      add_ghost(slot_keys[victim], from_t1 ? kB1 : kB2);
      victims_out[written++] = victim;
    }
    return written;
  }

  void reset() override {
    for (auto& l : links_) l = Link{};
    std::fill(where_.begin(), where_.end(), kAbsent);
    std::fill(listed_.begin(), listed_.end(), 0);
    t1_.clear();
    t2_.clear();
    t1_count_ = t2_count_ = 0;
    p_ = 0;
    ghosts_.clear();
  }

  std::size_t evictable_count() const noexcept override { return t1_.size() + t2_.size(); }

  PolicyCounters counters() const noexcept override {
    PolicyCounters c;
    c.resident = t1_count_ + t2_count_;
    c.evictable = t1_.size() + t2_.size();
    c.recent = t1_count_;
    c.frequent = t2_count_;
    c.ghost_recent = ghosts_.size(kB1);
    c.ghost_frequent = ghosts_.size(kB2);
    c.recent_target = p_;
    return c;
  }

 private:
  enum : std::uint8_t { kAbsent = 0, kT1 = 1, kT2 = 2 };
  static constexpr GhostLists::List kB1 = GhostLists::List::kB1;
  static constexpr GhostLists::List kB2 = GhostLists::List::kB2;

  IndexList& list_of(SlotIndex s) noexcept { return where_[s] == kT1 ? t1_ : t2_; }

  void remove_one(SlotIndex s) noexcept {
    if (listed_[s] != 0) list_of(s).erase(links_.data(), s);
    if (where_[s] == kT1)
      --t1_count_;
    else
      --t2_count_;
    where_[s] = kAbsent;
    listed_[s] = 0;
  }

  void add_ghost(const BlockKey& key, GhostLists::List list) {
    if (capacity_ == 0) return;
    if (ghosts_.pool_full()) {
      // The ghost pool (c nodes) is full. As in the paper's case IV: when L1 = T1 ∪ B1 is at c,
      // the oldest B1 ghost goes, otherwise the oldest B2 ghost.
      const bool from_b1 =
          !ghosts_.empty(kB1) && (t1_count_ + ghosts_.size(kB1) >= capacity_ || ghosts_.empty(kB2));
      ghosts_.drop(ghosts_.oldest(from_b1 ? kB1 : kB2));
    }
    ghosts_.add(key, list);
    // An eviction from T1 keeps |T1| + |B1| constant; nothing else can push it past c here.
  }

  std::uint32_t capacity_;
  std::vector<Link> links_;
  std::vector<std::uint8_t> where_;
  std::vector<std::uint8_t> listed_;
  IndexList t1_;
  IndexList t2_;
  std::uint64_t t1_count_ = 0;
  std::uint64_t t2_count_ = 0;
  std::uint64_t p_ = 0;

  GhostLists ghosts_;  // B1 and B2 in a pool of c nodes
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_arc_policy(std::uint32_t capacity) {
  return std::make_unique<ArcPolicy>(capacity);
}

}  // namespace kvoffload
