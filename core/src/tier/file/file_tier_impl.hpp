#pragma once
// The state of one FileTier (FileTier::Impl) and the list of its parts; each part's code lives in
// its own file:
//   file_tier.cpp         validation, open (lock, recovery, first capacity), remove, stats, close
//   file_tier_space.cpp   capacity and eviction (Note [Full disk]), unlinking records
//   file_tier_write.cpp   the write path: admission and eviction of a put batch, temp + rename
//   file_tier_read.cpp    the read path: a get batch, reading and verifying a record
// and beside them:
//   file_record.{hpp,cpp}       the record format (Note [File tier record]) and shared names
//   direct_io.{hpp,cpp}         O_DIRECT with buffered fallback, whole-buffer reads and writes
//   tier_index.hpp              keys held, LRU order, bytes used, capacity (Note [Full disk])
//   file_tier_recovery.{hpp,cpp} indexing what a previous owner left at open

#include <fcntl.h>
#include <sys/stat.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "sys/sys.hpp"
#include "sys/syscalls.hpp"
#include "tier/file/direct_io.hpp"
#include "tier/file/file_record.hpp"
#include "tier/file/io_pool.hpp"
#include "tier/tier_index.hpp"
#include "util/rate_limited_log.hpp"

namespace kvoffload {

// Hidden explicitly: a class nested in an exported one (FileTier is KVOFFLOAD_API) takes its
// visibility, and with its members defined in several files they would be exported.
struct __attribute__((visibility("hidden"))) FileTier::Impl {
  Impl(const FileTierOptions& o, const Syscalls& sys_in)
      : options(o),
        sys(sys_in),
        root(o.root),
        dio(sys, o.name, o.direct_io == DirectIoMode::kAuto),
        index(o.capacity_bytes) {}

  FileTierOptions options;
  const Syscalls& sys;  // the platform seam, shared with the region (core/src/sys/syscalls.hpp)
  std::filesystem::path root;
  detail::UniqueFd lock_fd;  // the root's lock file, flock'ed while the tier is open
  detail::DirectIo dio;

  mutable std::mutex mutex;  // index, next_temp, counters, closed
  detail::TierIndex index;
  std::uint64_t next_temp = 1;
  TierStats counters;
  bool closed = false;
  detail::RateLimitedLog warnings;  // Note [Rate-limited warnings]

  // Note [File tier name locks]: rename (put) and unlink (remove/evict) of the same record name
  // are serialised by a striped lock, so an unlink queued for an old record can never delete a
  // newer record of the same key; the index mutex is never held across a system call, so
  // contains() never waits for the disk.
  std::array<std::mutex, 64> name_locks;

  std::mutex flight_mutex;
  std::condition_variable flight_cv;
  std::uint64_t in_flight = 0;

  std::unique_ptr<detail::IoPool> pool;

  // Where this tier writes its records' headers (Note [File tier record]): in the header
  // attribute, unless the filesystem refused user extended attributes at open (then the trailer).
  // Set at open, before any put; read only after.
  detail::RecordFormat format = detail::RecordFormat::kXattr;

  // Bytes the record of a payload takes in the format this tier writes.
  [[nodiscard]] std::uint64_t record_bytes(std::uint64_t payload_bytes) const noexcept {
    return detail::record_bytes(format, payload_bytes);
  }
  // Probes the filesystem of the root at open: sets the header attribute on the lock file (its
  // value says the format); EOPNOTSUPP selects the trailer format for the tier's life.
  void choose_format();

  std::mutex& name_lock(const BlockKey& key) { return name_locks[key.hash() % name_locks.size()]; }

  std::filesystem::path record_path(const BlockKey& key) const {
    return root / detail::fan_dir_name(key) / (key.to_hex() + detail::kRecordSuffix);
  }

  // Whether the whole 4 KiB blocks of a payload at `data` can move between the file and the
  // caller's memory without a copy: O_DIRECT needs 4 KiB-aligned memory (buffered I/O does not).
  [[nodiscard]] bool in_place(const void* data, std::uint64_t prefix) const noexcept {
    return prefix != 0 &&
           (!dio.enabled() || reinterpret_cast<std::uintptr_t>(data) % detail::kRecordAlign == 0);
  }

  void begin_flight(std::size_t n) {
    std::lock_guard lock(flight_mutex);
    in_flight += n;
  }
  void end_flight() {
    std::lock_guard lock(flight_mutex);
    if (--in_flight == 0) flight_cv.notify_all();
  }

