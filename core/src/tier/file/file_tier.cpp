// FileTier: the tier's batching, locking and lifecycle. Its parts live beside it:
//   file_record.{hpp,cpp}       the record format (Note [File tier record]) and shared names
//   direct_io.{hpp,cpp}         O_DIRECT with buffered fallback, whole-buffer reads and writes
//   tier_index.hpp              keys held, LRU order, bytes used, capacity (Note [Full disk])
//   file_tier_recovery.{hpp,cpp} indexing what a previous owner left at open
#include "kvoffload/file_tier.hpp"

#include "kvoffload/error.hpp"
#include "kvoffload/log.hpp"
#include "region/sys.hpp"
#include "tier/file/direct_io.hpp"
#include "tier/file/file_record.hpp"
#include "tier/file/file_tier_recovery.hpp"
#include "tier/file/io_pool.hpp"
#include "tier/tier_index.hpp"
#include "util/rate_limited_log.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>
#include <utility>

namespace kvoffload {

using detail::ItemOutcome;

struct FileTier::Impl {
  Impl(const FileTierOptions& o, const Syscalls& sys_in)
      : options(o),
        sys(sys_in),
        root(o.root),
        dio(sys, o.name, o.direct_io == DirectIoMode::kAuto),
        index(o.capacity_bytes) {}

  FileTierOptions options;
  const Syscalls& sys;  // the platform seam, shared with the region (kvoffload/syscalls.hpp)
  std::filesystem::path root;
  detail::UniqueFd lock_fd;  // the root's lock file, flock'ed exclusively while the tier is open
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

  std::mutex& name_lock(const BlockKey& key) { return name_locks[key.hash() % name_locks.size()]; }

  std::filesystem::path record_path(const BlockKey& key) const {
    return root / detail::fan_dir_name(key) / (key.to_hex() + detail::kRecordSuffix);
  }

  void close_fd(int fd, const std::filesystem::path& path) {
    if (sys.close(sys.context, fd) != 0) {
      const int e = errno;
      warnings.warn("close " + errno_name(e), "file tier '{}': {}", options.name,
                    errno_text("close " + path.string(), e));
    }
  }

  int unlink_path(const std::filesystem::path& path) {
    return sys.unlinkat(sys.context, AT_FDCWD, path.c_str(), 0);
  }

  void unlink_quietly(const std::filesystem::path& path) {
    if (unlink_path(path) != 0 && errno != ENOENT) {
      const int e = errno;
      warnings.warn("unlink " + errno_name(e), "file tier '{}': {}", options.name,
                    errno_text("unlink " + path.string(), e));
    }
  }

  // Unlinks the record of `key` unless the index holds the key again (a newer put owns the name).
  // Returns 0 or the errno of a failed unlink (ENOENT counts as success).
  int reclaim(const BlockKey& key) {
    std::lock_guard name(name_lock(key));
    {
      std::lock_guard lock(mutex);
      if (index.holds(key)) return 0;
    }
    const auto path = record_path(key);
    if (unlink_path(path) != 0 && errno != ENOENT) {
      const int e = errno;
      warnings.warn("unlink " + errno_name(e), "file tier '{}': {}", options.name,
                    errno_text("unlink " + path.string(), e));
      return e;
    }
    return 0;
  }

  // A piece of a record, written at the file offset where the previous one ended.
  struct Piece {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
  };

