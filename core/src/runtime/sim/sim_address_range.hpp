#pragma once
// The simulated device's allocator of its own address ranges (device memory, and the window of
// device addresses for host memory without unified addressing).
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>

namespace kvoffload::gpu::sim {

// A range of the simulator's own address space with a first-fit allocator (page granularity).
class AddressRange {
 public:
  AddressRange() = default;
  AddressRange(std::uintptr_t base, std::size_t size) : base_(base), size_(size) {
    free_[0] = size;
  }

  // Offset of a new block of `bytes` (rounded up to pages), or SIZE_MAX.
  std::size_t allocate(std::size_t bytes) {
    const std::size_t need = round(bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      const std::size_t off = it->first;
      const std::size_t left = it->second - need;
      free_.erase(it);
      if (left > 0) free_[off + need] = left;
      used_[off] = need;
      return off;
    }
    return SIZE_MAX;
  }
  // Size of the block at offset `off`, or 0 when none starts there.
  std::size_t release(std::size_t off) {
    auto it = used_.find(off);
    if (it == used_.end()) return 0;
    const std::size_t n = it->second;
    used_.erase(it);
    auto next = free_.emplace(off, n).first;
    if (auto after = std::next(next); after != free_.end() && off + n == after->first) {
      next->second += after->second;
      free_.erase(after);
    }
    if (next != free_.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == next->first) {
        before->second += next->second;
        free_.erase(next);
      }
    }
    return n;
  }
  // The block holding [addr, addr + bytes) as (offset, block size), or {SIZE_MAX, 0}.
  [[nodiscard]] std::pair<std::size_t, std::size_t> find(std::uintptr_t addr,
                                                         std::size_t bytes) const {
    if (addr < base_ || addr >= base_ + size_) return {SIZE_MAX, 0};
    const std::size_t off = addr - base_;
    auto it = used_.upper_bound(off);
    if (it == used_.begin()) return {SIZE_MAX, 0};
    --it;
    if (off + bytes > it->first + it->second) return {SIZE_MAX, 0};
    return {it->first, it->second};
  }
  [[nodiscard]] bool contains(std::uintptr_t addr) const noexcept {
    return addr >= base_ && addr < base_ + size_;
  }
  [[nodiscard]] std::uintptr_t base() const noexcept { return base_; }

 private:
  static std::size_t round(std::size_t n) { return (n + 4095) / 4096 * 4096; }
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  std::map<std::size_t, std::size_t> free_;
  std::map<std::size_t, std::size_t> used_;
};

}  // namespace kvoffload::gpu::sim
