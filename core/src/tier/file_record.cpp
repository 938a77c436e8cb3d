// Note [File tier record]: the header carries the key and the payload length so that a file
// renamed by hand, or a truncated write that left a plausible size, is rejected; the header has
// its own CRC so a flipped length byte is caught before it is trusted for anything. The payload
// CRC covers exactly payload_bytes; the zero padding is not checked (it carries no data).
#include "tier/file_record.hpp"

#include "kvoffload/error.hpp"
#include "kvoffload/file_tier.hpp"
#include "tier/crc32c.hpp"

#include <array>
#include <bit>
#include <cstring>

namespace kvoffload {
namespace detail {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'O', 'T', 'I', 'E', 'R', '1'};
constexpr std::uint32_t kVersion = 1;

static_assert(std::endian::native == std::endian::little,
              "file-tier records are written in the host byte order, assumed little-endian");

struct RecordHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t reserved0;
  std::uint64_t payload_bytes;
  std::array<std::uint8_t, BlockKey::kBytes> key;
  std::array<std::uint8_t, 16> reserved1;
  std::uint32_t payload_crc;
  std::uint32_t header_crc;  // CRC32C of every byte before this field
};
static_assert(sizeof(RecordHeader) == 64);
constexpr std::size_t kHeaderCrcSpan = offsetof(RecordHeader, header_crc);

}  // namespace

std::string fan_dir_name(const BlockKey& key) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto b = static_cast<unsigned>(key.lo() & 0xFFu);
  return {kHex[b >> 4], kHex[b & 0xFu]};
}

std::string errno_text(std::string_view call, int err) {
  std::string s(call);
  s += ": ";
  s += strerrordesc_np(err) != nullptr ? strerrordesc_np(err) : "unknown error";
  s += " (" + errno_name(err) + ")";
  return s;
}

std::size_t record_payload_offset() noexcept {
  return sizeof(RecordHeader);
}

void encode_record(std::byte* buf, const BlockKey& key, std::span<const std::byte> payload) {
  const std::uint64_t rec = file_tier_record_bytes(payload.size());
  RecordHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.payload_bytes = payload.size();
  h.key = key.to_bytes();
  h.payload_crc = crc32c(payload);
  std::memcpy(buf, &h, sizeof h);
  h.header_crc = crc32c(std::span<const std::byte>(buf, kHeaderCrcSpan));
  std::memcpy(buf, &h, sizeof h);
  if (!payload.empty()) std::memcpy(buf + sizeof h, payload.data(), payload.size());
  std::memset(buf + sizeof h + payload.size(), 0, rec - sizeof h - payload.size());
}

std::optional<std::string> check_record(const std::byte* buf, const BlockKey& key,
                                        std::uint64_t payload_bytes) {
  RecordHeader h{};
  std::memcpy(&h, buf, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) {
    return "bad magic or version";
  }
  if (crc32c(std::span<const std::byte>(buf, kHeaderCrcSpan)) != h.header_crc) {
    return "header checksum mismatch";
  }
  if (h.key != key.to_bytes()) return "record holds another key";
  if (h.payload_bytes != payload_bytes) {
    return "record holds " + std::to_string(h.payload_bytes) + " bytes, expected " +
           std::to_string(payload_bytes);
  }
  if (crc32c(std::span<const std::byte>(buf + sizeof h, payload_bytes)) != h.payload_crc) {
    return "payload checksum mismatch";
  }
  return std::nullopt;
}

}  // namespace detail

std::uint64_t file_tier_record_bytes(std::uint64_t payload_bytes) noexcept {
  const std::uint64_t a = detail::kRecordAlign;
  return (sizeof(detail::RecordHeader) + payload_bytes + a - 1) / a * a;
}

}  // namespace kvoffload
