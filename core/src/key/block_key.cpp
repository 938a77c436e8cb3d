#include <kvoffload/block_key.hpp>
#include <kvoffload/error.hpp>

namespace kvoffload {
namespace {

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Shows at most 40 characters of a bad key in a message: a trace line may hold anything.
std::string quoted(std::string_view text) {
  constexpr std::size_t kShow = 40;
  if (text.size() <= kShow) return "'" + std::string(text) + "'";
  return "'" + std::string(text.substr(0, kShow)) + "...' (" + std::to_string(text.size()) +
         " characters)";
}

}  // namespace

// Digit values by character; kBadDigit marks anything that is not a hex digit. One table load
// per character, no branch: a trace of millions of keys is parsed at memory speed.
constexpr std::uint8_t kBadDigit = 0x10;
constexpr std::array<std::uint8_t, 256> kHexTable = [] {
  std::array<std::uint8_t, 256> t{};
  for (auto& v : t) v = kBadDigit;
  for (int c = 0; c < 10; ++c) t[static_cast<std::size_t>('0' + c)] = static_cast<std::uint8_t>(c);
  for (int c = 0; c < 6; ++c) {
    t[static_cast<std::size_t>('a' + c)] = static_cast<std::uint8_t>(10 + c);
    t[static_cast<std::size_t>('A' + c)] = static_cast<std::uint8_t>(10 + c);
  }
  return t;
}();

std::optional<BlockKey> BlockKey::try_parse_hex(std::string_view text) noexcept {
  const std::size_t n = text.size();
  if (n == 0 || n > kHexDigits) return std::nullopt;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  // The last 16 digits make the low half and the rest the high half: two independent chains
  // the CPU runs side by side; validity is OR-ed up and checked once.
  const std::size_t n_hi = n > 16 ? n - 16 : 0;
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  unsigned bad = 0;
  for (std::size_t i = 0; i < n_hi; ++i) {
    const unsigned v = kHexTable[s[i]];
    bad |= v;
    hi = (hi << 4) | (v & 0xF);
  }
  for (std::size_t i = n_hi; i < n; ++i) {
    const unsigned v = kHexTable[s[i]];
    bad |= v;
    lo = (lo << 4) | (v & 0xF);
  }
  if ((bad & kBadDigit) != 0) return std::nullopt;
  return BlockKey(hi, lo);
}

BlockKey BlockKey::parse_hex(std::string_view text) {
  if (auto key = try_parse_hex(text)) return *key;
  if (text.empty()) throw_invalid("block key: empty string; expected 1 to 32 hexadecimal digits");
  if (text.size() > kHexDigits) {
    throw_invalid("block key " + quoted(text) + ": " + std::to_string(text.size()) +
                  " digits, more than the 32 of a 128-bit key");
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (hex_value(text[i]) < 0) {
      throw_invalid("block key " + quoted(text) + ": character " + std::to_string(i + 1) +
                    " is not a hexadecimal digit");
    }
  }
  throw_invalid("block key " + quoted(text) + ": not a hexadecimal key");
}

BlockKey BlockKey::from_bytes(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > kBytes) {
    throw_invalid("block key: " + std::to_string(bytes.size()) +
                  " bytes, more than the 16 of a 128-bit key (use from_digest_prefix for longer "
                  "digests)");
  }
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  for (const std::uint8_t b : bytes) {
    hi = (hi << 8) | (lo >> 56);
    lo = (lo << 8) | b;
  }
  return BlockKey(hi, lo);
}

BlockKey BlockKey::from_digest_prefix(std::span<const std::uint8_t> digest) {
  if (digest.size() < kBytes) {
    throw_invalid("block key: a digest of " + std::to_string(digest.size()) +
                  " bytes is shorter than the 16 bytes of a key");
  }
  return from_bytes(digest.first(kBytes));
}

std::array<std::uint8_t, BlockKey::kBytes> BlockKey::to_bytes() const noexcept {
  std::array<std::uint8_t, kBytes> out{};
  for (std::size_t i = 0; i < 8; ++i) {
    out[i] = static_cast<std::uint8_t>(hi_ >> (56 - 8 * i));
    out[8 + i] = static_cast<std::uint8_t>(lo_ >> (56 - 8 * i));
  }
  return out;
}

void BlockKey::to_hex(char* out) const noexcept {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < 16; ++i) {
    out[i] = kDigits[(hi_ >> (60 - 4 * i)) & 0xF];
    out[16 + i] = kDigits[(lo_ >> (60 - 4 * i)) & 0xF];
  }
}

std::string BlockKey::to_hex() const {
  std::string s(kHexDigits, '0');
  to_hex(s.data());
  return s;
}

}  // namespace kvoffload
