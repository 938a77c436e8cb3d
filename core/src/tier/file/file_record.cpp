// Note [File tier record]: the header carries the key and the payload length so that a file
// renamed by hand, or a truncated write that left a plausible size, is rejected; the header has
// its own CRC so a flipped length byte is caught before it is trusted for anything. The payload
// CRC covers exactly payload_bytes; the zero padding is not checked (it carries no data).
//
// Layout, format 3 (RecordFormat::kXattr): the file is the payload from offset 0 and zero padding
// to the next 4 KiB, nothing else; the 32-byte header (payload length, key, payload CRC, header
// CRC; the format is the attribute's name) is the extended attribute user.kvoffload.v3 of the
// file. A row of 2^k bytes (k >= 12) is therefore one aligned write and one aligned read of its
// own size, straight between the caller's page-aligned memory and the file with O_DIRECT, no
// bounce buffer, no copy; ext4 keeps a value this small inside the inode (a 256-byte inode has
// ~92 bytes for in-inode attributes: 32 bytes of value fit, 64 would spill into a 4 KiB block of
// its own), so the record occupies its payload's blocks and no more, and reading the header costs
// no I/O (the inode is read by the open). Setting it is one fsetxattr before the rename, in the
// same metadata transaction as the file's allocation; ENOSPC from it is a full disk like a
// write's (Note [Full disk]).
//
// Format 2 (RecordFormat::kTrailer, the previous format): the payload, zero padding, then a
// 64-byte header as the last bytes of the file, a whole number of 4 KiB blocks (so 68 KiB for a
// 64 KiB row, in one pwritev of the row's blocks plus a bounce block). A tier writes it only where
// the filesystem refuses user extended attributes (probed at open on the lock file); every tier
// reads it for a file without the attribute, so records of an earlier kvoffload stay readable
// after an upgrade. Format 1 records (header first) read as misses and are dropped.
#include "tier/file/file_record.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
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

// Format 3's header, the value of the attribute kHeaderXattr (its name says the format).
struct XattrRecordHeader {
  std::uint64_t payload_bytes;
  std::array<std::uint8_t, BlockKey::kBytes> key;
  std::uint32_t payload_crc;
  std::uint32_t header_crc;  // CRC32C of every byte before this field
};
static_assert(sizeof(XattrRecordHeader) == kXattrHeaderBytes);
constexpr std::size_t kXattrCrcSpan = offsetof(XattrRecordHeader, header_crc);

}  // namespace

std::string fan_dir_name(const BlockKey& key) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto b = static_cast<unsigned>(key.lo() & 0xFFu);
  return {kHex[b >> 4], kHex[b & 0xFu]};
}

std::uint64_t record_bytes(RecordFormat format, std::uint64_t payload_bytes) noexcept {
  const std::uint64_t a = kRecordAlign;
  const std::uint64_t stored =
      format == RecordFormat::kTrailer ? payload_bytes + sizeof(RecordHeader) : payload_bytes;
  return std::max<std::uint64_t>(a, (stored + a - 1) / a * a);
}

RecordSplit record_split(RecordFormat format, std::uint64_t payload_bytes) noexcept {
  const std::uint64_t rec = record_bytes(format, payload_bytes);
  const std::uint64_t whole = payload_bytes / kRecordAlign * kRecordAlign;
  const std::uint64_t prefix =
      format == RecordFormat::kTrailer ? std::min(whole, rec - kRecordAlign) : whole;
  return {prefix, rec - prefix};
}

