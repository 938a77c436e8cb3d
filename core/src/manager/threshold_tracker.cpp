// The store threshold's lookup counts (see threshold_tracker.hpp).
#include "manager/threshold_tracker.hpp"

#include <limits>

namespace kvoffload::detail {

ThresholdTracker::ThresholdTracker(std::size_t capacity, bool vllm) : vllm_(vllm) {
  entries_.resize(capacity);
  index_.init(entries_.size());
  if (vllm_) links_.resize(entries_.size());
}

void ThresholdTracker::track(const BlockKey& key) {
  const auto at = [this](std::uint32_t i) -> const BlockKey& { return entries_[i].key; };
  const std::uint32_t t = index_.find(key, at);
  if (t != KeyTable::kNone) {
    if (entries_[t].count != std::numeric_limits<std::uint32_t>::max()) ++entries_[t].count;
    if (vllm_) lru_.move_to_front(links_.data(), t);
    return;
  }
  if (vllm_) {
    std::uint32_t slot = 0;
    if (size_ == entries_.size()) {
      slot = lru_.back();
      lru_.erase(links_.data(), slot);
      index_.erase(entries_[slot].key, slot);
    } else {
      slot = static_cast<std::uint32_t>(size_++);
    }
    entries_[slot] = Entry{key, 1};
    index_.insert(key, slot);
    lru_.push_front(links_.data(), slot);
    return;
  }
  const auto slot = static_cast<std::uint32_t>(next_);
  if (size_ == entries_.size())
    index_.erase(entries_[slot].key, slot);
  else
    ++size_;
  entries_[slot] = Entry{key, 1};
  index_.insert(key, slot);
  next_ = (next_ + 1) % entries_.size();
}

std::uint32_t ThresholdTracker::count(const BlockKey& key) const noexcept {
  if (entries_.empty()) return 0;
  const std::uint32_t t =
      index_.find(key, [this](std::uint32_t i) -> const BlockKey& { return entries_[i].key; });
  return t == KeyTable::kNone ? 0 : entries_[t].count;
}

void ThresholdTracker::clear() {
  if (entries_.empty()) return;
  index_.clear();
  lru_.clear();
  size_ = 0;
  next_ = 0;
}

}  // namespace kvoffload::detail
