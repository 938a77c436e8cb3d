#pragma once
// Intrusive doubly linked lists over 32-bit indices: the links live in an array indexed by slot (or
// ghost node) that the policy allocates once, so list operations never allocate and are O(1).
// front = most recently used, back = least recently used.

#include <cstddef>
#include <cstdint>

namespace kvoffload::detail {

inline constexpr std::uint32_t kNil = 0xFFFFFFFFu;

struct Link {
  std::uint32_t prev = kNil;  // toward the front (more recent)
  std::uint32_t next = kNil;  // toward the back (less recent)
};

class IndexList {
 public:
  [[nodiscard]] std::uint32_t front() const noexcept { return head_; }
  [[nodiscard]] std::uint32_t back() const noexcept { return tail_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  void push_front(Link* links, std::uint32_t i) noexcept {
    links[i].prev = kNil;
    links[i].next = head_;
    if (head_ != kNil)
      links[head_].prev = i;
    else
      tail_ = i;
    head_ = i;
    ++size_;
  }

  void erase(Link* links, std::uint32_t i) noexcept {
    const Link l = links[i];
    if (l.prev != kNil)
      links[l.prev].next = l.next;
    else
      head_ = l.next;
    if (l.next != kNil)
      links[l.next].prev = l.prev;
    else
      tail_ = l.prev;
    links[i] = Link{};
    --size_;
  }

  void move_to_front(Link* links, std::uint32_t i) noexcept {
    if (head_ == i) return;
    erase(links, i);
    push_front(links, i);
  }

  void clear() noexcept {
    head_ = tail_ = kNil;
    size_ = 0;
  }

 private:
  std::uint32_t head_ = kNil;
  std::uint32_t tail_ = kNil;
  std::size_t size_ = 0;
};

}  // namespace kvoffload::detail
