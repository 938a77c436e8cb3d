#pragma once
// Note [Remote values]: the bytes a RemoteTier keeps for one slot of one chunk.
//
//   value = header (64 bytes, little-endian) | payload (the slot bytes)
//   header: magic "KVOR" | format version | header bytes | geometry fingerprint | chunk key (hi,
//   lo)
//           | copy index (or kReplicatedCopy) | reserved | payload length | xxh3-64(payload)
//           | xxh3-64(the 56 header bytes before it)
//
// A value from another engine with another geometry fails the fingerprint; a value written under
// another key (a bug, or a store that mixes keys up) fails the key echo; a torn, truncated or
// bit-flipped value fails the length or a checksum. Every failure is a counted miss.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <kvoffload/block_key.hpp>

namespace kvoffload::detail {

inline constexpr std::uint32_t kRemoteMagic = 0x524F564BU;  // "KVOR" in little-endian bytes
inline constexpr std::uint16_t kRemoteFormatVersion = 1;
inline constexpr std::uint32_t kReplicatedCopy = 0xFFFFFFFFU;
inline constexpr std::size_t kRemoteHeaderBytes = 64;

struct RemoteValueHeader {
  std::uint32_t magic = kRemoteMagic;
  std::uint16_t version = kRemoteFormatVersion;
  std::uint16_t header_bytes = kRemoteHeaderBytes;
  std::uint64_t fingerprint = 0;
  std::uint64_t key_hi = 0;
  std::uint64_t key_lo = 0;
  std::uint32_t copy = 0;
  std::uint32_t reserved = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t payload_xxh3 = 0;
  std::uint64_t header_xxh3 = 0;
};
static_assert(sizeof(RemoteValueHeader) == kRemoteHeaderBytes);

// Fills every field, hashing the payload.
RemoteValueHeader make_header(std::uint64_t fingerprint, const BlockKey& key, std::uint32_t copy,
                              std::span<const std::byte> payload) noexcept;

enum class ValueCheck : std::uint8_t {
  kOk = 0,
  kShort,  // fewer bytes than a header
  kMagic,
  kVersion,
  kHeaderChecksum,
  kFingerprint,
  kKey,
  kCopy,
  kLength,  // payload length differs from the header's or from the expected slot size
  kPayloadChecksum,
};
std::string_view to_string(ValueCheck check) noexcept;

// Verifies the header of a value of `value_bytes` (the header and its payload) read back for
// (fingerprint, key, copy) with `expected_payload` bytes: every check but the payload checksum.
// `header` holds at least the header's bytes (kShort otherwise); `out` receives the header.
ValueCheck verify_header(std::span<const std::byte> header, std::uint64_t value_bytes,
                         std::uint64_t fingerprint, const BlockKey& key, std::uint32_t copy,
                         std::uint64_t expected_payload, RemoteValueHeader& out) noexcept;

// True when `payload` is the payload `header` (verified) describes: its xxh3 matches.
bool payload_matches(const RemoteValueHeader& header, std::span<const std::byte> payload) noexcept;

// Verifies a value read back for (fingerprint, key, copy) with `expected_payload` bytes.
ValueCheck verify_value(std::span<const std::byte> value, std::uint64_t fingerprint,
                        const BlockKey& key, std::uint32_t copy,
                        std::uint64_t expected_payload) noexcept;

// The store key "kvo1:<fp>:<key>:<copy|r>" without allocation.
struct StoreKey {
  std::array<char, 64> text{};
  std::uint8_t size = 0;
  [[nodiscard]] std::string_view view() const noexcept { return {text.data(), size}; }
};
StoreKey make_store_key(std::uint64_t fingerprint, const BlockKey& key,
                        std::uint32_t copy) noexcept;

// Redis Cluster hash slot of a key: CRC16-XMODEM of the key (or of its {hash tag}) mod 16384.
std::uint16_t cluster_slot(std::string_view key) noexcept;
inline constexpr std::uint32_t kClusterSlots = 16384;

}  // namespace kvoffload::detail
