// The Manager's free slots and the order they are handed out in (see slot_pool.hpp).
#include "manager/slot_pool.hpp"

namespace kvoffload::detail {

SlotPool::SlotPool(std::uint32_t capacity, std::uint32_t ready, bool vllm)
    : vllm_(vllm), ready_(ready) {
  free_.reserve(capacity);
  reset();
}

void SlotPool::reset() {
  free_.clear();
  if (vllm_) {
    fresh_next_ = 0;
    return;
  }
  fresh_next_ = ready_;
  for (std::uint32_t s = ready_; s > 0; --s) free_.push_back(s - 1);
}

SlotIndex SlotPool::take() noexcept {
  if (fresh_next_ < ready_) return fresh_next_++;
  const SlotIndex s = free_.back();
  free_.pop_back();
  return s;
}

void SlotPool::grow_ready(std::uint32_t n) {
  if (!vllm_) {
    // New slots go on top of the free stack (free_ was reserved for every slot: no allocation).
    for (std::uint32_t s = n; s > ready_; --s) free_.push_back(s - 1);
    fresh_next_ = n;
  }
  // vLLM: the new slots are never-used ones, [fresh_next_, ready_) grows with ready_.
  ready_ = n;
}

}  // namespace kvoffload::detail
