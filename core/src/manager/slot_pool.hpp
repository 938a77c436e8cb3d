#pragma once
// The Manager's free slots: which of the ready slots (Note [Ready slots] in manager.cpp) are free,
// and in which order they are handed out.

#include <cstdint>
#include <vector>

#include <kvoffload/eviction_policy.hpp>

namespace kvoffload::detail {

// Free slots of the ready ones: the never-used ones [fresh_next_, ready_) and the stack free_ of
// freed ones. Native puts every slot on the stack (slot 0 on top) so freed slots are reused first;
// vLLM's pool hands out never-used slots first (Note [vLLM semantics] in manager.cpp).
class SlotPool {
 public:
  SlotPool() = default;
  // `capacity` slots in all, [0, ready) of them ready and free; `vllm` picks the order.
  SlotPool(std::uint32_t capacity, std::uint32_t ready, bool vllm);

  // Every ready slot free again.
  void reset();
  // Slots [0, ready()) may be handed out.
  [[nodiscard]] std::uint32_t ready() const noexcept { return ready_; }
  [[nodiscard]] std::uint64_t free_count() const noexcept {
    return free_.size() + (ready_ - fresh_next_);
  }
  // A free slot; the caller checked free_count() > 0.
  SlotIndex take() noexcept;
  // Gives a slot back (free_ was reserved for every slot: no allocation here).
  void put(SlotIndex s) { free_.push_back(s); }
  // Makes [ready(), n) ready and free; the caller checked ready() <= n <= capacity.
  void grow_ready(std::uint32_t n);

 private:
  bool vllm_ = false;
  std::uint32_t ready_ = 0;
  std::vector<SlotIndex> free_;   // stack of freed slots (native: all free slots)
  std::uint32_t fresh_next_ = 0;  // slots >= this were never handed out since the last reset
};

}  // namespace kvoffload::detail
