#pragma once
// Pre-faulting a mapped region (docs/DESIGN.md §3.3): probe MADV_POPULATE_WRITE once; on EINVAL
// (kernels before 5.14) fall back to touching one byte per page without changing it; any other
// errno is an error naming the errno and the range. A ranked mapper populates only its own slots,
// row by row, in page-aligned ranges; an unranked mapper the whole data.
//
// Note [Allocation by populate]: the creator sizes the region file sparse (ftruncate) and every
// mapper allocates the pages it populates: MADV_POPULATE_WRITE on a shared tmpfs mapping allocates
// through the fault path, which does not take the inode lock, so W ranks allocate their columns in
// parallel (a whole-file fallocate holds the inode lock and is serial). A tmpfs that fills after
// the creator's capacity check makes that madvise fail with EFAULT (the fault's SIGBUS) or ENOMEM
// (a cgroup limit); both become a kCapacity error naming the shortfall, never a signal. The
// fallback (no MADV_POPULATE_WRITE) fallocates each range before touching it, so it never touches
// a page that is not allocated; a mapper that does not populate fallocates its ranges.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <kvoffload/geometry.hpp>
#include <kvoffload/region.hpp>

#include "sys/syscalls.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older libc headers lack it
#endif

namespace kvoffload::detail {

struct ByteRange {
  std::byte* begin = nullptr;
  std::size_t size = 0;
};

// The page-aligned ranges one mapper populates, computed on demand (a region may have millions
// of rows; no per-row allocation).
class PopulatePlan {
 public:
  PopulatePlan(const RegionGeometry& geometry, std::byte* data, std::optional<std::uint32_t> rank);

  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] ByteRange range(std::size_t i) const noexcept;
  [[nodiscard]] std::uint64_t total_bytes() const noexcept { return total_bytes_; }
  // The ranges of rows [first_row, first_row + rows) of a ranked plan (one range per row).
  [[nodiscard]] PopulatePlan rows(std::uint64_t first_row, std::uint64_t rows) const noexcept;

 private:
  std::byte* data_ = nullptr;
  std::uint64_t data_bytes_ = 0;
  std::uint64_t stride_ = 0;  // distance between consecutive ranges
  std::uint64_t first_ = 0;   // offset of range 0 from data
  std::uint64_t length_ = 0;  // length of every range (the last unranked one may be shorter)
  std::size_t count_ = 0;
  std::uint64_t total_bytes_ = 0;
};

// Told of every page the fallback touches (its first byte), after the touch: tests count touches
// with it (one per page, never more). Empty: nobody is told.
struct TouchObserver {
  void (*fn)(void* ctx, std::byte* page) noexcept = nullptr;
  void* ctx = nullptr;
};

// Touches every page of `range` once, with an atomic `|= 0` on its first byte so no byte changes,
// even under concurrent writers from other ranks, and the compiler cannot drop the write.
void touch_pages_preserving(ByteRange range, std::size_t page_size,
                            TouchObserver observe = {}) noexcept;

// The file behind a mapping. fd < 0: anonymous memory (nothing to allocate; the tests' case).
struct BackingFile {
  int fd = -1;
  std::byte* file_base = nullptr;  // the address that maps file offset 0
  int dirfd = -1;                  // the shm dir, for the free-space figure of a shortfall error
  std::string dir;
};

// Populates every range of `plan` with `threads` workers (>= 1). `what` names the region in
// errors. Throws Error(kSystem) naming errno and the range on a madvise failure other than EINVAL;
// Error(kCapacity) naming the shortfall when a file-backed range cannot be allocated
// (Note [Allocation by populate]).
PopulateReport populate(const Syscalls& sys, const PopulatePlan& plan, std::size_t page_size,
                        unsigned threads, const std::string& what, const BackingFile& file = {},
                        TouchObserver observe = {});

// Allocates (fallocate, no pre-fault) every range of `plan` in `file`: for mappers that do not
// populate, so that their later first touch cannot fault on a full tmpfs.
void allocate(const Syscalls& sys, const PopulatePlan& plan, const BackingFile& file,
              const std::string& what);

}  // namespace kvoffload::detail
