// FileTier: validation, open (the root's lock, recovery, the first capacity), remove, stats and
// close. The tier's state and the list of its other parts are in file_tier_impl.hpp.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "tier/file/file_tier_impl.hpp"
#include "tier/file/file_tier_recovery.hpp"
#include "util/log.hpp"

namespace kvoffload {

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
    auto refused = [&](int e) {
      if (e == EWOULDBLOCK) {
        throw Error(
            ErrorCode::kState,
            "file tier '" + name + "': root " + impl->root.string() + " is in use by " +
                (options.shared ? "a file tier that does not share it (" : "another file tier (") +
                lock_path.string() + " is locked)",
            e, "flock");
      }
      throw_system_error("flock", e, lock_path.string());
    };
    // Note [Shared root]: sharers hold the lock shared for their lifetime (never converted: a
    // failed non-blocking conversion would drop it).
    const int how = options.shared ? LOCK_SH : LOCK_EX;
    if (sys.flock(sys.context, impl->lock_fd.get(), how | LOCK_NB) != 0) refused(errno);

    impl->choose_format();
    const detail::Recovery found = detail::recover_root(sys, impl->root, name, options.shared);
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
        "evicted to fit {} bytes; {} I/O threads, {}, headers {})",
        name, impl->root.string(), impl->index.size(), impl->index.used_bytes(),
        found.stale_temps_removed, evicted, impl->index.capacity(), options.io_threads,
        impl->dio.enabled() ? "O_DIRECT when supported" : "buffered",
        impl->format == detail::RecordFormat::kXattr ? "in an extended attribute (format 3)"
                                                     : "in a trailer block (format 2)");
  } catch (...) {
    undo();
    throw;
  }
  return std::unique_ptr<FileTier>(new FileTier(std::move(impl)));
}

void FileTier::Impl::choose_format() {
  static constexpr char kValue[] = "format 3";
  if (sys.fsetxattr(sys.context, lock_fd.get(), detail::kHeaderXattr, kValue, sizeof kValue - 1,
                    0) == 0) {
    format = detail::RecordFormat::kXattr;
    return;
  }
  const int e = errno;
  if (e != EOPNOTSUPP) {
    // Not a refusal of attributes (a full disk, a quota): format 3 still; a put meeting the same
    // error reports it (ENOSPC evicts, Note [Full disk]).
    log().warn("file tier '{}': {}; keeping record headers in an extended attribute", options.name,
               errno_text("fsetxattr " + root.string(), e));
    format = detail::RecordFormat::kXattr;
    return;
  }
  format = detail::RecordFormat::kTrailer;
  log().info(
      "file tier '{}': the filesystem of {} keeps no user extended attributes; record headers "
      "go in a trailer block (format 2: one more 4 KiB block per record of whole blocks)",
      options.name, root.string());
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

bool FileTier::contains(const BlockKey& key) const {
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->index.ready(key) || !impl_->options.shared) return impl_->index.ready(key);
  }
  return impl_->on_disk(key).has_value();  // another opener's record (Note [Shared root])
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
