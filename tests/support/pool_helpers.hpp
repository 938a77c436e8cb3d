#pragma once
// Shared by the node pool suites: options for a small pool in the test's own directory, and
// chunk bytes derived from the key so every load can be verified.

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/hash.hpp>
#include <kvoffload/node_pool.hpp>

namespace kvoffload::pool::test {

inline PoolOptions small_options(const std::filesystem::path& dir, const std::string& engine,
                                 std::uint32_t slots = 8, std::uint64_t slot_bytes = 512) {
  PoolOptions o;
  o.name = "testpool";
  o.shm_dir = dir;
  o.engine_id = engine;
  o.geometry.slot_bytes = slot_bytes;
  o.geometry.slot_count = slots;
  o.geometry.world_size = 2;
  o.geometry.layout = "layer_major";
  o.geometry.dtype = "bf16";
  o.geometry.fingerprint = "llama-3-8b/ns0";
  o.lock_timeout = std::chrono::milliseconds(2000);
  return o;
}

inline BlockKey key(std::uint64_t i) {
  return BlockKey(splitmix64(i) | 1, i);
}

inline std::vector<BlockKey> keys(std::uint64_t from, std::uint64_t n) {
  std::vector<BlockKey> out;
  for (std::uint64_t i = 0; i < n; ++i) out.push_back(key(from + i));
  return out;
}

// The bytes rank r keeps for key k: a function of both, so a chunk of another key or rank, or a
// half-written one, never verifies.
inline std::uint8_t byte_of(const BlockKey& k, std::uint32_t rank, std::uint64_t i) {
  return static_cast<std::uint8_t>(splitmix64(k.lo() * 1315423911ULL + rank * 2654435761ULL + i));
}

inline void write_chunk(NodePool& p, std::uint32_t slot, const BlockKey& k) {
  for (std::uint32_t r = 0; r < p.geometry().world_size; ++r) {
    std::byte* b = p.chunk(slot, r);
    for (std::uint64_t i = 0; i < p.geometry().slot_bytes; ++i)
      b[i] = static_cast<std::byte>(byte_of(k, r, i));
  }
}

// Whether every byte of every rank's slot is the key's.
inline bool chunk_holds(NodePool& p, std::uint32_t slot, const BlockKey& k) {
  for (std::uint32_t r = 0; r < p.geometry().world_size; ++r) {
    const std::byte* b = p.chunk(slot, r);
    for (std::uint64_t i = 0; i < p.geometry().slot_bytes; ++i)
      if (b[i] != static_cast<std::byte>(byte_of(k, r, i))) return false;
  }
  return true;
}

// Stores keys that are absent: prepare, write the bytes, commit. Returns how many were stored.
inline std::size_t store(NodePool& p, const std::vector<BlockKey>& ks) {
  const StoreOutcome out = p.prepare_stores(ks);
  const std::vector<std::uint32_t> slots(out.slots.begin(), out.slots.end());
  for (std::size_t i = 0; i < slots.size(); ++i) write_chunk(p, slots[i], ks[out.positions[i]]);
  p.commit_stores(slots);
  return slots.size();
}

// Loads the ready prefix (pinned while read) and verifies its bytes; returns the hit count.
inline std::uint32_t load_verified(NodePool& p, const std::vector<BlockKey>& ks) {
  const LookupOutcome out = p.lookup(ks, true);
  const std::vector<std::uint32_t> slots(out.slots.begin(), out.slots.end());
  for (std::size_t i = 0; i < slots.size(); ++i)
    EXPECT_TRUE(chunk_holds(p, slots[i], ks[i])) << "slot " << slots[i] << " key " << i;
  p.unpin(slots);
  return out.hits;
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

#define EXPECT_POOL_OK(p) EXPECT_EQ(::kvoffload::pool::test::joined((p).check_invariants()), "")

}  // namespace kvoffload::pool::test