namespace {

// The trailer header of a record whose payload CRC is `payload_crc`, into the last 64 bytes at
// `end`.
void put_trailer(std::byte* end, const BlockKey& key, std::uint64_t payload_bytes,
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

// What either header says, once its own checks passed.
struct HeaderFields {
  std::uint64_t payload_bytes = 0;
  std::array<std::uint8_t, BlockKey::kBytes> key{};
  std::uint32_t payload_crc = 0;
};

std::optional<std::string> read_trailer(const std::byte* end, HeaderFields& out) {
  RecordHeader h{};
  const std::byte* at = end - sizeof h;
  std::memcpy(&h, at, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) {
    return "bad magic or version (not a record, or one of an earlier format)";
  }
  if (crc32c(std::span<const std::byte>(at, kHeaderCrcSpan)) != h.header_crc) {
    return "header checksum mismatch";
  }
  out = {h.payload_bytes, h.key, h.payload_crc};
  return std::nullopt;
}

std::optional<std::string> read_xattr(std::span<const std::byte> value, HeaderFields& out) {
  if (value.size() != sizeof(XattrRecordHeader)) {
    return "header attribute of " + std::to_string(value.size()) + " bytes, expected " +
           std::to_string(sizeof(XattrRecordHeader));
  }
  XattrRecordHeader h{};
  std::memcpy(&h, value.data(), sizeof h);
  if (crc32c(value.first(kXattrCrcSpan)) != h.header_crc) return "header checksum mismatch";
  out = {h.payload_bytes, h.key, h.payload_crc};
  return std::nullopt;
}

}  // namespace

std::uint32_t encode_record(RecordFormat format, std::byte* buf, const BlockKey& key,
                            std::span<const std::byte> payload) {
  const std::uint64_t rec = record_bytes(format, payload.size());
  if (!payload.empty()) std::memcpy(buf, payload.data(), payload.size());
  std::memset(buf + payload.size(), 0, rec - payload.size());
  const std::uint32_t crc = crc32c(payload);
  if (format == RecordFormat::kTrailer) put_trailer(buf + rec, key, payload.size(), crc);
  return crc;
}

std::uint32_t encode_record_tail(RecordFormat format, std::byte* tail, const BlockKey& key,
                                 std::span<const std::byte> payload) {
  const RecordSplit split = record_split(format, payload.size());
  const std::size_t rest = payload.size() - split.prefix;
  if (rest != 0) std::memcpy(tail, payload.data() + split.prefix, rest);
  if (split.tail != 0) std::memset(tail + rest, 0, split.tail - rest);
  const std::uint32_t crc = crc32c(payload);
  if (format == RecordFormat::kTrailer) put_trailer(tail + split.tail, key, payload.size(), crc);
  return crc;
}

XattrHeader xattr_header(const BlockKey& key, std::uint64_t payload_bytes,
                         std::uint32_t payload_crc) noexcept {
  XattrRecordHeader h{};
  h.payload_bytes = payload_bytes;
  h.key = key.to_bytes();
  h.payload_crc = payload_crc;
  XattrHeader out{};
  std::memcpy(out.data(), &h, sizeof h);
  h.header_crc = crc32c(std::span<const std::byte>(out.data(), kXattrCrcSpan));
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

std::optional<std::string> check_record_split(RecordFormat format,
                                              std::span<const std::byte> prefix,
                                              const std::byte* tail, const BlockKey& key,
                                              std::uint64_t payload_bytes,
                                              std::span<const std::byte> xattr) {
  const RecordSplit split = record_split(format, payload_bytes);
  HeaderFields h;
  if (auto why = format == RecordFormat::kTrailer ? read_trailer(tail + split.tail, h)
                                                  : read_xattr(xattr, h)) {
    return why;
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

std::optional<std::string> check_record(RecordFormat format, const std::byte* buf,
                                        const BlockKey& key, std::uint64_t payload_bytes,
                                        std::span<const std::byte> xattr) {
  const RecordSplit split = record_split(format, payload_bytes);
  return check_record_split(format, std::span<const std::byte>(buf, split.prefix),
                            buf + split.prefix, key, payload_bytes, xattr);
}

}  // namespace detail

std::uint64_t file_tier_record_bytes(std::uint64_t payload_bytes) noexcept {
  return detail::record_bytes(detail::RecordFormat::kXattr, payload_bytes);
}

}  // namespace kvoffload
