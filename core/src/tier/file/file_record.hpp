#pragma once
// The file tier's on-disk record (Note [File tier record]) and the small pieces every part of the
// tier shares: names of files and directories, per-item outcomes, errno text.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <kvoffload/block_key.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/tier.hpp>

namespace kvoffload::detail {

// O_DIRECT needs offsets, lengths and buffers aligned to the logical block size; 4 KiB covers
// every common device and keeps records page-sized for the page cache in buffered mode.
inline constexpr std::size_t kRecordAlign = 4096;
inline constexpr const char* kRecordSuffix = ".kvb";
inline constexpr const char* kTempSuffix = ".tmp";
inline constexpr const char* kTierLockName = ".kvoffload-tier.lock";

// The fan-out directory of a key: its last two hex digits (uniform for hashed keys and for small
// integer keys alike).
std::string fan_dir_name(const BlockKey& key);

// Where a record keeps its 32-byte header (Note [File tier record]):
//   kXattr    format 3: the file is the payload and zero padding to the next 4 KiB, nothing else;
//             the header is the extended attribute kHeaderXattr of the file (in the inode).
//   kTrailer  format 2: the header is the last 64 bytes of the file, after the payload and the
//             padding (one more 4 KiB block for a payload of 2^k bytes). Written only where the
//             filesystem keeps no user extended attributes; read wherever a file has no header
//             attribute (records of an earlier kvoffload, format 2).
enum class RecordFormat : std::uint8_t { kXattr, kTrailer };

inline constexpr const char* kHeaderXattr = "user.kvoffload.v3";
inline constexpr std::size_t kXattrHeaderBytes = 32;
using XattrHeader = std::array<std::byte, kXattrHeaderBytes>;

// Bytes the record of `payload_bytes` occupies in its file, in `format`: a whole number of 4 KiB
// blocks, at least one.
std::uint64_t record_bytes(RecordFormat format, std::uint64_t payload_bytes) noexcept;

// How a record of `payload_bytes` is moved without copying its payload: the first `prefix` bytes
// of the file are the payload's first `prefix` bytes (a whole number of 4 KiB blocks, possibly 0);
// the `tail` bytes after them hold the payload's remainder, the padding and (kTrailer) the header:
// 0 bytes for a kXattr record of whole blocks, else 4 KiB (kTrailer: 4 or 8 KiB).
// prefix + tail == record_bytes(format, payload_bytes).
struct RecordSplit {
  std::uint64_t prefix = 0;
  std::uint64_t tail = 0;
};
RecordSplit record_split(RecordFormat format, std::uint64_t payload_bytes) noexcept;

// Writes the record of `key` holding `payload` into `buf` (record_bytes() bytes): payload, zero
// padding and, kTrailer, the header. Returns the payload's CRC (what xattr_header() takes).
std::uint32_t encode_record(RecordFormat format, std::byte* buf, const BlockKey& key,
                            std::span<const std::byte> payload);

// Writes the tail of the record (record_split().tail bytes, none when 0) into `tail`; the
// payload's CRC covers all of it, read from `payload`, and is returned.
std::uint32_t encode_record_tail(RecordFormat format, std::byte* tail, const BlockKey& key,
                                 std::span<const std::byte> payload);

// The kXattr header of a record of `key` holding `payload_bytes` whose CRC is `payload_crc`.
XattrHeader xattr_header(const BlockKey& key, std::uint64_t payload_bytes,
                         std::uint32_t payload_crc) noexcept;

// Checks a record read in two pieces for `key` and `payload_bytes`: its first prefix bytes in
// `prefix` (where the payload landed), the rest in `tail` (record_split(format, payload_bytes));
// `xattr` is the header attribute's value (kXattr; ignored for kTrailer). nullopt when it
// verifies, else why it is a miss (bad magic or version, checksums, another key or length).
std::optional<std::string> check_record_split(RecordFormat format,
                                              std::span<const std::byte> prefix,
                                              const std::byte* tail, const BlockKey& key,
                                              std::uint64_t payload_bytes,
                                              std::span<const std::byte> xattr = {});

// The same for a record read whole into `buf`.
std::optional<std::string> check_record(RecordFormat format, const std::byte* buf,
                                        const BlockKey& key, std::uint64_t payload_bytes,
                                        std::span<const std::byte> xattr = {});

// Carries a per-item failure out of a worker task without an exception for expected outcomes.
struct ItemOutcome {
  TierItemStatus status = TierItemStatus::kOk;
  int err = 0;
  std::string detail;
  bool damaged = false;  // a miss caused by a bad record (drop it from the index and disk)

  static ItemOutcome failed(std::string_view call, int e) {
    return {TierItemStatus::kFailed, e, errno_text(call, e), false};
  }
  static ItemOutcome miss(std::string why, bool damaged_record) {
    return {TierItemStatus::kMiss, 0, std::move(why), damaged_record};
  }
};

}  // namespace kvoffload::detail
