#pragma once
// ARC's ghost lists B1 (keys evicted from T1, "recent") and B2 (evicted from T2, "frequent"): keys
// only, each list ordered from most recently added (front) to oldest (back), in a fixed pool of
// nodes with a KeyTable from key to node, so adding, finding and dropping a ghost never allocates.
// Shared by the native ARC (arc_policy.cpp) and vLLM's ARC (vllm_policies.cpp); each decides its
// own bounds (which ghost goes when a list or the pool is full) and how a ghost hit adapts its
// target, so this class only keeps the lists and never drops a ghost on its own.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvoffload/block_key.hpp>

#include "manager/index_list.hpp"
#include "manager/key_table.hpp"

namespace kvoffload::detail {

class GhostLists {
 public:
  enum class List : std::uint8_t { kNone = 0, kB1 = 1, kB2 = 2 };
  static constexpr std::uint32_t kNone = KeyTable::kNone;

  // A pool of `pool_size` ghost nodes, all free.
  explicit GhostLists(std::size_t pool_size) : nodes_(pool_size), links_(pool_size) {
    index_.init(pool_size);
    clear();
  }

  // The ghost node holding `key`, or kNone.
  [[nodiscard]] std::uint32_t find(const BlockKey& key) const noexcept {
    return index_.find(key, [this](std::uint32_t g) -> const BlockKey& { return nodes_[g].key; });
  }
  [[nodiscard]] List list_of(std::uint32_t g) const noexcept { return nodes_[g].list; }

  [[nodiscard]] std::size_t size(List list) const noexcept { return of(list).size(); }
  [[nodiscard]] bool empty(List list) const noexcept { return of(list).empty(); }
  // The oldest ghost of a list (kNil when it is empty).
  [[nodiscard]] std::uint32_t oldest(List list) const noexcept { return of(list).back(); }
  // True when no node is free: add() needs one.
  [[nodiscard]] bool pool_full() const noexcept { return free_.empty(); }

  // Makes `key` the newest ghost of `list`. The key must be absent and a node free (!pool_full()).
  void add(const BlockKey& key, List list) {
    const std::uint32_t g = free_.back();
    free_.pop_back();
    nodes_[g].key = key;
    nodes_[g].list = list;
    of(list).push_front(links_.data(), g);
    index_.insert(key, g);
  }

  // Makes ghost g the newest of its list.
  void move_to_front(std::uint32_t g) noexcept {
    of(nodes_[g].list).move_to_front(links_.data(), g);
  }

  // Forgets ghost g and frees its node.
  void drop(std::uint32_t g) noexcept {
    of(nodes_[g].list).erase(links_.data(), g);
    index_.erase(nodes_[g].key, g);
    nodes_[g].list = List::kNone;
    free_.push_back(g);
  }

  // Forgets every ghost.
  void clear() {
    index_.clear();
    for (auto& l : links_) l = Link{};
    for (auto& n : nodes_) n.list = List::kNone;
    b1_.clear();
    b2_.clear();
    free_.clear();
    free_.reserve(nodes_.size());
    // Lowest node first out, as a stack: the order nodes are handed out is deterministic.
    for (auto g = static_cast<std::uint32_t>(nodes_.size()); g > 0; --g) free_.push_back(g - 1);
  }

 private:
  struct Node {
    BlockKey key;
    List list = List::kNone;
  };

  IndexList& of(List list) noexcept { return list == List::kB1 ? b1_ : b2_; }
  [[nodiscard]] const IndexList& of(List list) const noexcept {
    return list == List::kB1 ? b1_ : b2_;
  }

  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<std::uint32_t> free_;
  IndexList b1_;
  IndexList b2_;
  KeyTable index_;
};

}  // namespace kvoffload::detail
