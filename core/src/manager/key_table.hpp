#pragma once
// Open-addressing index from BlockKey to a 32-bit index into an array the caller owns (the
// Manager's slot keys, ARC's ghost nodes, the threshold tracker's ring). Keys are not stored in the
// table: an entry is 8 bytes (32 hash bits + the index), so a million-slot index is 16 MiB and a
// probe touches one cache line of the table plus one key compare. Linear probing at load <= 1/2,
// backward-shift deletion (no tombstones, so lookups never slow down with churn).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvoffload/block_key.hpp>

namespace kvoffload::detail {

class KeyTable {
 public:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFu;

  // Sizes the table for up to max_elements entries and empties it. Reuses the storage when it is
  // already large enough (the per-call scratch set relies on this: no allocation in steady state).
  void init(std::size_t max_elements) {
    // Indices are 32-bit, so 2^32 buckets is the most that can be needed (a region of more than
    // 2^31 chunks then runs at a higher load; still correct while size < buckets).
    constexpr std::size_t kMaxBuckets = std::size_t{1} << 32;
    std::size_t cap = 16;
    while (cap < 2 * max_elements && cap < kMaxBuckets) cap <<= 1;
    entries_.assign(cap, kEmpty);
    mask_ = cap - 1;
    home_shift_ = 32u - static_cast<unsigned>(std::countr_zero(cap));
    size_ = 0;
  }

  void clear() {
    std::fill(entries_.begin(), entries_.end(), kEmpty);
    size_ = 0;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return entries_.size(); }

  // key_at(index) -> const BlockKey&: the key stored at an index of the caller's array.
  template <class KeyAt>
  [[nodiscard]] std::uint32_t find(const BlockKey& key, KeyAt&& key_at) const noexcept {
    const std::uint32_t h = tag_of(key);
    std::size_t pos = home_of(h);
    for (;;) {
      const std::uint64_t e = entries_[pos];
      if (e == kEmpty) return kNone;
      if (static_cast<std::uint32_t>(e >> 32) == h) {
        const auto index = static_cast<std::uint32_t>(e);
        if (key_at(index) == key) return index;
      }
      pos = (pos + 1) & mask_;
    }
  }

  // The key must be absent (callers find() first).
  void insert(const BlockKey& key, std::uint32_t index) noexcept {
    const std::uint32_t h = tag_of(key);
    std::size_t pos = home_of(h);
    while (entries_[pos] != kEmpty) pos = (pos + 1) & mask_;
    entries_[pos] = (static_cast<std::uint64_t>(h) << 32) | index;
    ++size_;
  }

  // Removes the entry of key that points at index; false when there is none.
  bool erase(const BlockKey& key, std::uint32_t index) noexcept {
    const std::uint32_t h = tag_of(key);
    const std::uint64_t want = (static_cast<std::uint64_t>(h) << 32) | index;
    std::size_t pos = home_of(h);
    for (;;) {
      const std::uint64_t e = entries_[pos];
      if (e == kEmpty) return false;
      if (e == want) break;
      pos = (pos + 1) & mask_;
    }
    // Backward shift: pull later members of the probe run into the hole when their home allows.
    std::size_t hole = pos;
    std::size_t j = pos;
    for (;;) {
      j = (j + 1) & mask_;
      const std::uint64_t e = entries_[j];
      if (e == kEmpty) break;
      const std::size_t home = home_of(static_cast<std::uint32_t>(e >> 32));
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        entries_[hole] = e;
        hole = j;
      }
    }
    entries_[hole] = kEmpty;
    --size_;
    return true;
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  static std::uint32_t tag_of(const BlockKey& key) noexcept {
    return static_cast<std::uint32_t>(key.hash() >> 32);
  }
  // Home bucket from the top bits of the tag (the hash is mixed, any bits will do).
  [[nodiscard]] std::size_t home_of(std::uint32_t tag) const noexcept {
    return static_cast<std::size_t>(tag >> home_shift_) & mask_;
  }

  std::vector<std::uint64_t> entries_;
  std::size_t mask_ = 0;
  unsigned home_shift_ = 28;
  std::size_t size_ = 0;
};

}  // namespace kvoffload::detail
