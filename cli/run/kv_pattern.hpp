#pragma once
// The deterministic KV contents `kvoffload run` writes and verifies: every byte of a GPU block is
// a function of (chunk key, rank, layer, position of the block in its chunk, byte offset), so a
// load into any device block can be checked without remembering what was stored.

#include <cstddef>
#include <cstdint>
#include <span>

#include <kvoffload/block_key.hpp>

namespace kvoffload::run {

struct BlockTag {
  BlockKey key;
  std::uint32_t rank = 0;
  std::uint32_t layer = 0;
  std::uint32_t position = 0;  // 0 .. blocks_per_chunk-1
};

// Fills `out` with the pattern of `tag`.
void fill_pattern(const BlockTag& tag, std::span<std::byte> out) noexcept;

// Number of bytes of `data` that differ from the pattern of `tag` (0: verified).
std::uint64_t count_mismatches(const BlockTag& tag, std::span<const std::byte> data) noexcept;

}  // namespace kvoffload::run
