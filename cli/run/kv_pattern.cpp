#include "kv_pattern.hpp"

#include <algorithm>
#include <cstring>

#include <kvoffload/hash.hpp>

namespace kvoffload::run {
namespace {

std::uint64_t seed_of(const BlockTag& tag) noexcept {
  return mix64(tag.key.hi() ^ mix64(tag.key.lo() ^ (std::uint64_t{tag.rank} << 48) ^
                                    (std::uint64_t{tag.layer} << 24) ^ tag.position));
}

// Word i of the pattern: splitmix64's stream from the seed, cheap to generate (one multiply-add
// and a mix per 8 bytes).
inline std::uint64_t word(std::uint64_t seed, std::uint64_t i) noexcept {
  return mix64(seed + i * kGoldenGamma);
}

}  // namespace

void fill_pattern(const BlockTag& tag, std::span<std::byte> out) noexcept {
  const std::uint64_t seed = seed_of(tag);
  const std::size_t words = out.size() / 8;
  for (std::size_t i = 0; i < words; ++i) {
    const std::uint64_t w = word(seed, i);
    std::memcpy(out.data() + i * 8, &w, 8);
  }
  if (const std::size_t tail = out.size() % 8; tail != 0) {
    const std::uint64_t w = word(seed, words);
    std::memcpy(out.data() + words * 8, &w, tail);
  }
}

std::uint64_t count_mismatches(const BlockTag& tag, std::span<const std::byte> data) noexcept {
  const std::uint64_t seed = seed_of(tag);
  std::uint64_t bad = 0;
  for (std::size_t offset = 0; offset < data.size(); offset += 8) {
    const std::uint64_t expected = word(seed, offset / 8);
    const std::size_t n = std::min<std::size_t>(8, data.size() - offset);
    if (std::memcmp(data.data() + offset, &expected, n) != 0) {
      const auto* e = reinterpret_cast<const std::byte*>(&expected);
      for (std::size_t b = 0; b < n; ++b) bad += data[offset + b] != e[b] ? 1 : 0;
    }
  }
  return bad;
}

}  // namespace kvoffload::run
