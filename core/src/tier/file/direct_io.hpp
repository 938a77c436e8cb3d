#pragma once
// The file tier's record I/O: O_DIRECT while the filesystem takes it, buffered for good after its
// first refusal (DirectIoMode::kAuto in file_tier.hpp), whole-record vectored reads and writes (one
// call per record) with EINTR retried and partial transfers continued.

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <kvoffload/file_tier.hpp>

#include "sys/syscalls.hpp"
#include "tier/file/file_record.hpp"

namespace kvoffload::detail {

class DirectIo {
 public:
  // `sys` must outlive this object; `enabled`: start with O_DIRECT (kAuto).
  DirectIo(const Syscalls& sys, std::string tier_name, bool enabled) noexcept
      : sys_(sys), name_(std::move(tier_name)), direct_(enabled) {}

  // O_DIRECT in use right now.
  [[nodiscard]] bool enabled() const noexcept { return direct_.load(); }

  // Opens a record file, with O_DIRECT while the tier uses it. On EINVAL the filesystem refused
  // O_DIRECT: buffered from now on. Returns fd or -1 with errno set.
  int open_record(const std::filesystem::path& path, int flags, bool& used_direct);

  // A record moves in at most this many pieces: its payload's whole blocks and its tail.
  static constexpr std::size_t kMaxPieces = 2;

  // Writes the pieces (at most kMaxPieces), one after another from file offset `at`, in one
  // pwritev: one request to the device per record (more calls only when the kernel transfers
  // less than asked). nullopt on success, else the failure.
  std::optional<ItemOutcome> write_all(int fd, std::span<const struct iovec> pieces,
                                       bool& used_direct, const std::filesystem::path& path,
                                       off_t at = 0);
  // Reads the pieces likewise, in one preadv; nullopt on success, a miss when the file ended
  // early, a failure otherwise.
  std::optional<ItemOutcome> read_all(int fd, std::span<const struct iovec> pieces,
                                      bool& used_direct, const std::filesystem::path& path,
                                      off_t at = 0);

 private:
  void disable(std::string_view where, const std::filesystem::path& path);
  // Clears O_DIRECT on an open descriptor after the filesystem refused a transfer with EINVAL.
  bool drop_direct(int fd, const std::filesystem::path& path, std::string_view where);
  // The loop both directions share: the call, EINTR, partial transfers, O_DIRECT refused.
  std::optional<ItemOutcome> transfer(int fd, std::span<const struct iovec> pieces,
                                      bool& used_direct, const std::filesystem::path& path,
                                      off_t at, bool write);

  const Syscalls& sys_;
  const std::string name_;
  std::atomic<bool> direct_;
  std::once_flag fallback_logged_;
};

}  // namespace kvoffload::detail
