#pragma once
// FileTier: a SecondaryTier keeping one file per chunk row under a root directory.
//
// Layout: <root>/<hh>/<key hex>.kvb, hh = the last key byte in hex (256 fan-out directories,
// created on first use), plus <root>/.kvoffload-tier.lock, flock'ed exclusively by the one
// FileTier that owns the root (a second opener gets kState), or shared by the tiers that share it
// (Note [Shared root]). A record (format 3) is the payload
// and zero padding to the next 4 KiB, so a row of 2^k bytes is a file of exactly its size, written
// with one O_DIRECT write and read with one O_DIRECT read straight from and into 4 KiB-aligned
// memory; its 32-byte header (key, payload length, CRC32C of the payload, CRC32C of the header)
// is the file's extended attribute user.kvoffload.v3, kept in the inode. Where the filesystem
// refuses user extended attributes, the header goes in the last 64 bytes of the file instead
// (format 2, one more block for a row of whole blocks); records without the attribute (an earlier
// kvoffload's, format 2) are read that way (Note [File tier record] in file_record.cpp).
//
// Writes go to <root>/<hh>/.<key hex>.<n>.tmp and are renamed into place, so a reader never sees a
// half-written record under the real name. Temporary files of a previous owner are deleted when
// the root is opened; existing records are indexed (by name and size, no reads), oldest first.
//
// Fsync policy (FileTierOptions::fsync): the tier is a cache and every record carries checksums,
// so after a crash or power loss a record is either intact or detected as damaged and read as a
// miss. The default (kNone) therefore does not fsync; kData fdatasyncs each record before the
// rename (durable contents), kFull also fsyncs the directory after it (durable name).
//
// Note [Full disk]: the capacity in use is never more than the filesystem can hold: the
// configured value, capped by (bytes of the records held + the free space of the root's
// filesystem), measured at open and again at every put batch (one fstatvfs per batch, not per
// record). A write that still fails with ENOSPC evicts the oldest records and retries, round after
// round, until the record fits or none is left to evict (the failure then says so). Failures are
// logged rate-limited (one line per cause per interval, with a count; util/rate_limited_log.hpp).
//
// Note [Shared root]: with FileTierOptions::shared, several FileTiers (in several processes: two
// engine instances on one directory) use one root. Each holds the lock file shared (LOCK_SH), so
// a tier that owns the root alone (shared false) and shared ones refuse each other (kState). What
// one of them stores the others read: a key a tier does not index is looked for on disk by
// contains() (one stat), by get() (read and verified; indexed when valid) and by put() (a record
// of the right size already there is taken as stored, not written again). Each tier's capacity
// counts the records it wrote or read (the filesystem bound holds for all, Note [Full disk]); a
// record another tier removed (evicted) is a miss, dropped from the index and not counted as
// corrupt. Each holds the lock shared for its lifetime (an exclusive opener is refused while one
// does); temporary names carry the writer's PID, and an opener removes only the temporary files
// of writers that are gone (a PID in another PID namespace looks gone: its write then fails, a
// miss later, never a wrong page).
//
// O_DIRECT (kAuto): records are written and read with O_DIRECT through aligned bounce buffers;
// when the filesystem refuses it (EINVAL at open, or at the first read/write), the tier logs once
// and continues buffered for good. kBuffered never tries.

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <kvoffload/export.h>
#include <kvoffload/tier.hpp>

namespace kvoffload {

struct Syscalls;  // core/src/sys/syscalls.hpp

enum class FsyncPolicy : std::uint8_t { kNone, kData, kFull };
enum class DirectIoMode : std::uint8_t { kAuto, kBuffered };

struct FileTierOptions {
  std::filesystem::path root;        // created (one level) when missing; parent must exist
  std::uint64_t capacity_bytes = 0;  // > 0: file bytes kept; the oldest records go beyond it.
                                     // Capped by the filesystem: see Note [Full disk]
  unsigned io_threads = 4;           // 1..256
  // Of io_threads, how many serve reads (gets: promotions a request waits for) first; the others
  // serve writes first, and each takes the other kind when its own queue is empty (vLLM's fs
  // tier's n_read_threads / n_write_threads). 0: one queue for both, in submission order.
  unsigned read_threads = 0;
  DirectIoMode direct_io = DirectIoMode::kAuto;
  FsyncPolicy fsync = FsyncPolicy::kNone;
  // Gets read a record's payload straight into TierGet::into (with O_DIRECT when `into` is 4 KiB
  // aligned: no copy) and verify it there, so a miss may leave torn bytes in `into` (the TierGet
  // contract otherwise says it is untouched). For callers that discard the destination of an item
  // that did not succeed, as vLLM's tiering does with a failed promotion's primary slots.
  bool verify_in_destination = false;
  // Several tiers (processes) share the root: Note [Shared root].
  bool shared = false;
  std::string name = "file";  // for logs and stats
  // The system calls the tier makes (core/src/sys/syscalls.hpp, the seam the region uses too):
  // tests pass a table that fails chosen calls. nullptr: the real calls. A table given here must
  // outlive the tier and be safe to call from its I/O threads.
  const Syscalls* syscalls = nullptr;
};

// Bytes a record of `payload_bytes` occupies on disk: the payload rounded up to 4 KiB (at least
// one block). Where the filesystem keeps no user extended attributes (format 2): the payload and a
// 64-byte header, rounded up to 4 KiB.
KVOFFLOAD_API std::uint64_t file_tier_record_bytes(std::uint64_t payload_bytes) noexcept;

class KVOFFLOAD_API FileTier final : public SecondaryTier {
 public:
  // Checks the options without touching anything but stat/access on the root and its parent:
  // empty or relative root, a root that is not a directory or not writable, a missing parent,
  // zero capacity, thread count out of range. Throws kInvalidArgument naming the value.
  static void validate(const FileTierOptions& options);

  // Validates, creates the root if needed, locks it, deletes stale temporary files, indexes the
  // records present and starts the I/O threads. Throws kvoffload::Error; leaves nothing open.
  static std::unique_ptr<FileTier> open(const FileTierOptions& options);

  ~FileTier() override;

  [[nodiscard]] const std::string& name() const noexcept override;
  TierBatch put(std::span<const TierPut> items) override;
  TierBatch get(std::span<const TierGet> items) override;
  [[nodiscard]] bool contains(const BlockKey& key) const override;
  TierBatch remove(std::span<const BlockKey> keys) override;
  void drain() override;
  [[nodiscard]] TierStats stats() const override;
  bool close() noexcept override;

  [[nodiscard]] const std::filesystem::path& root() const noexcept;
  // Where the record of `key` lives (whether or not it exists).
  [[nodiscard]] std::filesystem::path record_path(const BlockKey& key) const;

  struct Impl;

 private:
  explicit FileTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvoffload
