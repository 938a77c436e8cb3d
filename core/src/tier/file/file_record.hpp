#pragma once
// The file tier's on-disk record (Note [File tier record]) and the small pieces every part of the
// tier shares: names of files and directories, per-item outcomes, errno text.

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

// Writes the record of `key` holding `payload` into `buf` (file_tier_record_bytes(payload.size())
// bytes): payload, zero padding, header.
void encode_record(std::byte* buf, const BlockKey& key, std::span<const std::byte> payload);

// How a record of `payload_bytes` is moved without copying its payload: the first `prefix` bytes
// of the file are the payload's first `prefix` bytes (a whole number of 4 KiB blocks, possibly 0);
// the `tail` bytes after them (4 or 8 KiB) hold the payload's remainder, the padding and the
// header. prefix + tail == file_tier_record_bytes(payload_bytes).
struct RecordSplit {
  std::uint64_t prefix = 0;
  std::uint64_t tail = 0;
};
RecordSplit record_split(std::uint64_t payload_bytes) noexcept;

// Writes the tail of the record of `key` holding `payload` into `tail` (record_split().tail
// bytes); the payload's CRC covers all of it, read from `payload`.
void encode_record_tail(std::byte* tail, const BlockKey& key, std::span<const std::byte> payload);

// Checks a record read whole into `buf` for `key` and `payload_bytes`: nullopt when it verifies,
// else why it is a miss (bad magic, checksums, another key or length).
std::optional<std::string> check_record(const std::byte* buf, const BlockKey& key,
                                        std::uint64_t payload_bytes);

// The same for a record read in two pieces: its first prefix bytes in `prefix` (where the payload
// landed), the rest in `tail` (record_split(payload_bytes)).
std::optional<std::string> check_record_split(std::span<const std::byte> prefix,
                                              const std::byte* tail, const BlockKey& key,
                                              std::uint64_t payload_bytes);

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
