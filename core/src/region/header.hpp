#pragma once
// The region file's header: one page before the data holding magic, version, geometry and state.
// Joiners read it with pread (never through a mapping of a file that may still be growing).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <kvoffload/geometry.hpp>

#include "sys/syscalls.hpp"

namespace kvoffload::detail {

inline constexpr char kRegionMagic[8] = {'K', 'V', 'O', 'F', 'F', 'R', 'G', 'N'};
// Version 2 added slot_align (Note [Slot alignment] in geometry.hpp); version 3 the owner table
// (owners_offset, Note [Owners] in owners.hpp) and the live statistics area (stats_offset,
// stats_bytes; Note [Live stats] in core/src/live/live_page.hpp); version 4 the checksum over
// the fixed fields (Note [Header checksum]).
inline constexpr std::uint32_t kRegionVersion = 4;

enum class RegionState : std::uint32_t { kCreating = 1, kReady = 2 };

struct RegionHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t state;        // RegionState; the only field written after publication
  std::uint64_t data_offset;  // bytes before the data (a multiple of the page size)
  std::uint64_t num_chunks;
  std::uint64_t slot_bytes;
  std::uint32_t world_size;
  std::uint32_t replicated;
  std::uint64_t row_stride;
  std::uint64_t data_bytes;
  std::uint64_t page_size;
  char engine_id[136];             // NUL-terminated, for `region list`
  std::uint64_t slot_align;        // every slot starts on this boundary
  std::uint64_t slot_stride;       // slot_bytes rounded up to slot_align
  std::uint64_t readiness_offset;  // where the per-rank readiness table starts (kReadinessOffset)
  std::uint64_t owners_offset;     // where the owner table starts (owners_offset_for)
  // ---- live statistics (version 3) ----
  std::uint64_t stats_offset;  // page-aligned start of the live statistics area
  std::uint64_t stats_bytes;   // its length, a page multiple; the data starts right after it
  // ---- integrity (version 4) ----
  std::uint64_t checksum;  // header_checksum() of every field but `state` and itself
};

// Note [Progressive bring-up] (bringup.cpp): one entry per rank, after the header and before the
// data, written by that rank through its mapping and read by everyone, with atomics.
struct RankReadiness {
  std::uint32_t state;         // BringupState (0 pending, 1 running, 2 ready, 3 failed, 4 stopped)
  std::uint32_t sys_errno;     // errno of a failure, when it had one
  std::uint64_t ready_chunks;  // rows [0, ready_chunks) are ready on this rank
};
static_assert(sizeof(RankReadiness) == 16);

inline constexpr std::uint64_t kReadinessOffset = 1024;
static_assert(sizeof(RegionHeader) <= kReadinessOffset);

// The header's byte range, locked (OFD write lock) by the creator until the region is ready: a
// joiner that finds it unlocked while the state says "creating" knows the creator died.
inline constexpr off_t kCreatorLockStart = 0;
inline constexpr off_t kCreatorLockLen = sizeof(RegionHeader);

// Note [Owners] (owners.hpp): one record per role (rank 0 .. world_size-1, then the scheduler),
// right after the readiness table; the role's locks sit on the first two bytes of its record.
struct OwnerRecord {
  std::uint32_t pid;  // of the process holding the role, 0 when none (valid only while it holds
                      // the role's "recorded" lock)
  std::uint32_t reserved;
};
static_assert(sizeof(OwnerRecord) == 8);

// Start of the owner table: the end of the readiness table of `world_size` ranks.
std::uint64_t owners_offset_for(std::uint32_t world_size) noexcept;

// Layout before the data, in pages:
//   [0, stats_offset)             the header, the readiness table of `world_size` ranks and the
//                                 owner table (world_size + 1 records)
//   [stats_offset, data_offset)   the live statistics area (Note [Live stats])
// The data stays page-aligned.
std::uint64_t stats_offset_for(std::size_t page_size, std::uint32_t world_size) noexcept;
std::uint64_t stats_bytes_for(std::size_t page_size, std::uint32_t world_size) noexcept;
std::uint64_t data_offset_for(std::size_t page_size, std::uint32_t world_size) noexcept;

RegionHeader make_header(const RegionGeometry& geometry, std::string_view engine_id);

// Layout recorded in the header; nullopt when the magic or version is not ours.
std::optional<RegionLayout> header_layout(const RegionHeader& header) noexcept;

// Note [Header checksum]: the creator writes every field once, before publication, except
// `state` (creating -> ready). A 64-bit hash of the header with `state` and `checksum` zeroed
// lets a reader tell a header that was changed afterwards (by hand, by a stray write, by a
// different program) from one the creator wrote, so a damaged header reads as "not a region"
// instead of a region of the wrong geometry.
std::uint64_t header_checksum(const RegionHeader& header) noexcept;

// Why `header`, read from a file of `file_bytes` bytes, is not an intact region header of ours:
// bad magic or version, a checksum that does not match, a geometry that does not compute or
// whose derived fields disagree, or a file size other than the one the geometry needs. "" when
// it is intact; otherwise a reason ending in "not a region file", for `region list`, `region
// clean` and the reclaim of a stale file alike (Note [What is ours to remove] in ownership.hpp).
std::string header_problem(const RegionHeader& header, std::uint64_t file_bytes);

// Note [Old formats]: formats 1 to 3 begin with the same fields as this one (magic, version,
// state, data_offset, num_chunks, slot_bytes, world_size, replicated, row_stride, data_bytes,
// page_size, engine_id: later formats only appended fields) and have no checksum. A file whose
// header has our magic and an older version, and whose recorded layout accounts for its size
// exactly (data_offset a page multiple of a power-of-two page size, data_bytes = num_chunks x
// row_stride, file size = data_offset + data_bytes), is a region an older kvoffload left:
// provably ours, so a stale one is removed like any stale region (Note [What is ours to
// remove]); it is never opened as a region. Returns its version, or nullopt.
std::optional<std::uint32_t> old_format_version(const RegionHeader& header,
                                                std::uint64_t file_bytes) noexcept;

// pread of the whole header. Returns false when the file is shorter than a header; throws
// Error(kSystem) when pread fails.
bool read_header(const Syscalls& sys, int fd, RegionHeader& out, const std::string& path);

// pwrite of the whole header area (header, zeroed readiness table, formatted live statistics
// area, up to data_offset) / of the
// state field; throws Error(kSystem) naming the path.
void write_header(const Syscalls& sys, int fd, const RegionHeader& header, const std::string& path);
void write_state(const Syscalls& sys, int fd, RegionState state, const std::string& path);

// pwrite / pread of the owner record at `offset` (Note [Owners]); throw Error(kSystem) naming
// the path. A short file reads as an empty record.
void write_owner(const Syscalls& sys, int fd, std::uint64_t offset, const OwnerRecord& record,
                 const std::string& path);
OwnerRecord read_owner(const Syscalls& sys, int fd, std::uint64_t offset, const std::string& path);

}  // namespace kvoffload::detail