  // Writes the pieces to the new file `temp` (creating the fan-out directory when missing), syncs
  // it as the policy says and closes it. On failure nothing is left: the temp file is removed.
  ItemOutcome write_temp(std::span<const Piece> pieces, const std::filesystem::path& temp,
                         const std::filesystem::path& dir) {
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
    bool used_direct = false;
    int fd = dio.open_record(temp, flags, used_direct);
    if (fd < 0 && errno == ENOENT) {  // fan-out directory not made yet
      if (sys.mkdirat(sys.context, AT_FDCWD, dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return ItemOutcome::failed("mkdir " + dir.string(), errno);
      }
      fd = dio.open_record(temp, flags, used_direct);
    }
    if (fd < 0) return ItemOutcome::failed("open " + temp.string(), errno);

    auto fail_with_temp = [&](ItemOutcome o) {
      if (fd >= 0) close_fd(fd, temp);
      unlink_quietly(temp);
      return o;
    };
    off_t at = 0;
    for (const Piece& piece : pieces) {
      if (piece.bytes == 0) continue;
      if (auto o = dio.write_all(fd, piece.data, piece.bytes, used_direct, temp, at))
        return fail_with_temp(std::move(*o));
      at += static_cast<off_t>(piece.bytes);
    }
    if (options.fsync != FsyncPolicy::kNone && sys.fdatasync(sys.context, fd) != 0) {
      return fail_with_temp(ItemOutcome::failed("fdatasync " + temp.string(), errno));
    }
    const int closed_fd = std::exchange(fd, -1);
    if (sys.close(sys.context, closed_fd) != 0) {
      return fail_with_temp(ItemOutcome::failed("close " + temp.string(), errno));
    }
    return {};
  }

  // Whether the whole 4 KiB blocks of a payload at `data` can move between the file and the
  // caller's memory without a copy: O_DIRECT needs 4 KiB-aligned memory (buffered I/O does not).
  [[nodiscard]] bool in_place(const void* data, std::uint64_t prefix) const noexcept {
    return prefix != 0 &&
           (!dio.enabled() || reinterpret_cast<std::uintptr_t>(data) % detail::kRecordAlign == 0);
  }

  // Free bytes of the root's filesystem for an unprivileged writer (f_bavail), or nullopt when
  // fstatvfs fails (logged; the capacity in force stays).
  std::optional<std::uint64_t> free_bytes() {
    struct statvfs vfs {};
    if (sys.fstatvfs(sys.context, lock_fd.get(), &vfs) != 0) {
      const int e = errno;
      warnings.warn("fstatvfs " + errno_name(e),
                    "file tier '{}': {}; keeping the capacity in force", options.name,
                    errno_text("fstatvfs " + root.string(), e));
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(vfs.f_bavail) * static_cast<std::uint64_t>(vfs.f_frsize);
  }

  // What a capacity change below the configured value is logged with (after the index mutex is
  // released: the log writes to stderr, and contains() must never wait for a system call).
  struct CapacityChange {
    std::uint64_t capacity = 0;
    std::uint64_t free = 0;
    std::uint64_t held = 0;
  };

  // Note [Full disk]: capacity = min(configured, held + free). Caller holds mutex.
  std::optional<CapacityChange> set_capacity_locked(std::uint64_t free) {
    const std::uint64_t before = index.capacity();
    const std::uint64_t cap = index.set_free_bytes(free);
    counters.capacity_bytes = cap;
    if (cap == before || cap >= index.configured()) return std::nullopt;
    return CapacityChange{cap, free, index.ready_bytes()};
  }
  void log_capacity(const std::optional<CapacityChange>& c) {
    if (!c) return;
    warnings.warn("capacity",
                  "file tier '{}': capacity {} bytes, below the configured {}: the "
                  "filesystem of {} has {} bytes free besides the {} bytes of records held",
                  options.name, c->capacity, index.configured(), root.string(), c->free, c->held);
  }

  // After ENOSPC: evicts the oldest ready records (never `keep`) until `need` bytes are freed or
  // none is left, removes their files, and re-measures the capacity. Returns how many it evicted.
  std::size_t make_room(const BlockKey& keep, std::uint64_t need) {
    std::vector<BlockKey> victims;
    {
      std::lock_guard lock(mutex);
      std::uint64_t freed = 0;
      for (auto it = index.lru().begin(); it != index.lru().end() && freed < need;) {
        const BlockKey victim = *it++;
        if (victim == keep) continue;
        freed += index.find(victim)->file_bytes;
        index.erase(victim);
        ++counters.evictions;
        victims.push_back(victim);
      }
    }
    for (const auto& v : victims) reclaim(v);
    if (const auto free = free_bytes()) {
      std::optional<CapacityChange> change;
      {
        std::lock_guard lock(mutex);
        change = set_capacity_locked(*free);
      }
      log_capacity(change);
    }
    return victims.size();
  }

  ItemOutcome do_put(detail::IoWorker& worker, const TierPut& item, std::uint64_t epoch,
                     std::uint64_t temp_id) {
    const std::uint64_t rec = file_tier_record_bytes(item.bytes.size());
    // The payload's whole blocks go from the caller's memory (no copy); the rest through a small
    // bounce buffer. Unaligned memory under O_DIRECT: the whole record through the bounce buffer.
    const detail::RecordSplit split = detail::record_split(item.bytes.size());
    std::array<Piece, 2> pieces{};
    if (in_place(item.bytes.data(), split.prefix)) {
      std::byte* tail = worker.bounce.reserve(split.tail);
      detail::encode_record_tail(tail, item.key, item.bytes);
      pieces = {Piece{item.bytes.data(), split.prefix}, Piece{tail, split.tail}};
    } else {
      std::byte* buf = worker.bounce.reserve(rec);
      detail::encode_record(buf, item.key, item.bytes);
      pieces = {Piece{buf, rec}, Piece{}};
    }

    const auto final_path = record_path(item.key);
    const auto dir = final_path.parent_path();
    const auto temp =
        dir / ("." + item.key.to_hex() + "." + std::to_string(temp_id) + detail::kTempSuffix);
    ItemOutcome written = write_temp(pieces, temp, dir);
    if (written.status == TierItemStatus::kFailed && written.err == ENOSPC) {
      // Note [Full disk]: the disk filled behind our capacity (another writer, or a capacity
      // measured before the last put): make room from the oldest records and retry once.
      const std::size_t evicted = make_room(item.key, rec);
      warnings.log(spdlog::level::info, "enospc retry",
                   "file tier '{}': {}; evicted the {} oldest records, retrying once", options.name,
                   written.detail, evicted);
      if (evicted > 0) written = write_temp(pieces, temp, dir);
      if (written.status == TierItemStatus::kFailed && written.err == ENOSPC) {
        written.detail += evicted > 0
                              ? " (again after evicting " + std::to_string(evicted) + " records)"
                              : " (no record left to evict)";
      }
    }
    if (written.status != TierItemStatus::kOk) return written;

    {
      std::lock_guard name(name_lock(item.key));
      bool still_wanted = false;
      {
        std::lock_guard lock(mutex);
        still_wanted = index.owned_by(item.key, epoch);
      }
      if (!still_wanted) {
        unlink_quietly(temp);
        return ItemOutcome{TierItemStatus::kFailed, ECANCELED, "removed while being stored", false};
      }
      if (sys.renameat(sys.context, AT_FDCWD, temp.c_str(), AT_FDCWD, final_path.c_str()) != 0) {
        const int e = errno;
        unlink_quietly(temp);
        return ItemOutcome::failed("rename " + temp.string() + " -> " + final_path.string(), e);
      }
      std::lock_guard lock(mutex);
      index.mark_ready(item.key, epoch);
    }
    if (options.fsync == FsyncPolicy::kFull) {
      const int raw = detail::retry_eintr([&] {
        return sys.openat(sys.context, AT_FDCWD, dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                          0);
      });
      if (raw < 0) return ItemOutcome::failed("open " + dir.string(), errno);
      detail::UniqueFd dfd(sys, raw);
      if (sys.fsync(sys.context, dfd.get()) != 0)
        return ItemOutcome::failed("fsync " + dir.string(), errno);
    }
    return {};
  }

  ItemOutcome do_get(detail::IoWorker& worker, const TierGet& item) {
    const auto path = record_path(item.key);
    bool used_direct = false;
    const int raw = dio.open_record(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, used_direct);
    if (raw < 0) {
      if (errno == ENOENT) return ItemOutcome::miss("record file missing", true);
      return ItemOutcome::failed("open " + path.string(), errno);
    }
    const detail::UniqueFd owned(sys, raw);  // closed on every way out (a read-only descriptor)
    const int fd = owned.get();

    struct stat st {};
    if (sys.fstat(sys.context, fd, &st) != 0)
      return ItemOutcome::failed("fstat " + path.string(), errno);
    const std::uint64_t rec = file_tier_record_bytes(item.into.size());
    if (static_cast<std::uint64_t>(st.st_size) != rec) {
      return ItemOutcome::miss("record is " + std::to_string(st.st_size) + " bytes, expected " +
                                   std::to_string(rec) + " (short or another length)",
                               true);
    }
    const detail::RecordSplit split = detail::record_split(item.into.size());
    if (options.verify_in_destination && in_place(item.into.data(), split.prefix)) {
      // The payload's whole blocks straight into the destination, verified there.
      std::byte* tail = worker.bounce.reserve(split.tail);
      if (auto o = dio.read_all(fd, item.into.data(), split.prefix, used_direct, path))
        return std::move(*o);
      if (auto o = dio.read_all(fd, tail, split.tail, used_direct, path,
                                static_cast<off_t>(split.prefix)))
        return std::move(*o);
      const std::span<const std::byte> prefix(item.into.data(), split.prefix);
      if (auto why = detail::check_record_split(prefix, tail, item.key, item.into.size())) {
        return ItemOutcome::miss(std::move(*why), true);
      }
      std::memcpy(item.into.data() + split.prefix, tail, item.into.size() - split.prefix);
      return {};
    }
    std::byte* buf = worker.bounce.reserve(rec);
    if (auto o = dio.read_all(fd, buf, rec, used_direct, path)) return std::move(*o);
    if (auto why = detail::check_record(buf, item.key, item.into.size())) {
      return ItemOutcome::miss(std::move(*why), true);
    }
    if (!item.into.empty()) std::memcpy(item.into.data(), buf, item.into.size());
    return {};
  }

  void begin_flight(std::size_t n) {
    std::lock_guard lock(flight_mutex);
    in_flight += n;
  }
  void end_flight() {
    std::lock_guard lock(flight_mutex);
    if (--in_flight == 0) flight_cv.notify_all();
  }

  void check_open_locked() const {
    if (closed) throw Error(ErrorCode::kState, "file tier '" + options.name + "' is closed");
  }
};

// ---- FileTier -------------------------------------------------------------------------------

void FileTier::validate(const FileTierOptions& o) {
  namespace fs = std::filesystem;
  if (o.root.empty()) throw_invalid("file tier '" + o.name + "': root directory is empty");
  if (!o.root.is_absolute()) {
    throw_invalid("file tier '" + o.name + "': root '" + o.root.string() + "' is not absolute");
  }
  if (o.capacity_bytes == 0) {
    throw_invalid("file tier '" + o.name + "': capacity_bytes is 0 (give the bytes it may use)");
  }
  if (o.io_threads == 0 || o.io_threads > 256) {
    throw_invalid("file tier '" + o.name + "': io_threads " + std::to_string(o.io_threads) +
                  " is outside 1..256");
  }
  if (o.read_threads > o.io_threads) {
    throw_invalid("file tier '" + o.name + "': read_threads " + std::to_string(o.read_threads) +
                  " exceeds io_threads " + std::to_string(o.io_threads));
  }
  std::error_code ec;
  const auto st = fs::symlink_status(o.root, ec);
  fs::path must_write = o.root;
  if (!ec && fs::exists(st)) {
    if (!fs::is_directory(st)) {
      throw_invalid("file tier '" + o.name + "': root '" + o.root.string() +
                    "' exists and is not a directory");
    }
  } else {
    const auto parent = o.root.parent_path();
    if (!fs::is_directory(parent, ec)) {
      throw_invalid("file tier '" + o.name + "': root '" + o.root.string() +
                    "' does not exist and neither does its parent '" + parent.string() + "'");
    }
    must_write = parent;
  }
  if (::access(must_write.c_str(), W_OK | X_OK) != 0) {
    throw_invalid("file tier '" + o.name + "': '" + must_write.string() +
                  "' is not writable: " + errno_text("access", errno));
  }
}

std::unique_ptr<FileTier> FileTier::open(const FileTierOptions& options) {
  namespace fs = std::filesystem;
  validate(options);
  const Syscalls& sys = options.syscalls != nullptr ? *options.syscalls : real_syscalls();
  auto impl = std::make_unique<Impl>(options, sys);
  const std::string& name = options.name;

  bool created_root = false;
  if (sys.mkdirat(sys.context, AT_FDCWD, impl->root.c_str(), 0700) == 0) {
    created_root = true;
  } else if (errno != EEXIST) {
    throw_system_error("mkdir", errno, "file tier '" + name + "' root " + impl->root.string());
  }
  // Undo on failure: what this call created, in reverse order; the original error propagates.
  auto undo = [&]() noexcept {
    if (impl->lock_fd.valid()) {
      const auto lock_path = impl->root / detail::kTierLockName;
      if (created_root) (void)impl->unlink_path(lock_path);
      (void)impl->lock_fd.reset();
    }
    if (created_root) {
      std::error_code ec;
      fs::remove(impl->root, ec);
      if (ec)
        log().warn("file tier '{}': removing {}: {}", name, impl->root.string(), ec.message());
    }
  };

  try {
    const auto lock_path = impl->root / detail::kTierLockName;
    const int raw = detail::retry_eintr([&] {
      return sys.openat(sys.context, AT_FDCWD, lock_path.c_str(),
                        O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    });
    if (raw < 0) throw_system_error("open", errno, lock_path.string());
    impl->lock_fd = detail::UniqueFd(sys, raw);
    if (sys.flock(sys.context, impl->lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EWOULDBLOCK) {
        throw Error(ErrorCode::kState,
                    "file tier '" + name + "': root " + impl->root.string() +
                        " is in use by another file tier (" + lock_path.string() + " is locked)",
                    e, "flock");
      }
      throw_system_error("flock", e, lock_path.string());
    }

    const detail::Recovery found = detail::recover_root(sys, impl->root, name);
    for (const auto& r : found.records) impl->index.add_ready(r.key, r.file_bytes);
    // Note [Full disk]: never more than the filesystem can hold. A filesystem whose free space
    // cannot be read at open is an error (there would be no bound at all).
    struct statvfs vfs {};
    if (sys.fstatvfs(sys.context, impl->lock_fd.get(), &vfs) != 0) {
      throw_system_error("fstatvfs", errno, "file tier '" + name + "' root " + impl->root.string());
    }
    impl->log_capacity(impl->set_capacity_locked(static_cast<std::uint64_t>(vfs.f_bavail) *
                                                 static_cast<std::uint64_t>(vfs.f_frsize)));
    std::uint64_t evicted = 0;
    while (impl->index.used_bytes() > impl->index.capacity()) {
      const auto victim = impl->index.oldest();
      if (!victim) break;
      impl->index.erase(*victim);
      impl->reclaim(*victim);
      ++evicted;
    }
    impl->counters.evictions = evicted;

    impl->pool = std::make_unique<detail::IoPool>(options.io_threads, options.read_threads,
                                                  detail::kRecordAlign);
    log().info(
        "file tier '{}': opened {} ({} records, {} bytes, {} stale temp files removed, {} "
        "evicted to fit {} bytes; {} I/O threads, {})",
        name, impl->root.string(), impl->index.size(), impl->index.used_bytes(),
        found.stale_temps_removed, evicted, impl->index.capacity(), options.io_threads,
        impl->dio.enabled() ? "O_DIRECT when supported" : "buffered");
  } catch (...) {
    undo();
    throw;
  }
  return std::unique_ptr<FileTier>(new FileTier(std::move(impl)));
}

FileTier::FileTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FileTier::~FileTier() {
  close();
}

const std::string& FileTier::name() const noexcept {
  return impl_->options.name;
}
const std::filesystem::path& FileTier::root() const noexcept {
  return impl_->root;
}
std::filesystem::path FileTier::record_path(const BlockKey& key) const {
  return impl_->record_path(key);
}

TierBatch FileTier::put(std::span<const TierPut> items) {
  Impl& s = *impl_;
  std::vector<BlockKey> keys;
  keys.reserve(items.size());
  for (const auto& it : items) keys.push_back(it.key);
  TierBatchPromise promise(keys);

  struct Immediate {
    std::size_t index;
    TierItemStatus status;
    int err;
    std::string detail;
  };
  std::vector<Immediate> immediate;
  std::vector<BlockKey> evicted;
  std::vector<detail::IoPool::Task> tasks;
  // Note [Full disk]: re-measured once per batch, before the index lock (a system call).
  const std::optional<std::uint64_t> free = items.empty() ? std::nullopt : s.free_bytes();
  std::optional<Impl::CapacityChange> capacity_change;
  {
    std::lock_guard lock(s.mutex);
    s.check_open_locked();
    if (free) capacity_change = s.set_capacity_locked(*free);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const TierPut& item = items[i];
      if (s.index.holds(item.key)) {
        immediate.push_back({i, TierItemStatus::kOk, 0, "already stored"});
        continue;
      }
      const std::uint64_t rec = file_tier_record_bytes(item.bytes.size());
      if (rec > s.index.capacity()) {
        ++s.counters.puts_failed;
        immediate.push_back({i, TierItemStatus::kFailed, ENOSPC,
                             "record of " + std::to_string(rec) + " bytes exceeds capacity " +
                                 std::to_string(s.index.capacity()) +
                                 (s.index.capacity() < s.options.capacity_bytes
                                      ? " (configured " + std::to_string(s.options.capacity_bytes) +
                                            ", capped by the free space of " + s.root.string() + ")"
                                      : std::string())});
        continue;
      }
      while (!s.index.fits(rec)) {
        const auto victim = s.index.oldest();
        if (!victim) break;
        s.index.erase(*victim);
        ++s.counters.evictions;
        evicted.push_back(*victim);
      }
      if (!s.index.fits(rec)) {
        ++s.counters.puts_failed;
        immediate.push_back(
            {i, TierItemStatus::kFailed, ENOSPC, "capacity is held by writes in flight"});
        continue;
      }
      const std::uint64_t epoch = s.index.reserve(item.key, rec);
      const std::uint64_t temp_id = s.next_temp++;
      tasks.push_back([&s, promise, item, i, epoch, temp_id](detail::IoWorker& w) mutable {
        ItemOutcome o;
        try {
          o = s.do_put(w, item, epoch, temp_id);
        } catch (const std::exception& ex) {  // bad_alloc of the bounce buffer, path errors
          o = {TierItemStatus::kFailed, 0, ex.what(), false};
        }
        if (o.status != TierItemStatus::kOk) {
          {
            std::lock_guard guard(s.mutex);
            s.index.erase(item.key, epoch);
            ++s.counters.puts_failed;
          }
          s.reclaim(item.key);
          if (o.err != ECANCELED) {  // a remove overtaking its put is not a failure to report
            s.warnings.warn("put " + (o.err != 0 ? errno_name(o.err) : std::string("error")),
                            "file tier '{}': put of {} failed: {}", s.options.name,
                            item.key.to_hex(), o.detail);
          }
        } else {
          std::lock_guard guard(s.mutex);
          ++s.counters.puts_ok;
        }
        promise.set(i, o.status, o.err, std::move(o.detail));
        s.end_flight();
      });
    }
  }
  s.log_capacity(capacity_change);
  for (auto& im : immediate) {
    if (im.status == TierItemStatus::kFailed) {
      s.warnings.warn("put " + errno_name(im.err), "file tier '{}': put of {} failed: {}",
                      s.options.name, items[im.index].key.to_hex(), im.detail);
    }
    promise.set(im.index, im.status, im.err, std::move(im.detail));
  }
  // The victims' files go first: on a full disk the writes below need the space they free
  // (Note [Full disk]); queued after them, every write would meet ENOSPC and evict twice.
  std::vector<detail::IoPool::Task> ordered;
  ordered.reserve(evicted.size() + tasks.size());
  for (const auto& victim : evicted) {
    ordered.push_back([&s, victim](detail::IoWorker&) {
      s.reclaim(victim);
      s.end_flight();
    });
  }
  std::move(tasks.begin(), tasks.end(), std::back_inserter(ordered));
  tasks = std::move(ordered);
  s.begin_flight(tasks.size());
  s.pool->submit_many(std::move(tasks));
  return promise.batch();
}

TierBatch FileTier::get(std::span<const TierGet> items) {
  Impl& s = *impl_;
  std::vector<BlockKey> keys;
  keys.reserve(items.size());
  for (const auto& it : items) keys.push_back(it.key);
  TierBatchPromise promise(keys);
  std::vector<std::size_t> absent;
  std::vector<detail::IoPool::Task> tasks;
  {
    std::lock_guard lock(s.mutex);
    s.check_open_locked();
    for (std::size_t i = 0; i < items.size(); ++i) {
      const TierGet& item = items[i];
      const detail::TierIndex::Entry* entry = s.index.find(item.key);
      if (entry == nullptr || !entry->ready) {
        ++s.counters.gets_miss;
        absent.push_back(i);
        continue;
      }
      const std::uint64_t epoch = entry->epoch;
      tasks.push_back([&s, promise, item, i, epoch](detail::IoWorker& w) mutable {
        ItemOutcome o;
        try {
          o = s.do_get(w, item);
        } catch (const std::exception& ex) {
          o = {TierItemStatus::kFailed, 0, ex.what(), false};
        }
        bool drop = false;
        {
          std::lock_guard guard(s.mutex);
          switch (o.status) {
            case TierItemStatus::kOk: {
              ++s.counters.gets_ok;
              s.index.touch(item.key, epoch);  // most recently used
              break;
            }
            case TierItemStatus::kMiss:
              ++s.counters.gets_miss;
              if (o.damaged) {
                ++s.counters.corrupt;
                drop = s.index.erase(item.key, epoch);
              }
              break;
            case TierItemStatus::kFailed:
              ++s.counters.gets_failed;
              break;
          }
        }
        if (drop) {
          s.warnings.warn("unusable record", "file tier '{}': record {} unusable ({}); dropped",
                          s.options.name, item.key.to_hex(), o.detail);
          s.reclaim(item.key);
        }
        promise.set(i, o.status, o.err, std::move(o.detail));
        s.end_flight();
      });
    }
  }
  for (std::size_t i : absent) promise.set(i, TierItemStatus::kMiss, 0, "not held");
  s.begin_flight(tasks.size());
  s.pool->submit_many(std::move(tasks), detail::IoLane::kRead);
  return promise.batch();
}

bool FileTier::contains(const BlockKey& key) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->index.ready(key);
}

TierBatch FileTier::remove(std::span<const BlockKey> keys) {
  Impl& s = *impl_;
  TierBatchPromise promise(keys);
  std::vector<detail::IoPool::Task> tasks;
  {
    std::lock_guard lock(s.mutex);
    s.check_open_locked();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      s.index.erase(keys[i]);
      tasks.push_back([&s, promise, key = keys[i], i](detail::IoWorker&) mutable {
        const int e = s.reclaim(key);
        if (e == 0) {
          promise.set(i, TierItemStatus::kOk);
        } else {
          promise.set(i, TierItemStatus::kFailed, e,
                      errno_text("unlink " + s.record_path(key).string(), e));
        }
        s.end_flight();
      });
    }
  }
  s.begin_flight(tasks.size());
  s.pool->submit_many(std::move(tasks));
  return promise.batch();
}

void FileTier::drain() {
  std::unique_lock lock(impl_->flight_mutex);
  impl_->flight_cv.wait(lock, [&] { return impl_->in_flight == 0; });
}

TierStats FileTier::stats() const {
  TierStats out;
  {
    std::lock_guard lock(impl_->mutex);
    out = impl_->counters;
    out.entries = impl_->index.ready_count();
    out.bytes = impl_->index.ready_bytes();
  }
  {
    std::lock_guard lock(impl_->flight_mutex);
    out.in_flight = impl_->in_flight;
  }
  out.direct_io = impl_->dio.enabled();
  return out;
}

bool FileTier::close() noexcept {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mutex);
    if (s.closed) return true;
    s.closed = true;
  }
  bool ok = true;
  s.pool.reset();  // runs everything queued, then joins: no batch is left unfinished
  // The lock file stays (another opener needs a file to lock); closing releases the flock.
  if (const int e = s.lock_fd.reset(); e != 0) {
    ok = false;
    log().warn("file tier '{}': {}", s.options.name, errno_text("close lock file", e));
  }
  (void)s.warnings.flush("file tier '" + s.options.name + "'");
  log().info("file tier '{}': closed", s.options.name);
  return ok;
}

}  // namespace kvoffload
