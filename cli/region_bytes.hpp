#pragma once
// `region create --fill / --check`: writes one byte value over this mapper's slots (or, unranked,
// the whole data) and verifies that every byte of them holds it, on several threads.

#include <cstdint>
#include <string>

#include <kvoffload/region.hpp>

namespace kvoffload::cli {

// "0x2a" for 42.
std::string hex_byte(unsigned value);

// Writes `value` over this mapper's slots (unranked: every row, padding included); returns the
// bytes written.
std::uint64_t fill_region(const Region& region, std::uint8_t value, unsigned threads);

// Verifies that this mapper's slots (unranked: every rank's slot) hold `value`; returns the bytes
// checked or throws kMismatch naming the first difference (chunk, slot, offset, byte found).
std::uint64_t check_region(const Region& region, std::uint8_t value, unsigned threads);

}  // namespace kvoffload::cli
