#pragma once
// KV layout: how GPU KV-cache blocks map onto the host chunks of one rank (docs/DESIGN.md §5.1).
//
// Device side: one or more KV groups (e.g. full attention and sliding window), each a list of
// tensors; tensor t holds num_blocks pages of page_bytes, block b at base + b·block_stride.
// Host side: a buffer of num_chunks rows of row_stride bytes; this rank's slot of chunk c starts at
// base + c·row_stride + slot_offset and is slot_bytes long (a Region gives all of these).
// Packing inside a slot: group after group, tensor after tensor, each tensor's section holding
// blocks_per_chunk pages back to back:
//
//   slot = | g0.t0: page[0..bpc) | g0.t1: page[0..bpc) | ... | g1.t0: page[0..bpc) | ... |
//
// so the slot must hold blocks_per_chunk · Σ page_bytes over every tensor of every group.
// Explicit sections instead (every tensor sets host_offset): tensor t's position p sits at
// host_offset + p·host_page_stride of the slot, so tensors of different groups may share a
// section. That is vLLM's layout, where each unique KV tensor has one section of
// bpc × (padded page) bytes and every group copies its layers' (unpadded) pages into the
// sections of the tensors it uses; a chunk then belongs to one group (TransferSpec::group_chunks).
// A job maps, for each group, a list of GPU block ids onto consecutive chunk positions starting
// at position `skip` of the first listed chunk (a mid-chunk start): block i of a group lands at
// chunk chunks[(skip + i) / bpc], position (skip + i) % bpc. With group_chunks, each group has
// its own chunks and skip.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <kvoffload/export.h>

namespace kvoffload {

class Region;

struct DeviceTensor {
  static constexpr std::uint64_t kPacked = ~std::uint64_t{0};

  std::uint64_t base = 0;          // device address (e.g. torch tensor.data_ptr())
  std::uint64_t num_blocks = 0;    // > 0
  std::uint64_t page_bytes = 0;    // bytes of one block of this tensor, > 0 (any size)
  std::uint64_t block_stride = 0;  // bytes between blocks, >= page_bytes (0 = page_bytes)
  // Section of this tensor in a slot: kPacked = after the previous tensor, positions page_bytes
  // apart; otherwise `host_offset` bytes into the slot, positions host_page_stride apart
  // (>= page_bytes; 0 = page_bytes). Either every tensor of a layout is packed or none is.
  std::uint64_t host_offset = kPacked;
  std::uint64_t host_page_stride = 0;
};

struct KvGroup {
  std::vector<DeviceTensor> tensors;  // at least one
};

// Where this rank's slots live in host memory.
struct KVOFFLOAD_API HostSlots {
  std::byte* base = nullptr;       // start of the buffer (the region's data)
  std::uint64_t buffer_bytes = 0;  // >= num_chunks · row_stride
  std::uint64_t num_chunks = 0;
  std::uint64_t row_stride = 0;   // bytes between chunks
  std::uint64_t slot_offset = 0;  // this rank's slot within a row
  std::uint64_t slot_bytes = 0;

  // Ranked (or replicated: every rank uses slot 0) slots of `rank` in a region.
  static HostSlots from_region(const Region& region, std::uint32_t rank);
  // Slots in any host buffer: chunk c of copy `copy_index` at c·row_stride + copy_index·slot_bytes.
  // row_stride 0 means slot_bytes (a plain array of slots).
  static HostSlots from_buffer(std::span<std::byte> buffer, std::uint64_t slot_bytes,
                               std::uint64_t row_stride = 0, std::uint32_t copy_index = 0);

  [[nodiscard]] std::byte* slot(std::uint64_t chunk) const noexcept {
    return base + chunk * row_stride + slot_offset;
  }
};

struct KVOFFLOAD_API KvLayout {
  std::vector<KvGroup> groups;         // at least one
  std::uint32_t blocks_per_chunk = 1;  // GPU blocks per host chunk, > 0
  HostSlots host;

  // Throws Error(kInvalidArgument) with a message naming the field and values when anything is
  // inconsistent (empty groups, zero sizes, stride < page, overflow, slot too small for
  // blocks_per_chunk · Σ page_bytes or for an explicit section, sections of one group that
  // overlap, packed and explicit sections mixed, slots outside the buffer, ...).
  void validate() const;

  // Bytes of a slot the tensors' sections reach: blocks_per_chunk · Σ page_bytes when packed,
  // else the end of the furthest section.
  [[nodiscard]] std::uint64_t chunk_payload_bytes() const noexcept;
  // True when every tensor has an explicit section (host_offset != kPacked).
  [[nodiscard]] bool explicit_sections() const noexcept;
  // True when a section of one group overlaps a section of another (then a chunk may hold only
  // one group's blocks: jobs give each group its own chunks with TransferSpec::group_chunks).
  [[nodiscard]] bool groups_share_sections() const noexcept;
};

// Direction of a job: store = device → host (D2H), load = host → device (H2D).
enum class Direction : std::uint8_t { kStore = 0, kLoad = 1 };
KVOFFLOAD_API std::string_view to_string(Direction d) noexcept;  // "store" | "load"

// Host chunks of one group in a job whose groups have chunks of their own (vLLM's: a chunk holds
// one KV-cache group's blocks).
struct GroupChunks {
  std::span<const std::uint64_t> chunks;  // exactly ceil((skip + blocks) / bpc) of them
  std::uint32_t skip = 0;                 // first position used in chunks[0], < blocks_per_chunk
};

// One job's mapping. Spans are read only during submit()/plan(): callers may reuse them after.
struct TransferSpec {
  std::span<const std::uint64_t> chunks;  // host chunk ids, in mapping order
  std::uint32_t skip = 0;                 // first position used in chunks[0], < blocks_per_chunk
  // group_blocks[g]: GPU block ids of group g (one entry per layout group; may be empty), at most
  // chunks.size()·bpc − skip of them, and every listed chunk must receive at least one block of
  // some group.
  std::span<const std::span<const std::uint64_t>> group_blocks;
  // Instead of chunks/skip (which must then be empty/0): one entry per layout group, group g's
  // blocks filling group_chunks[g].chunks from position group_chunks[g].skip. A store may not
  // name a chunk twice across all groups.
  std::span<const GroupChunks> group_chunks;
};

}  // namespace kvoffload
