// LRU over the evictable slots (see Note [Parked slots] in eviction_policy.hpp).
#include <vector>

#include <kvoffload/eviction_policy.hpp>

#include "manager/index_list.hpp"

namespace kvoffload {
namespace {

using detail::IndexList;
using detail::kNil;
using detail::Link;

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(std::uint32_t capacity)
      : capacity_(capacity), links_(capacity), state_(capacity, kAbsent) {}

  PolicyKind kind() const noexcept override { return PolicyKind::kLru; }
  std::string_view name() const noexcept override { return to_string(kind()); }
  std::uint32_t capacity() const noexcept override { return capacity_; }

  void insert(std::span<const SlotIndex> slots, std::span<const BlockKey> /*keys*/) override {
    for (const SlotIndex s : slots) {
      if (state_[s] == kAbsent)
        ++resident_;
      else if (state_[s] == kListed)
        list_.erase(links_.data(), s);
      state_[s] = kParked;
    }
  }

  void release(std::span<const SlotIndex> slots) override {
    // Reverse order: the first slot is pushed last and ends most recent (the head of a prefix
    // outlives its tail).
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
      const SlotIndex s = *it;
      if (state_[s] == kParked) {
        list_.push_front(links_.data(), s);
        state_[s] = kListed;
      } else if (state_[s] == kListed) {
        list_.move_to_front(links_.data(), s);
      }
    }
  }

  void hold(std::span<const SlotIndex> slots) override {
    for (const SlotIndex s : slots) {
      if (state_[s] == kListed) {
        list_.erase(links_.data(), s);
        state_[s] = kParked;
      }
    }
  }

  void touch(std::span<const SlotIndex> slots) override {
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
      if (state_[*it] == kListed) list_.move_to_front(links_.data(), *it);
    }
  }

  void remove(std::span<const SlotIndex> slots) override {
    for (const SlotIndex s : slots) {
      if (state_[s] == kAbsent) continue;
      if (state_[s] == kListed) list_.erase(links_.data(), s);
      state_[s] = kAbsent;
      --resident_;
    }
  }

  std::size_t evict(std::size_t count, const VictimFilter& filter,
                    std::span<const BlockKey> /*slot_keys*/,
                    std::span<SlotIndex> victims_out) override {
    std::size_t written = 0;
    std::uint32_t cursor = list_.back();
    while (written < count && cursor != kNil) {
      const std::uint32_t more_recent = links_[cursor].prev;
      if (!filter.is_protected(cursor)) {
        list_.erase(links_.data(), cursor);
        state_[cursor] = kAbsent;
        --resident_;
        victims_out[written++] = cursor;
      }
      cursor = more_recent;
    }
    return written;
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
  enum : std::uint8_t { kAbsent = 0, kParked = 1, kListed = 2 };

  std::uint32_t capacity_;
  std::vector<Link> links_;
  std::vector<std::uint8_t> state_;
  IndexList list_;
  std::uint64_t resident_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lru_policy(std::uint32_t capacity) {
  return std::make_unique<LruPolicy>(capacity);
}

}  // namespace kvoffload
