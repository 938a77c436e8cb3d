#pragma once
// The file tier's index: which keys it holds, their order for eviction (least recently used
// first), the bytes they use and the capacity in force (Note [Full disk] in file_tier.hpp). Not
// synchronised: FileTier::Impl's mutex guards it, and it never does I/O, so contains() answers
// from memory.

#include <algorithm>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>

#include <kvoffload/block_key.hpp>

namespace kvoffload::detail {

class TierIndex {
 public:
  struct Entry {
    std::uint64_t file_bytes = 0;
    std::uint64_t epoch = 0;            // identifies the put that owns the entry
    bool ready = false;                 // false while its put is in flight
    std::list<BlockKey>::iterator lru;  // valid when ready
  };

  explicit TierIndex(std::uint64_t configured_capacity) noexcept
      : configured_(configured_capacity), capacity_(configured_capacity) {}

  [[nodiscard]] bool holds(const BlockKey& key) const { return entries_.contains(key); }
  [[nodiscard]] bool ready(const BlockKey& key) const {
    auto it = entries_.find(key);
    return it != entries_.end() && it->second.ready;
  }
  [[nodiscard]] const Entry* find(const BlockKey& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }
  // Whether the entry of `key` is still the one `epoch` names.
  [[nodiscard]] bool owned_by(const BlockKey& key, std::uint64_t epoch) const {
    auto it = entries_.find(key);
    return it != entries_.end() && it->second.epoch == epoch;
  }

  // A put in flight: reserves its bytes; returns the entry's epoch.
  std::uint64_t reserve(const BlockKey& key, std::uint64_t file_bytes) {
    Entry e;
    e.file_bytes = file_bytes;
    e.epoch = next_epoch_++;
    entries_.emplace(key, e);
    used_ += file_bytes;
    return e.epoch;
  }
  // The put of `epoch` finished: the record is ready, most recently used.
  void mark_ready(const BlockKey& key, std::uint64_t epoch) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.epoch != epoch || it->second.ready) return;
    it->second.ready = true;
    it->second.lru = lru_.insert(lru_.end(), key);
    ready_ += it->second.file_bytes;
  }
  // A record found on disk at open (call oldest first).
  void add_ready(const BlockKey& key, std::uint64_t file_bytes) {
    mark_ready(key, reserve(key, file_bytes));
  }
  // Most recently used now (a read hit), when the entry is still `epoch`'s.
  void touch(const BlockKey& key, std::uint64_t epoch) {
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.epoch == epoch && it->second.ready) {
      lru_.splice(lru_.end(), lru_, it->second.lru);
    }
  }
  // Forgets `key` (only when its entry is still `epoch`'s, when one is given).
  bool erase(const BlockKey& key, std::optional<std::uint64_t> epoch = std::nullopt) {
    auto it = entries_.find(key);
    if (it == entries_.end() || (epoch && it->second.epoch != *epoch)) return false;
    if (it->second.ready) {
      lru_.erase(it->second.lru);
      ready_ -= it->second.file_bytes;
    }
    used_ -= it->second.file_bytes;
    entries_.erase(it);
    return true;
  }
  // The least recently used ready record, if any.
  [[nodiscard]] std::optional<BlockKey> oldest() const {
    if (lru_.empty()) return std::nullopt;
    return lru_.front();
  }
  [[nodiscard]] const std::list<BlockKey>& lru() const noexcept { return lru_; }

  // Note [Full disk]: capacity = min(configured, held + free). Returns the new value.
  std::uint64_t set_free_bytes(std::uint64_t free) noexcept {
    capacity_ = std::min(configured_, ready_ + free);
    return capacity_;
  }
  // Whether `bytes` more fit under the capacity now.
  [[nodiscard]] bool fits(std::uint64_t bytes) const noexcept { return used_ + bytes <= capacity_; }

  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint64_t configured() const noexcept { return configured_; }
  [[nodiscard]] std::uint64_t used_bytes() const noexcept { return used_; }    // ready + in flight
  [[nodiscard]] std::uint64_t ready_bytes() const noexcept { return ready_; }  // on disk
  [[nodiscard]] std::uint64_t ready_count() const noexcept { return lru_.size(); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 private:
  std::unordered_map<BlockKey, Entry, BlockKeyHash> entries_;
  std::list<BlockKey> lru_;  // ready records, least recently used first
  std::uint64_t used_ = 0;
  std::uint64_t ready_ = 0;
  std::uint64_t next_epoch_ = 1;
  const std::uint64_t configured_;
  std::uint64_t capacity_;
};

}  // namespace kvoffload::detail
