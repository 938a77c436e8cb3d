// kvoffload/hash.hpp: every hash pinned to values computed before they were gathered in one header,
// because each value leaves the process (hash.hpp says where). A changed constant, seed, shift or
// block order fails here before it orphans a file tier's records or a remote tier's values.
#include <cstdint>
#include <string_view>

#include <gtest/gtest.h>

#include <kvoffload/block_key.hpp>
#include <kvoffload/hash.hpp>

namespace kvoffload {
namespace {

Hash128 hash_of(std::string_view text) {
  return hash_bytes_128(text.data(), text.size());
}

TEST(Hash, Bytes128IsPinned) {
  // The empty input, a tail only, exactly one block, and a vLLM-sized key (two blocks + a tail).
  struct Case {
    std::string_view text;
    std::uint64_t hi;
    std::uint64_t lo;
  };
  const Case cases[] = {
      {"", 0xa4d656a01bd817c6ULL, 0x9a825437f13f443cULL},
      {"a", 0x6fd7aab5a3136ff1ULL, 0xeaa23f43da7de3deULL},
      {"0123456789abcdef", 0x2e0df96e7d28b3e3ULL, 0x5386f7d226fd9dc1ULL},
      {"0123456789abcdef0123456789abcdef0123", 0xbbf613e8a39a5c42ULL, 0x294b11b6384b0a3dULL},
  };
  for (const Case& c : cases) {
    const Hash128 h = hash_of(c.text);
    EXPECT_EQ(h.hi, c.hi) << "'" << c.text << "'";
    EXPECT_EQ(h.lo, c.lo) << "'" << c.text << "'";
  }
}

TEST(Hash, Bytes128SeesEveryByteAndTheLength) {
  const Hash128 base = hash_of("0123456789abcdef0123456789abcdef0123");
  const Hash128 last = hash_of("0123456789abcdef0123456789abcdef0124");
  const Hash128 first = hash_of("1123456789abcdef0123456789abcdef0123");
  EXPECT_TRUE(base.hi != last.hi && base.lo != last.lo);
  EXPECT_TRUE(base.hi != first.hi && base.lo != first.lo);
  // A zero tail byte is not the same as no byte: the length is folded in.
  const char zeros[2] = {0, 0};
  const Hash128 one = hash_bytes_128(zeros, 1);
  const Hash128 two = hash_bytes_128(zeros, 2);
  EXPECT_TRUE(one.hi != two.hi && one.lo != two.lo);
}

TEST(Hash, SplitMix64IsPinned) {
  // splitmix64 seeded with 0 yields 0xe220a8397b1dcdaf first (the reference generator's output).
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(splitmix64(1), 0x910a2dec89025cc1ULL);
  EXPECT_EQ(mix64(0), 0U);
  EXPECT_EQ(mix64(1), 0x5692161d100b05e5ULL);
  EXPECT_EQ(mix64(0x0123456789abcdefULL), 0xb2c058e4ebb5112cULL);
  EXPECT_EQ(splitmix64(0x0123456789abcdefULL), 0x157a3807a48faa9dULL);
}

TEST(Hash, BlockKeyHashIsPinned) {
  EXPECT_EQ(BlockKey(0, 0).hash(), 0U);
  EXPECT_EQ(BlockKey(0, 1).hash(), 0x4179b061e0c0e0d0ULL);
  EXPECT_EQ(BlockKey(1, 2).hash(), 0x1631f5f59ff9001aULL);
  EXPECT_EQ(std::hash<BlockKey>{}(BlockKey(1, 2)), BlockKeyHash{}(BlockKey(1, 2)));
}

}  // namespace
}  // namespace kvoffload
