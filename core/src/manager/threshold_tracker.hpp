#pragma once
// The store threshold's lookup counts: how often each recently looked-up key was looked up, in a
// table of bounded size.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvoffload/block_key.hpp>

#include "manager/index_list.hpp"
#include "manager/key_table.hpp"

namespace kvoffload::detail {

// A table of (key, lookups). A full tracker forgets the key that entered it first (native: a ring,
// oldest overwritten first) or the key looked up least recently (vLLM's OrderedDict with
// move_to_end, Note [vLLM semantics] in manager.cpp).
class ThresholdTracker {
 public:
  ThresholdTracker() = default;  // off: holds nothing, every count is 0
  ThresholdTracker(std::size_t capacity, bool vllm);

  // Counts one lookup of key.
  void track(const BlockKey& key);
  // The lookups counted for key since it entered the tracker; 0 when it is not there.
  [[nodiscard]] std::uint32_t count(const BlockKey& key) const noexcept;
  // Forgets every key (the native reset; vLLM's reset_cache keeps the counts).
  void clear();

 private:
  struct Entry {
    BlockKey key;
    std::uint32_t count = 0;
  };

  bool vllm_ = false;
  std::vector<Entry> entries_;
  KeyTable index_;
  std::size_t size_ = 0;
  std::size_t next_ = 0;     // native: the ring's next victim
  std::vector<Link> links_;  // kVllm: recency of lookups, front = most recent
  IndexList lru_;
};

}  // namespace kvoffload::detail
