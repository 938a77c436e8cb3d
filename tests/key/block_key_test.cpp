#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/block_key.hpp>
#include <kvoffload/error.hpp>

namespace kvoffload {
namespace {

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kOk;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(BlockKey, ShortHexIsZeroPaddedOnTheLeft) {
  EXPECT_EQ(BlockKey::parse_hex("ff"), BlockKey::from_u64(255));
  EXPECT_EQ(BlockKey::parse_hex("0"), BlockKey());
  EXPECT_EQ(BlockKey::parse_hex("00000000000000000000000000000ff"), BlockKey::from_u64(255));
  EXPECT_EQ(BlockKey::parse_hex("1"), BlockKey(0, 1));
  EXPECT_EQ(BlockKey::parse_hex("10000000000000000"), BlockKey(1, 0));  // 17 digits crosses halves
}

TEST(BlockKey, FullWidthAndCase) {
  const BlockKey k = BlockKey::parse_hex("0123456789ABCDEFfedcba9876543210");
  EXPECT_EQ(k.hi(), 0x0123456789ABCDEFull);
  EXPECT_EQ(k.lo(), 0xFEDCBA9876543210ull);
  EXPECT_EQ(k.to_hex(), "0123456789abcdeffedcba9876543210");
  // Spelled out: GCC 12 warns (-Warray-bounds, a false positive in libstdc++'s operator+) on
  // std::string(30, '0') + "ab", and warnings are errors.
  EXPECT_EQ(BlockKey::from_u64(0xab).to_hex(), "000000000000000000000000000000ab");
}

TEST(BlockKey, RefusesBadText) {
  EXPECT_EQ(code_of([] { (void)BlockKey::parse_hex(""); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { (void)BlockKey::parse_hex(std::string(33, '1')); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { (void)BlockKey::parse_hex("0x12"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { (void)BlockKey::parse_hex("12 "); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { (void)BlockKey::parse_hex("-1"); }), ErrorCode::kInvalidArgument);
  EXPECT_NE(message_of([] { (void)BlockKey::parse_hex("12g4"); }).find("character 3"),
            std::string::npos);
  EXPECT_NE(message_of([] { (void)BlockKey::parse_hex(std::string(33, 'a')); }).find("33 digits"),
            std::string::npos);
  EXPECT_FALSE(BlockKey::try_parse_hex("zz").has_value());
  EXPECT_TRUE(BlockKey::try_parse_hex("Zz").has_value() == false);
  EXPECT_EQ(BlockKey::try_parse_hex("a").value(), BlockKey::from_u64(10));
}

TEST(BlockKey, HexRoundTripRandom) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const BlockKey k(rng(), rng());
    EXPECT_EQ(BlockKey::parse_hex(k.to_hex()), k);
    char buf[BlockKey::kHexDigits];
    k.to_hex(buf);
    EXPECT_EQ(std::string(buf, sizeof(buf)), k.to_hex());
  }
}

TEST(BlockKey, Bytes) {
  const BlockKey k = BlockKey::parse_hex("0102030405060708090a0b0c0d0e0f10");
  const auto bytes = k.to_bytes();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(bytes[i], i + 1);
  EXPECT_EQ(BlockKey::from_bytes(bytes), k);
  const std::vector<std::uint8_t> two{0x12, 0x34};
  EXPECT_EQ(BlockKey::from_bytes(two), BlockKey::from_u64(0x1234));
  std::vector<std::uint8_t> digest(32);
  for (int i = 0; i < 32; ++i) digest[i] = static_cast<std::uint8_t>(i + 1);
  EXPECT_EQ(BlockKey::from_digest_prefix(digest), k);
  EXPECT_EQ(code_of([&] { (void)BlockKey::from_bytes(digest); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { (void)BlockKey::from_digest_prefix(two); }), ErrorCode::kInvalidArgument);
}

TEST(BlockKey, OrderingAndHash) {
  EXPECT_LT(BlockKey(0, 5), BlockKey(1, 0));
  EXPECT_LT(BlockKey(1, 1), BlockKey(1, 2));
  // Small integer keys must spread: no two of 10^4 share a hash.
  std::unordered_set<std::uint64_t> hashes;
  for (std::uint64_t i = 0; i < 10000; ++i) hashes.insert(BlockKey::from_u64(i).hash());
  EXPECT_EQ(hashes.size(), 10000u);
  EXPECT_NE(BlockKey(1, 0).hash(), BlockKey(0, 1).hash());
}

}  // namespace
}  // namespace kvoffload
