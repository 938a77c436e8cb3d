// Note [File tier record]: the header carries the key and the payload length so that a file
// renamed by hand, or a truncated write that left a plausible size, is rejected; the header has
// its own CRC so a flipped length byte is caught before it is trusted for anything. The payload
// CRC covers exactly payload_bytes; the zero padding is not checked (it carries no data).
//
// Layout (format 2): the payload first, from offset 0, then zero padding, then the 64-byte header
// as the last bytes of the file; the file is a whole number of 4 KiB blocks (the same size as
// format 1, whose header came first). With the payload at offset 0, the payload's whole 4 KiB
// blocks move between the file and the caller's memory with O_DIRECT and no copy when that memory
// is 4 KiB-aligned (vLLM's primary rows and region slots are page-aligned): only the last block
// or two -- the payload's remainder, the padding and the header -- go through a small bounce
// buffer (record_split). Format 1 records (an earlier kvoffload) read as misses and are dropped.
#include "tier/file/file_record.hpp"

#include <array>
#include <bit>
#include <cstring>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "tier/file/crc32c.hpp"

namespace kvoffload {
namespace detail {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'O', 'T', 'I', 'E', 'R', '2'};
constexpr std::uint32_t kVersion = 2;

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

RecordSplit record_split(std::uint64_t payload_bytes) noexcept {
  const std::uint64_t rec = file_tier_record_bytes(payload_bytes);
  const std::uint64_t whole = payload_bytes / kRecordAlign * kRecordAlign;
  const std::uint64_t prefix = std::min(whole, rec - kRecordAlign);
  return {prefix, rec - prefix};
}

namespace {

// The header of a record whose payload CRC is `payload_crc`, into the last 64 bytes at `end`.
void put_header(std::byte* end, const BlockKey& key, std::uint64_t payload_bytes,
                std::uint32_t payload_crc) {
  RecordHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.payload_bytes = payload_bytes;
  h.key = key.to_bytes();
  h.payload_crc = payload_crc;
  std::byte* at = end - sizeof h;
  std::memcpy(at, &h, sizeof h);
  h.header_crc = crc32c(std::span<const std::byte>(at, kHeaderCrcSpan));
  std::memcpy(at, &h, sizeof h);
}

}  // namespace

void encode_record(std::byte* buf, const BlockKey& key, std::span<const std::byte> payload) {
  const std::uint64_t rec = file_tier_record_bytes(payload.size());
  if (!payload.empty()) std::memcpy(buf, payload.data(), payload.size());
  std::memset(buf + payload.size(), 0, rec - payload.size());
  put_header(buf + rec, key, payload.size(), crc32c(payload));
}

void encode_record_tail(std::byte* tail, const BlockKey& key, std::span<const std::byte> payload) {
  const RecordSplit split = record_split(payload.size());
  const std::size_t rest = payload.size() - split.prefix;
  if (rest != 0) std::memcpy(tail, payload.data() + split.prefix, rest);
  std::memset(tail + rest, 0, split.tail - rest);
  put_header(tail + split.tail, key, payload.size(), crc32c(payload));
}

std::optional<std::string> check_record_split(std::span<const std::byte> prefix,
                                              const std::byte* tail, const BlockKey& key,
                                              std::uint64_t payload_bytes) {
  const RecordSplit split = record_split(payload_bytes);
  RecordHeader h{};
  const std::byte* at = tail + split.tail - sizeof h;
  std::memcpy(&h, at, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) {
    return "bad magic or version (not a record, or one of an earlier format)";
  }
  if (crc32c(std::span<const std::byte>(at, kHeaderCrcSpan)) != h.header_crc) {
    return "header checksum mismatch";
  }
  if (h.key != key.to_bytes()) return "record holds another key";
  if (h.payload_bytes != payload_bytes) {
    return "record holds " + std::to_string(h.payload_bytes) + " bytes, expected " +
           std::to_string(payload_bytes);
  }
  const std::uint32_t crc =
      crc32c(std::span<const std::byte>(tail, payload_bytes - split.prefix), crc32c(prefix));
  if (crc != h.payload_crc) return "payload checksum mismatch";
  return std::nullopt;
}

std::optional<std::string> check_record(const std::byte* buf, const BlockKey& key,
                                        std::uint64_t payload_bytes) {
  const RecordSplit split = record_split(payload_bytes);
  return check_record_split(std::span<const std::byte>(buf, split.prefix), buf + split.prefix, key,
                            payload_bytes);
}

}  // namespace detail

std::uint64_t file_tier_record_bytes(std::uint64_t payload_bytes) noexcept {
  const std::uint64_t a = detail::kRecordAlign;
  return (sizeof(detail::RecordHeader) + payload_bytes + a - 1) / a * a;
}

}  // namespace kvoffload
