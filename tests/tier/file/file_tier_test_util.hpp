#pragma once
// The kit of the file tier suites (file_tier_test.cpp, file_tier_failures_test.cpp,
// file_tier_io_test.cpp): options for a tier under a root, keys 1..n stored with pattern()
// payloads, a single get, and a check that every stored payload reads back identical.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/file_tier.hpp>

#include "tier_test_util.hpp"

namespace kvoffload::test {

inline FileTierOptions options_for(const std::filesystem::path& root,
                                   std::uint64_t capacity = 64 << 20) {
  FileTierOptions o;
  o.root = root;
  o.capacity_bytes = capacity;
  o.io_threads = 2;
  return o;
}

// Stores `n` keys 1..n with payloads of `bytes` bytes; returns the payloads.
inline std::vector<std::vector<std::byte>> put_keys(SecondaryTier& tier, std::size_t n,
                                                    std::size_t bytes) {
  std::vector<std::vector<std::byte>> data;
  std::vector<TierPut> puts;
  for (std::size_t i = 0; i < n; ++i) data.push_back(pattern(bytes, static_cast<std::uint32_t>(i)));
  for (std::size_t i = 0; i < n; ++i) puts.push_back({BlockKey::from_u64(i + 1), data[i]});
  const auto results = tier.put(puts).wait();
  for (const auto& r : results) EXPECT_EQ(r.status, TierItemStatus::kOk) << r.detail;
  return data;
}

inline TierItemResult get_one(SecondaryTier& tier, BlockKey key, std::span<std::byte> into) {
  const TierGet g{key, into};
  return tier.get(std::span(&g, 1)).wait()[0];
}

inline void expect_round_trip(SecondaryTier& tier,
                              const std::vector<std::vector<std::byte>>& data) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    std::vector<std::byte> out(data[i].size(), std::byte{0x5A});
    const auto r = get_one(tier, BlockKey::from_u64(i + 1), out);
    ASSERT_EQ(r.status, TierItemStatus::kOk) << r.detail;
    EXPECT_EQ(out, data[i]) << "key " << i + 1;
  }
}

}  // namespace kvoffload::test
