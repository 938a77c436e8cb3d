#include <limits>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/geometry.hpp>

namespace kvoffload {
namespace {

// The file holds a header page before the data and its size must fit off_t.
constexpr std::uint64_t kMaxDataBytes =
    static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) / 2;

std::string describe(const RegionLayout& l) {
  return "num_chunks=" + std::to_string(l.num_chunks) +
         ", slot_bytes=" + std::to_string(l.slot_bytes) +
         ", world_size=" + std::to_string(l.world_size) +
         ", slot_align=" + std::to_string(l.slot_align) + (l.replicated ? ", replicated" : "");
}

[[noreturn]] void overflow(const RegionLayout& l, const char* what) {
  throw_invalid("region geometry overflows: " + std::string(what) + " (" + describe(l) +
                ") exceeds " + std::to_string(kMaxDataBytes) + " bytes");
}

}  // namespace

bool operator==(const RegionLayout& a, const RegionLayout& b) noexcept {
  return a.num_chunks == b.num_chunks && a.slot_bytes == b.slot_bytes &&
         a.world_size == b.world_size && a.replicated == b.replicated &&
         a.slot_align == b.slot_align;
}

RegionGeometry RegionGeometry::compute(const RegionLayout& layout, std::size_t page_size) {
  if (layout.num_chunks == 0) throw_invalid("num_chunks is 0; it must be at least 1");
  if (layout.slot_bytes == 0) throw_invalid("slot_bytes is 0; it must be at least 1");
  if (layout.world_size == 0) throw_invalid("world_size is 0; it must be at least 1");
  if (page_size == 0 || (page_size & (page_size - 1)) != 0) {
    throw_invalid("page size " + std::to_string(page_size) + " is not a power of two");
  }
  const std::uint64_t align = layout.slot_align;
  if (align < kMinSlotAlign || (align & (align - 1)) != 0 || align > page_size) {
    throw_invalid(
        "slot_align " + std::to_string(align) + " is not allowed: it must be a power of two from " +
        std::to_string(kMinSlotAlign) + " to the page size (" + std::to_string(page_size) +
        "); the default is " + std::to_string(kDefaultSlotAlign));
  }
  RegionGeometry g;
  g.layout_ = layout;
  g.page_size_ = page_size;
  g.copies_ = layout.replicated ? 1U : layout.world_size;

  if (layout.slot_bytes > kMaxDataBytes) overflow(layout, "slot_bytes");
  const std::uint64_t slot = (layout.slot_bytes + align - 1) / align * align;  // cannot wrap
  std::uint64_t row = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(g.copies_), slot, &row) ||
      row > kMaxDataBytes) {
    overflow(layout, "copies x slot_stride");
  }
  const std::uint64_t page = page_size;
  row = (row + page - 1) / page * page;  // cannot wrap: row <= kMaxDataBytes
  std::uint64_t data = 0;
  if (__builtin_mul_overflow(layout.num_chunks, row, &data) || data > kMaxDataBytes) {
    overflow(layout, "num_chunks x row_stride");
  }
  g.slot_stride_ = slot;
  g.row_stride_ = row;
  g.data_bytes_ = data;
  return g;
}

std::uint32_t RegionGeometry::copy_index(std::uint32_t rank) const {
  if (rank >= layout_.world_size) {
    throw_invalid("rank " + std::to_string(rank) + " is out of range: world_size is " +
                  std::to_string(layout_.world_size) + ", so rank must be 0.." +
                  std::to_string(layout_.world_size - 1));
  }
  return layout_.replicated ? 0U : rank;
}

std::uint64_t RegionGeometry::slot_offset(std::uint64_t chunk, std::uint32_t rank) const {
  if (chunk >= layout_.num_chunks) {
    throw_invalid("chunk " + std::to_string(chunk) + " is out of range: the region has " +
                  std::to_string(layout_.num_chunks) + " chunks, so chunk must be 0.." +
                  std::to_string(layout_.num_chunks - 1));
  }
  return chunk * row_stride_ + static_cast<std::uint64_t>(copy_index(rank)) * slot_stride_;
}

}  // namespace kvoffload
