#pragma once
// The remote tier suites' kit (remote_*_test.cpp): options with deadlines short enough that every
// failure case finishes in well under a second, rows derived from their keys, and put / get /
// lookup helpers that check what the tier leaves alone (a 0xEE sentinel in every get buffer).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/remote_tier.hpp>

namespace kvoffload::test {

inline constexpr std::uint64_t kSlot = 5000;  // not page-aligned on purpose
inline constexpr std::uint32_t kWorld = 2;

inline RemoteTierOptions options(const std::string& url, std::uint64_t slot = kSlot,
                                 std::uint32_t world = kWorld) {
  using namespace std::chrono_literals;
  RemoteTierOptions o;
  o.url = RemoteUrl::parse(url);
  o.geometry = {.slot_bytes = slot, .world_size = world, .tensor_layout = "test", .dtype = "u8"};
  o.connect_timeout = 200ms;
  o.lookup_timeout = 150ms;
  o.get_timeout = 400ms;
  o.put_timeout = 400ms;
  o.breaker_backoff = 100ms;
  o.breaker_backoff_max = 200ms;
  o.negative_ttl = 0ms;
  o.warn_interval = 1000ms;
  o.max_inflight_bytes = 1 << 20;
  return o;
}

inline std::vector<std::byte> row_of(const BlockKey& key, std::size_t bytes) {
  std::vector<std::byte> v(bytes);
  std::mt19937_64 rng(key.lo() * 31 + key.hi());
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

inline std::vector<BlockKey> keys_from(std::uint64_t first, std::size_t n) {
  std::vector<BlockKey> k;
  for (std::size_t i = 0; i < n; ++i) k.emplace_back(0xC0FFEE, first + i);
  return k;
}

inline std::vector<TierItemResult> put_rows(RemoteTier& tier, const std::vector<BlockKey>& keys) {
  const std::size_t bytes = tier.options().geometry.slot_bytes * tier.options().geometry.copies();
  std::vector<std::vector<std::byte>> rows;
  std::vector<TierPut> puts;
  rows.reserve(keys.size());
  puts.reserve(keys.size());
  for (const auto& k : keys) rows.push_back(row_of(k, bytes));
  for (std::size_t i = 0; i < keys.size(); ++i) puts.push_back({keys[i], rows[i]});
  return tier.put(puts).wait();
}

struct GetResult {
  std::vector<TierItemResult> items;
  std::vector<std::vector<std::byte>> rows;
};

// Gets into buffers pre-filled with 0xEE (a sentinel the tier must leave alone on a miss).
inline GetResult get_rows(RemoteTier& tier, const std::vector<BlockKey>& keys) {
  const std::size_t bytes = tier.options().geometry.slot_bytes * tier.options().geometry.copies();
  GetResult g;
  g.rows.assign(keys.size(), std::vector<std::byte>(bytes, std::byte{0xEE}));
  std::vector<TierGet> gets;
  gets.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) gets.push_back({keys[i], g.rows[i]});
  g.items = tier.get(gets).wait();
  return g;
}

inline bool all_sentinel(const std::vector<std::byte>& row) {
  return std::all_of(row.begin(), row.end(), [](std::byte b) { return b == std::byte{0xEE}; });
}

// Asks until no key is pending (bounded: the tier's lookup budget ends every pending answer).
inline std::vector<TierPresence> resolve(RemoteTier& tier, const std::vector<BlockKey>& keys,
                                         std::size_t* rounds = nullptr) {
  std::vector<TierPresence> out(keys.size());
  for (std::size_t round = 1; round < 2000; ++round) {
    tier.lookup(keys, out);
    if (std::none_of(out.begin(), out.end(),
                     [](TierPresence p) { return p == TierPresence::kPending; })) {
      if (rounds != nullptr) *rounds = round;
      return out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "lookups stayed pending";
  return out;
}

inline std::size_t count(const std::vector<TierItemResult>& r, TierItemStatus s) {
  return static_cast<std::size_t>(
      std::count_if(r.begin(), r.end(), [&](const auto& x) { return x.status == s; }));
}

}  // namespace kvoffload::test