  // The size of the record file of `key` when there is one (Note [Shared root]: another
  // opener's), without the index mutex.
  [[nodiscard]] std::optional<std::uint64_t> on_disk(const BlockKey& key) const {
    struct stat st {};
    if (sys.fstatat(sys.context, AT_FDCWD, record_path(key).c_str(), &st, AT_SYMLINK_NOFOLLOW) !=
            0 ||
        !S_ISREG(st.st_mode)) {
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(st.st_size);
  }

  void check_open_locked() const {
    if (closed) throw Error(ErrorCode::kState, "file tier '" + options.name + "' is closed");
  }

  // ---- space: capacity, eviction, unlinking records (file_tier_space.cpp) ----
  void close_fd(int fd, const std::filesystem::path& path);
  int unlink_path(const std::filesystem::path& path);
  void unlink_quietly(const std::filesystem::path& path);
  // Unlinks the record of `key` unless the index holds the key again (a newer put owns the name).
  // Returns 0 or the errno of a failed unlink (ENOENT counts as success).
  int reclaim(const BlockKey& key);
  // Free bytes of the root's filesystem for an unprivileged writer (f_bavail), or nullopt when
  // fstatvfs fails (logged; the capacity in force stays).
  std::optional<std::uint64_t> free_bytes();

  // What a capacity change below the configured value is logged with (after the index mutex is
  // released: the log writes to stderr, and contains() must never wait for a system call).
  struct CapacityChange {
    std::uint64_t capacity = 0;
    std::uint64_t free = 0;
    std::uint64_t held = 0;
  };
  std::optional<CapacityChange> set_capacity_locked(std::uint64_t free);
  void log_capacity(const std::optional<CapacityChange>& c);
  // After ENOSPC: evicts the oldest ready records (never `keep`) until `need` bytes are freed or
  // none is left, removes their files, and re-measures the capacity. Returns how many it evicted.
  std::size_t make_room(const BlockKey& keep, std::uint64_t need);
  // Why a write that met ENOSPC cannot be given room: `evicted` records in `rounds` rounds made
  // none, and no ready record is left; names what holds the filesystem (a failure's detail).
  std::string no_room_left(std::size_t evicted, std::size_t rounds);

  // ---- the write path (file_tier_write.cpp) ----
  // A piece of a record, written at the file offset where the previous one ended.
  struct Piece {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
  };
  // Writes the pieces to the new file `temp` (creating the fan-out directory when missing), sets
  // the header attribute when `header` is given (format 3), syncs it as the policy says and
  // closes it. On failure nothing is left: the temp file is removed.
  detail::ItemOutcome write_temp(std::span<const Piece> pieces, const detail::XattrHeader* header,
                                 const std::filesystem::path& temp,
                                 const std::filesystem::path& dir);
  // A put's record as it goes to disk: its pieces (the row's whole blocks in place, the rest in
  // the worker's bounce buffer) and, format 3, its header attribute.
  struct EncodedPut {
    std::array<Piece, 2> pieces{};
    detail::XattrHeader header{};
    bool has_header = false;
  };
  EncodedPut encode_put(detail::IoWorker& worker, const TierPut& item);
  // write_temp, and after ENOSPC evicting the oldest records and retrying until the record fits
  // or none is left (Note [Full disk]); `rec`: the record's bytes, what the eviction must free.
  detail::ItemOutcome write_making_room(const EncodedPut& record, const BlockKey& key,
                                        std::uint64_t rec, const std::filesystem::path& temp,
                                        const std::filesystem::path& dir);
  // Renames the written temp file into place unless the key was removed meanwhile (under the
  // name lock), marks it ready, and fsyncs the directory under FsyncPolicy::kFull.
  detail::ItemOutcome publish(const BlockKey& key, std::uint64_t epoch,
                              const std::filesystem::path& temp,
                              const std::filesystem::path& final_path);
  // One record's write on an I/O thread: encode_put, write_making_room, publish.
  detail::ItemOutcome do_put(detail::IoWorker& worker, const TierPut& item, std::uint64_t epoch,
                             std::uint64_t temp_id);

  // ---- a put batch (FileTier::put): admission under the index lock, then the I/O ----
  // The answer of an item that needs no write (already held, or refused at admission).
  struct PutAnswer {
    std::size_t index = 0;
    TierItemStatus status = TierItemStatus::kOk;
    int err = 0;
    std::string detail;
  };
  [[nodiscard]] std::string exceeds_capacity(std::uint64_t rec) const;
  // Admits item `i` (caller holds mutex): evicts the oldest ready records to fit it (their keys
  // appended to `evicted`) and reserves it (`epoch`), or returns its answer.
  std::optional<PutAnswer> admit_locked(const TierPut& item, std::size_t i,
                                        std::vector<BlockKey>& evicted, std::uint64_t& epoch);
  // The I/O task of an admitted item: do_put, finish_put, the item's result.
  detail::IoPool::Task put_task(TierBatchPromise promise, const TierPut& item, std::size_t i,
                                std::uint64_t epoch, std::uint64_t temp_id);
  // Counts a finished write; a failed one loses its reservation and its file, and is logged.
  void finish_put(const TierPut& item, std::uint64_t epoch, const detail::ItemOutcome& o);
  // Queues the victims' unlinks, then the writes (which need the space they free).
  void submit_puts(const std::vector<BlockKey>& evicted, std::vector<detail::IoPool::Task> writes);

  // ---- the read path (file_tier_read.cpp) ----
  detail::ItemOutcome do_get(detail::IoWorker& worker, const TierGet& item);
  // Note [Shared root]: indexes another opener's record a get read back valid, evicting this
  // tier's oldest records (into `evicted`, their files for the caller to reclaim) to fit it.
  void adopt_locked(const BlockKey& key, std::uint64_t file_bytes, std::vector<BlockKey>& evicted);
  // The format of the open record `fd` and, format 3, its header attribute into `xattr` (its
  // length in `xattr_bytes`): from whether the file has the attribute. A failure, or nullopt.
  std::optional<detail::ItemOutcome> record_format_of(int fd, const std::filesystem::path& path,
                                                      detail::RecordFormat& format,
                                                      detail::XattrHeader& xattr,
                                                      std::size_t& xattr_bytes);
};

}  // namespace kvoffload
