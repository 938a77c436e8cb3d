#pragma once
// Geometry of the shared host region (docs/DESIGN.md §3.1):
//   P = slot_bytes (one rank's bytes for one chunk), C = copies (world_size, or 1 when replicated),
//   S = slot_stride = round_up(P, slot_align), R = row_stride = round_up(C·S, page),
//   data_bytes = num_chunks · R, rank r's slot in chunk c starts at c·R + copy(r)·S, where
//   copy(r) = r, or 0 when replicated.
// Note [Slot alignment]: with S = P, rank r's slots start at r·P, which for most P is not even
// 16-byte aligned, and the copy kernels lose their 16-byte vector path on every rank above 0.
// Rounding each slot up to slot_align (a power of two, 16 .. page size, default 256) costs at most
// slot_align - 1 bytes per slot and keeps every slot of every rank aligned (the data start is
// page-aligned and R is a page multiple). The value is recorded in the region header; a joiner
// asking for another value is refused.
// All arithmetic is overflow-checked; invalid input throws Error(kInvalidArgument) naming the
// value.

#include <cstddef>
#include <cstdint>

#include <kvoffload/export.h>

namespace kvoffload {

struct RegionLayout {
  std::uint64_t num_chunks = 0;    // rows in the region, > 0
  std::uint64_t slot_bytes = 0;    // P, > 0
  std::uint32_t world_size = 1;    // ranks of the engine, > 0
  bool replicated = false;         // MLA: every rank shares slot 0 (C = 1)
  std::uint64_t slot_align = 256;  // alignment of every slot: a power of two, 16 .. page size
};

// Declared before RegionGeometry, whose defaulted == compares its layout_ with it (clang deletes
// that operator when it cannot see this one).
KVOFFLOAD_API bool operator==(const RegionLayout& a, const RegionLayout& b) noexcept;

inline constexpr std::uint64_t kDefaultSlotAlign = 256;
inline constexpr std::uint64_t kMinSlotAlign = 16;  // the copy kernels' vector width

class KVOFFLOAD_API RegionGeometry {
 public:
  // Validates and computes. page_size must be a power of two (the system page, normally).
  static RegionGeometry compute(const RegionLayout& layout, std::size_t page_size);

  [[nodiscard]] const RegionLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::uint64_t num_chunks() const noexcept { return layout_.num_chunks; }
  [[nodiscard]] std::uint64_t slot_bytes() const noexcept { return layout_.slot_bytes; }
  [[nodiscard]] std::uint32_t world_size() const noexcept { return layout_.world_size; }
  [[nodiscard]] bool replicated() const noexcept { return layout_.replicated; }
  [[nodiscard]] std::uint64_t slot_align() const noexcept { return layout_.slot_align; }
  [[nodiscard]] std::uint32_t copies() const noexcept { return copies_; }
  // S: distance between the slots of two consecutive copies in a row (slot_bytes rounded up).
  [[nodiscard]] std::uint64_t slot_stride() const noexcept { return slot_stride_; }
  [[nodiscard]] std::uint64_t row_stride() const noexcept { return row_stride_; }
  [[nodiscard]] std::uint64_t data_bytes() const noexcept { return data_bytes_; }
  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }

  // Index of the copy rank `rank` uses within a row: rank, or 0 when replicated.
  // Throws kInvalidArgument when rank >= world_size.
  [[nodiscard]] std::uint32_t copy_index(std::uint32_t rank) const;
  // Byte offset of rank's slot in chunk from the start of the data. Throws on out-of-range input.
  [[nodiscard]] std::uint64_t slot_offset(std::uint64_t chunk, std::uint32_t rank) const;

  friend bool operator==(const RegionGeometry&, const RegionGeometry&) = default;

 private:
  RegionLayout layout_{};
  std::uint32_t copies_ = 0;
  std::uint64_t slot_stride_ = 0;
  std::uint64_t row_stride_ = 0;
  std::uint64_t data_bytes_ = 0;
  std::size_t page_size_ = 0;
};

}  // namespace kvoffload
