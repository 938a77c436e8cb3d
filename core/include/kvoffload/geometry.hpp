#pragma once
// Geometry of the shared host region (DESIGN.md §2):
//   P = slot_bytes (one rank's bytes for one chunk), C = copies (world_size, or 1 when replicated),
//   R = row_stride = round_up(C·P, page), data_bytes = num_chunks · R,
//   rank r's slot in chunk c starts at c·R + copy(r)·P, where copy(r) = r, or 0 when replicated.
// All arithmetic is overflow-checked; invalid input throws Error(kInvalidArgument) naming the value.

#include <kvoffload/export.h>

#include <cstddef>
#include <cstdint>

namespace kvoffload {

struct RegionLayout {
  std::uint64_t num_chunks = 0;   // rows in the region, > 0
  std::uint64_t slot_bytes = 0;   // P, > 0
  std::uint32_t world_size = 1;   // ranks of the engine, > 0
  bool replicated = false;        // MLA: every rank shares slot 0 (C = 1)
};

class KVOFFLOAD_API RegionGeometry {
 public:
  // Validates and computes. page_size must be a power of two (the system page, normally).
  static RegionGeometry compute(const RegionLayout& layout, std::size_t page_size);

  [[nodiscard]] const RegionLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::uint64_t num_chunks() const noexcept { return layout_.num_chunks; }
  [[nodiscard]] std::uint64_t slot_bytes() const noexcept { return layout_.slot_bytes; }
  [[nodiscard]] std::uint32_t world_size() const noexcept { return layout_.world_size; }
  [[nodiscard]] bool replicated() const noexcept { return layout_.replicated; }
  [[nodiscard]] std::uint32_t copies() const noexcept { return copies_; }
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
  std::uint64_t row_stride_ = 0;
  std::uint64_t data_bytes_ = 0;
  std::size_t page_size_ = 0;
};

KVOFFLOAD_API bool operator==(const RegionLayout& a, const RegionLayout& b) noexcept;

}  // namespace kvoffload
