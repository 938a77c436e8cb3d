#pragma once
// BlockKey: the identity of one offloaded KV chunk, an opaque fixed-size block hash.
//
// Width: 128 bits. Engines already name blocks by prefix hashes (vLLM's block hashes, LMCache's
// chunk hashes); 128 bits keeps a truncated cryptographic digest collision-free in practice (the
// birthday bound at 10^9 live keys is ~10^18 / 2^129 ≈ 1.5e-21), fits two registers, compares in
// two instructions and packs 4 per cache line in the manager's slot array. 64 bits would give a
// ~3% collision chance at 10^9 keys (and a collision here means serving another prompt's KV).
//
// Text form: hexadecimal, most significant digit first, 1 to 32 digits; shorter strings are
// zero-padded on the left (so "ff" and "000...0ff" are the same key). Formatting always gives 32
// lower-case digits. Byte form: 16 bytes, big-endian (the same order as the hex text).

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <kvoffload/error.hpp>
#include <kvoffload/export.h>
#include <kvoffload/hash.hpp>

namespace kvoffload {

class KVOFFLOAD_API BlockKey {
 public:
  static constexpr std::size_t kBytes = 16;
  static constexpr std::size_t kHexDigits = 2 * kBytes;

  constexpr BlockKey() noexcept = default;
  constexpr BlockKey(std::uint64_t hi, std::uint64_t lo) noexcept : hi_(hi), lo_(lo) {}
  // The key whose numeric value is `value` (hex "…0<value>"); handy for tests and integer hashes.
  static constexpr BlockKey from_u64(std::uint64_t value) noexcept { return BlockKey(0, value); }

  // Parses 1..32 hex digits (either case, no prefix, no sign, no spaces). Throws
  // Error(kInvalidArgument) naming the text and what is wrong with it.
  static BlockKey parse_hex(std::string_view text);
  // The same without throwing; nullopt for anything parse_hex would refuse.
  static std::optional<BlockKey> try_parse_hex(std::string_view text) noexcept;

  // Up to 16 bytes, big-endian, zero-padded on the left. Throws kInvalidArgument for more.
  static BlockKey from_bytes(std::span<const std::uint8_t> bytes);
  // The first 16 bytes of a longer digest (e.g. a 32-byte SHA-256 block hash): a prefix of a
  // cryptographic hash is itself uniform. Throws kInvalidArgument when fewer than 16 bytes.
  static BlockKey from_digest_prefix(std::span<const std::uint8_t> digest);

  [[nodiscard]] std::array<std::uint8_t, kBytes> to_bytes() const noexcept;
  // 32 lower-case hex digits.
  [[nodiscard]] std::string to_hex() const;
  // Writes exactly kHexDigits characters (no terminator) to out: no allocation.
  void to_hex(char* out) const noexcept;

  [[nodiscard]] constexpr std::uint64_t hi() const noexcept { return hi_; }
  [[nodiscard]] constexpr std::uint64_t lo() const noexcept { return lo_; }

  // A well-mixed 64-bit hash of the key (hash_128_to_64, hash.hpp). Keys are usually hashes
  // already, but tests and traces use small integers, so this mixes anyway.
  [[nodiscard]] constexpr std::uint64_t hash() const noexcept { return hash_128_to_64(hi_, lo_); }

  friend constexpr bool operator==(const BlockKey&, const BlockKey&) noexcept = default;
  // clang-tidy 14 misreads the defaulted <=> as comparing with a literal 0 (LLVM issue 46235).
  // NOLINTNEXTLINE(modernize-use-nullptr)
  friend constexpr std::strong_ordering operator<=>(const BlockKey&,
                                                    const BlockKey&) noexcept = default;

 private:
  std::uint64_t hi_ = 0;  // most significant half (first 16 hex digits)
  std::uint64_t lo_ = 0;
};

struct BlockKeyHash {
  std::size_t operator()(const BlockKey& key) const noexcept {
    return static_cast<std::size_t>(key.hash());
  }
};

}  // namespace kvoffload

template <>
struct std::hash<kvoffload::BlockKey> : kvoffload::BlockKeyHash {};
