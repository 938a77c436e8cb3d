#include "kvoffload/file_tier.hpp"

#include "kvoffload/error.hpp"
#include "kvoffload/log.hpp"
#include "tier/crc32c.hpp"
#include "tier/io_pool.hpp"
#include "util/rate_limited_log.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iterator>
#include <list>
#include <mutex>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace kvoffload {

// ---- FileTierIo: the real system calls ----------------------------------------------------------

int FileTierIo::open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
int FileTierIo::close(int fd) { return ::close(fd); }
ssize_t FileTierIo::pread(int fd, void* buf, std::size_t count, off_t offset) {
  return ::pread(fd, buf, count, offset);
}
ssize_t FileTierIo::pwrite(int fd, const void* buf, std::size_t count, off_t offset) {
  return ::pwrite(fd, buf, count, offset);
}
int FileTierIo::fdatasync(int fd) { return ::fdatasync(fd); }
int FileTierIo::fsync(int fd) { return ::fsync(fd); }
int FileTierIo::fstat(int fd, struct stat* st) { return ::fstat(fd, st); }
int FileTierIo::fcntl_setfl(int fd, int flags) { return ::fcntl(fd, F_SETFL, flags); }
int FileTierIo::fcntl_getfl(int fd) { return ::fcntl(fd, F_GETFL); }
int FileTierIo::rename(const char* from, const char* to) { return ::rename(from, to); }
int FileTierIo::unlink(const char* path) { return ::unlink(path); }
int FileTierIo::mkdir(const char* path, mode_t mode) { return ::mkdir(path, mode); }
int FileTierIo::flock(int fd, int operation) { return ::flock(fd, operation); }
int FileTierIo::fstatvfs(int fd, struct statvfs* st) { return ::fstatvfs(fd, st); }

std::shared_ptr<FileTierIo> FileTierIo::system() {
  static const auto instance = std::make_shared<FileTierIo>();
  return instance;
}

namespace {

// O_DIRECT needs offsets, lengths and buffers aligned to the logical block size; 4 KiB covers
// every common device and keeps records page-sized for the page cache in buffered mode.
constexpr std::size_t kAlign = 4096;
constexpr char kMagic[8] = {'K', 'V', 'O', 'T', 'I', 'E', 'R', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr const char* kRecordSuffix = ".kvb";
constexpr const char* kTempSuffix = ".tmp";
constexpr const char* kLockName = ".kvoffload-tier.lock";

static_assert(std::endian::native == std::endian::little,
              "file-tier records are written in the host byte order, assumed little-endian");

// Note [File tier record]: the header carries the key and the payload length so that a file
// renamed by hand, or a truncated write that left a plausible size, is rejected; the header has
// its own CRC so a flipped length byte is caught before it is trusted for anything. The payload
// CRC covers exactly payload_bytes; the zero padding is not checked (it carries no data).
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

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

std::string fan_dir_name(const BlockKey& key) {
  // The last two hex digits: uniform for hashed keys and for small integer keys alike.
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

}  // namespace

std::uint64_t file_tier_record_bytes(std::uint64_t payload_bytes) noexcept {
  return round_up(sizeof(RecordHeader) + payload_bytes, kAlign);
}

// ---- FileTier::Impl ---------------------------------------------------------------------------

struct FileTier::Impl {
  struct Entry {
    std::uint64_t file_bytes = 0;
    std::uint64_t epoch = 0;   // identifies the put that owns the entry
    bool ready = false;        // false while its put is in flight
    std::list<BlockKey>::iterator lru;  // valid when ready
  };

  FileTierOptions options;
  std::shared_ptr<FileTierIo> io;
  std::filesystem::path root;
  int lock_fd = -1;
  std::atomic<bool> direct{false};
  std::once_flag fallback_logged;

  mutable std::mutex mutex;  // index, lru, used_bytes, ready_bytes, capacity, counters, closed
  std::unordered_map<BlockKey, Entry, BlockKeyHash> index;
  std::list<BlockKey> lru;   // ready records, least recently used first
  std::uint64_t used_bytes = 0;  // ready + reserved by puts in flight
  std::uint64_t ready_bytes = 0;  // ready records only (what the files hold on disk)
  std::uint64_t capacity = 0;     // in force now: Note [Full disk] in file_tier.hpp
  detail::RateLimitedLog warnings;
  std::uint64_t next_epoch = 1;
  std::uint64_t next_temp = 1;
  TierStats counters;
  bool closed = false;

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
    return root / fan_dir_name(key) / (key.to_hex() + kRecordSuffix);
  }

  void disable_direct(std::string_view where, const std::filesystem::path& path) {
    direct.store(false);
    std::call_once(fallback_logged, [&] {
      log().warn("file tier '{}': O_DIRECT refused ({} of {}: EINVAL); using buffered I/O",
                 options.name, where, path.string());
    });
  }

  // Opens a record file, with O_DIRECT while the tier uses it. On EINVAL the filesystem refused
  // O_DIRECT: buffered from now on. Returns fd or -1 with errno set.
  int open_record(const std::filesystem::path& path, int flags, bool& used_direct) {
    used_direct = false;
    if (direct.load()) {
      int fd = io->open(path.c_str(), flags | O_DIRECT, 0600);
      if (fd >= 0) {
        used_direct = true;
        return fd;
      }
      if (errno != EINVAL) return -1;
      // Some filesystems create the file before refusing the flag; ours is a unique temp name.
      if ((flags & O_CREAT) != 0) io->unlink(path.c_str());
      disable_direct("open", path);
    }
    return io->open(path.c_str(), flags, 0600);
  }

  // Clears O_DIRECT on an open descriptor after the filesystem refused a transfer with EINVAL.
  bool drop_direct(int fd, const std::filesystem::path& path, std::string_view where) {
    disable_direct(where, path);
    const int fl = io->fcntl_getfl(fd);
    return fl >= 0 && io->fcntl_setfl(fd, fl & ~O_DIRECT) == 0;
  }

  std::optional<ItemOutcome> write_all(int fd, const std::byte* buf, std::size_t n,
                                       bool& used_direct, const std::filesystem::path& path) {
    std::size_t off = 0;
    while (off < n) {
      const ssize_t r = io->pwrite(fd, buf + off, n - off, static_cast<off_t>(off));
      if (r < 0) {
        const int e = errno;
        if (e == EINTR) continue;
        if (e == EINVAL && used_direct) {
          used_direct = false;
          if (drop_direct(fd, path, "write")) continue;
          return ItemOutcome::failed("fcntl(F_SETFL) clearing O_DIRECT", errno);
        }
        return ItemOutcome::failed("pwrite " + path.string(), e);
      }
      if (r == 0) return ItemOutcome::failed("pwrite " + path.string() + " (wrote 0 bytes)", EIO);
      off += static_cast<std::size_t>(r);
    }
    return std::nullopt;
  }

  // Reads n bytes; nullopt on success, a miss when the file ended early, a failure otherwise.
  std::optional<ItemOutcome> read_all(int fd, std::byte* buf, std::size_t n, bool& used_direct,
                                      const std::filesystem::path& path) {
    std::size_t off = 0;
    while (off < n) {
      const ssize_t r = io->pread(fd, buf + off, n - off, static_cast<off_t>(off));
      if (r < 0) {
        const int e = errno;
        if (e == EINTR) continue;
        if (e == EINVAL && used_direct) {
          used_direct = false;
          if (drop_direct(fd, path, "read")) continue;
          return ItemOutcome::failed("fcntl(F_SETFL) clearing O_DIRECT", errno);
        }
        return ItemOutcome::failed("pread " + path.string(), e);
      }
      if (r == 0) return ItemOutcome::miss("record ends early (short file)", true);
      off += static_cast<std::size_t>(r);
    }
    return std::nullopt;
  }

  void close_fd(int fd, const std::filesystem::path& path) {
    if (io->close(fd) != 0) {
      const int e = errno;
      warnings.warn("close " + errno_name(e), "file tier '{}': {}", options.name,
                    errno_text("close " + path.string(), e));
    }
  }

  // Unlinks the record of `key` unless the index holds the key again (a newer put owns the name).
  // Returns 0 or the errno of a failed unlink (ENOENT counts as success).
  int reclaim(const BlockKey& key) {
    std::lock_guard name(name_lock(key));
    {
      std::lock_guard lock(mutex);
      if (index.contains(key)) return 0;
    }
    const auto path = record_path(key);
    if (io->unlink(path.c_str()) != 0 && errno != ENOENT) {
      const int e = errno;
      warnings.warn("unlink " + errno_name(e), "file tier '{}': {}", options.name,
                    errno_text("unlink " + path.string(), e));
      return e;
    }
    return 0;
  }

  // Removes `key` from the index when the entry is still the one `epoch` names. Caller holds mutex.
  bool erase_locked(const BlockKey& key, std::optional<std::uint64_t> epoch) {
    auto it = index.find(key);
    if (it == index.end() || (epoch && it->second.epoch != *epoch)) return false;
    if (it->second.ready) {
      lru.erase(it->second.lru);
      ready_bytes -= it->second.file_bytes;
    }
    used_bytes -= it->second.file_bytes;
    index.erase(it);
    return true;
  }

  // Writes `buf` to the new file `temp` (creating the fan-out directory when missing), syncs it
  // as the policy says and closes it. On failure nothing is left: the temp file is removed.
  ItemOutcome write_temp(const std::byte* buf, std::size_t rec, const std::filesystem::path& temp,
                         const std::filesystem::path& dir) {
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
    bool used_direct = false;
    int fd = open_record(temp, flags, used_direct);
    if (fd < 0 && errno == ENOENT) {  // fan-out directory not made yet
      if (io->mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return ItemOutcome::failed("mkdir " + dir.string(), errno);
      }
      fd = open_record(temp, flags, used_direct);
    }
    if (fd < 0) return ItemOutcome::failed("open " + temp.string(), errno);

    auto fail_with_temp = [&](ItemOutcome o) {
      if (fd >= 0) close_fd(fd, temp);
      if (io->unlink(temp.c_str()) != 0 && errno != ENOENT) {
        const int e = errno;
        warnings.warn("unlink " + errno_name(e), "file tier '{}': {}", options.name,
                      errno_text("unlink " + temp.string(), e));
      }
      return o;
    };
    if (auto o = write_all(fd, buf, rec, used_direct, temp)) return fail_with_temp(std::move(*o));
    if (options.fsync != FsyncPolicy::kNone && io->fdatasync(fd) != 0) {
      return fail_with_temp(ItemOutcome::failed("fdatasync " + temp.string(), errno));
    }
    const int closed_fd = fd;
    fd = -1;
    if (io->close(closed_fd) != 0) {
      return fail_with_temp(ItemOutcome::failed("close " + temp.string(), errno));
    }
    return {};
  }

  // Free bytes of the root's filesystem for an unprivileged writer (f_bavail), or nullopt when
  // fstatvfs fails (logged; the capacity in force stays).
  std::optional<std::uint64_t> free_bytes() {
    struct statvfs vfs {};
    if (io->fstatvfs(lock_fd, &vfs) != 0) {
      const int e = errno;
      warnings.warn("fstatvfs " + errno_name(e), "file tier '{}': {}; keeping capacity {}",
                    options.name, errno_text("fstatvfs " + root.string(), e), capacity);
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(vfs.f_bavail) * static_cast<std::uint64_t>(vfs.f_frsize);
  }

  // Note [Full disk]: capacity = min(configured, held + free). Caller holds mutex.
  void set_capacity_locked(std::uint64_t free) {
    const std::uint64_t fits = ready_bytes + free;
    const std::uint64_t cap = std::min(options.capacity_bytes, fits);
    if (cap != capacity && cap < options.capacity_bytes) {
      warnings.warn("capacity", "file tier '{}': capacity {} bytes, below the configured {}: the "
                    "filesystem of {} has {} bytes free besides the {} bytes of records held",
                    options.name, cap, options.capacity_bytes, root.string(), free, ready_bytes);
    }
    capacity = cap;
    counters.capacity_bytes = cap;
  }

  // After ENOSPC: evicts the oldest ready records (never `keep`) until `need` bytes are freed or
  // none is left, removes their files, and re-measures the capacity. Returns how many it evicted.
  std::size_t make_room(const BlockKey& keep, std::uint64_t need) {
    std::vector<BlockKey> victims;
    {
      std::lock_guard lock(mutex);
      std::uint64_t freed = 0;
      for (auto it = lru.begin(); it != lru.end() && freed < need;) {
        const BlockKey victim = *it++;
        if (victim == keep) continue;
        freed += index.at(victim).file_bytes;
        erase_locked(victim, std::nullopt);
        ++counters.evictions;
        victims.push_back(victim);
      }
    }
    for (const auto& v : victims) reclaim(v);
    if (const auto free = free_bytes()) {
      std::lock_guard lock(mutex);
      set_capacity_locked(*free);
    }
    return victims.size();
  }

  ItemOutcome do_put(detail::IoWorker& worker, const TierPut& item, std::uint64_t epoch,
                     std::uint64_t temp_id) {
    const std::uint64_t rec = file_tier_record_bytes(item.bytes.size());
    std::byte* buf = worker.bounce.reserve(rec);
    RecordHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.payload_bytes = item.bytes.size();
    h.key = item.key.to_bytes();
    h.payload_crc = detail::crc32c(item.bytes);
    std::memcpy(buf, &h, sizeof h);
    h.header_crc = detail::crc32c(std::span<const std::byte>(buf, kHeaderCrcSpan));
    std::memcpy(buf, &h, sizeof h);
    if (!item.bytes.empty()) std::memcpy(buf + sizeof h, item.bytes.data(), item.bytes.size());
    std::memset(buf + sizeof h + item.bytes.size(), 0, rec - sizeof h - item.bytes.size());

    const auto final_path = record_path(item.key);
    const auto dir = final_path.parent_path();
    const auto temp = dir / ("." + item.key.to_hex() + "." + std::to_string(temp_id) + kTempSuffix);
    auto unlink_temp = [&] {
      if (io->unlink(temp.c_str()) != 0 && errno != ENOENT) {
        const int e = errno;
        warnings.warn("unlink " + errno_name(e), "file tier '{}': {}", options.name,
                      errno_text("unlink " + temp.string(), e));
      }
    };
    ItemOutcome written = write_temp(buf, rec, temp, dir);
    if (written.status == TierItemStatus::kFailed && written.err == ENOSPC) {
      // Note [Full disk]: the disk filled behind our capacity (another writer, or a capacity
      // measured before the last put): make room from the oldest records and retry once.
      const std::size_t evicted = make_room(item.key, rec);
      warnings.log(spdlog::level::info, "enospc retry",
                   "file tier '{}': {}; evicted the {} oldest records, retrying once", options.name,
                   written.detail, evicted);
      if (evicted > 0) written = write_temp(buf, rec, temp, dir);
      if (written.status == TierItemStatus::kFailed && written.err == ENOSPC) {
        written.detail += evicted > 0 ? " (again after evicting " + std::to_string(evicted) + " records)"
                                      : " (no record left to evict)";
      }
    }
    if (written.status != TierItemStatus::kOk) return written;

    auto fail_with_temp = [&](ItemOutcome o) {
      unlink_temp();
      return o;
    };
    {
      std::lock_guard name(name_lock(item.key));
      bool still_wanted = false;
      {
        std::lock_guard lock(mutex);
        auto it = index.find(item.key);
        still_wanted = it != index.end() && it->second.epoch == epoch;
      }
      if (!still_wanted) {
        return fail_with_temp(
            ItemOutcome{TierItemStatus::kFailed, ECANCELED, "removed while being stored", false});
      }
      if (io->rename(temp.c_str(), final_path.c_str()) != 0) {
        return fail_with_temp(
            ItemOutcome::failed("rename " + temp.string() + " -> " + final_path.string(), errno));
      }
      std::lock_guard lock(mutex);
      auto it = index.find(item.key);
      if (it != index.end() && it->second.epoch == epoch) {
        it->second.ready = true;
        it->second.lru = lru.insert(lru.end(), item.key);
        ready_bytes += it->second.file_bytes;
      }
    }
    if (options.fsync == FsyncPolicy::kFull) {
      const int dfd = io->open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
      if (dfd < 0) return ItemOutcome::failed("open " + dir.string(), errno);
      const int rc = io->fsync(dfd);
      const int e = errno;
      close_fd(dfd, dir);
      if (rc != 0) return ItemOutcome::failed("fsync " + dir.string(), e);
    }
    return {};
  }

  ItemOutcome do_get(detail::IoWorker& worker, const TierGet& item) {
    const auto path = record_path(item.key);
    bool used_direct = false;
    const int fd = open_record(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, used_direct);
    if (fd < 0) {
      if (errno == ENOENT) return ItemOutcome::miss("record file missing", true);
      return ItemOutcome::failed("open " + path.string(), errno);
    }
    struct FdCloser {
      Impl* impl;
      int fd;
      const std::filesystem::path& path;
      ~FdCloser() { impl->close_fd(fd, path); }
    } closer{this, fd, path};

    struct stat st {};
    if (io->fstat(fd, &st) != 0) return ItemOutcome::failed("fstat " + path.string(), errno);
    const std::uint64_t rec = file_tier_record_bytes(item.into.size());
    if (static_cast<std::uint64_t>(st.st_size) != rec) {
      return ItemOutcome::miss("record is " + std::to_string(st.st_size) + " bytes, expected " +
                                   std::to_string(rec) + " (short or another length)",
                               true);
    }
    std::byte* buf = worker.bounce.reserve(rec);
    if (auto o = read_all(fd, buf, rec, used_direct, path)) return std::move(*o);

    RecordHeader h{};
    std::memcpy(&h, buf, sizeof h);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) {
      return ItemOutcome::miss("bad magic or version", true);
    }
    if (detail::crc32c(std::span<const std::byte>(buf, kHeaderCrcSpan)) != h.header_crc) {
      return ItemOutcome::miss("header checksum mismatch", true);
    }
    if (h.key != item.key.to_bytes()) return ItemOutcome::miss("record holds another key", true);
    if (h.payload_bytes != item.into.size()) {
      return ItemOutcome::miss("record holds " + std::to_string(h.payload_bytes) +
                                   " bytes, expected " + std::to_string(item.into.size()),
                               true);
    }
    const std::span<const std::byte> payload(buf + sizeof h, item.into.size());
    if (detail::crc32c(payload) != h.payload_crc) {
      return ItemOutcome::miss("payload checksum mismatch", true);
    }
    if (!payload.empty()) std::memcpy(item.into.data(), payload.data(), payload.size());
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
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->io = options.io ? options.io : FileTierIo::system();
  impl->root = options.root;
  impl->direct.store(options.direct_io == DirectIoMode::kAuto);
  FileTierIo& io = *impl->io;
  const std::string& name = options.name;

  bool created_root = false;
  if (io.mkdir(impl->root.c_str(), 0700) == 0) {
    created_root = true;
  } else if (errno != EEXIST) {
    throw_system_error("mkdir", errno, "file tier '" + name + "' root " + impl->root.string());
  }
  // Undo on failure: what this call created, in reverse order; the original error propagates.
  auto undo = [&]() noexcept {
    if (impl->lock_fd >= 0) {
      const auto lock_path = impl->root / kLockName;
      if (created_root) io.unlink(lock_path.c_str());
      io.close(impl->lock_fd);
      impl->lock_fd = -1;
    }
    if (created_root) {
      std::error_code ec;
      fs::remove(impl->root, ec);
      if (ec) log().warn("file tier '{}': removing {}: {}", name, impl->root.string(), ec.message());
    }
  };

  try {
    const auto lock_path = impl->root / kLockName;
    impl->lock_fd = io.open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (impl->lock_fd < 0) throw_system_error("open", errno, lock_path.string());
    if (io.flock(impl->lock_fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EWOULDBLOCK) {
        throw Error(ErrorCode::kState,
                    "file tier '" + name + "': root " + impl->root.string() +
                        " is in use by another file tier (" + lock_path.string() + " is locked)",
                    e, "flock");
      }
      throw_system_error("flock", e, lock_path.string());
    }

    // Index what a previous owner left; delete its temporary files (we hold the root's lock, so
    // no writer is alive).
    struct Found {
      fs::file_time_type mtime;
      BlockKey key;
      std::uint64_t bytes;
    };
    std::vector<Found> found;
    std::uint64_t stale_temps = 0;
    std::error_code ec;
    for (const auto& sub : fs::directory_iterator(impl->root, ec)) {
      std::error_code sec;
      if (!sub.is_directory(sec) || sub.is_symlink(sec)) continue;
      const auto dname = sub.path().filename().string();
      if (dname.size() != 2 || dname.find_first_not_of("0123456789abcdef") != std::string::npos) {
        continue;
      }
      for (const auto& f : fs::directory_iterator(sub.path(), sec)) {
        const auto fname = f.path().filename().string();
        std::error_code fec;
        if (!f.is_regular_file(fec)) continue;
        if (fname.starts_with(".") && fname.ends_with(kTempSuffix)) {
          if (io.unlink(f.path().c_str()) == 0) ++stale_temps;
          continue;
        }
        if (!fname.ends_with(kRecordSuffix)) continue;
        const auto stem = std::string_view(fname).substr(0, fname.size() - std::strlen(kRecordSuffix));
        if (stem.size() != BlockKey::kHexDigits) continue;
        const auto key = BlockKey::try_parse_hex(stem);
        if (!key || fan_dir_name(*key) != dname || stem != key->to_hex()) continue;
        const auto bytes = f.file_size(fec);
        if (fec || bytes < kAlign || bytes % kAlign != 0) continue;  // not a record we wrote
        found.push_back({f.last_write_time(fec), *key, bytes});
      }
      if (sec) {
        throw Error(ErrorCode::kSystem, "file tier '" + name + "': scanning " +
                                            sub.path().string() + ": " + sec.message(),
                    sec.value(), "readdir");
      }
    }
    if (ec) {
      throw Error(ErrorCode::kSystem,
                  "file tier '" + name + "': scanning " + impl->root.string() + ": " + ec.message(),
                  ec.value(), "readdir");
    }
    std::sort(found.begin(), found.end(),
              [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
    std::uint64_t evicted = 0;
    for (const auto& f : found) {
      Impl::Entry e;
      e.file_bytes = f.bytes;
      e.epoch = impl->next_epoch++;
      e.ready = true;
      e.lru = impl->lru.insert(impl->lru.end(), f.key);
      impl->index.emplace(f.key, e);
      impl->used_bytes += f.bytes;
      impl->ready_bytes += f.bytes;
    }
    // Note [Full disk]: never more than the filesystem can hold. A filesystem whose free space
    // cannot be read at open is an error (there would be no bound at all).
    struct statvfs vfs {};
    if (io.fstatvfs(impl->lock_fd, &vfs) != 0) {
      throw_system_error("fstatvfs", errno, "file tier '" + name + "' root " + impl->root.string());
    }
    impl->set_capacity_locked(static_cast<std::uint64_t>(vfs.f_bavail) *
                              static_cast<std::uint64_t>(vfs.f_frsize));
    while (impl->used_bytes > impl->capacity && !impl->lru.empty()) {
      const BlockKey victim = impl->lru.front();
      impl->erase_locked(victim, std::nullopt);
      impl->reclaim(victim);
      ++evicted;
    }
    impl->counters.evictions = evicted;

    impl->pool = std::make_unique<detail::IoPool>(options.io_threads, kAlign);
    log().info("file tier '{}': opened {} ({} records, {} bytes, {} stale temp files removed, {} "
               "evicted to fit {} bytes; {} I/O threads, {})",
               name, impl->root.string(), impl->index.size(), impl->used_bytes, stale_temps,
               evicted, impl->capacity, options.io_threads,
               impl->direct.load() ? "O_DIRECT when supported" : "buffered");
  } catch (...) {
    undo();
    throw;
  }
  return std::unique_ptr<FileTier>(new FileTier(std::move(impl)));
}

FileTier::FileTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FileTier::~FileTier() { close(); }

const std::string& FileTier::name() const noexcept { return impl_->options.name; }
const std::filesystem::path& FileTier::root() const noexcept { return impl_->root; }
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
  {
    std::lock_guard lock(s.mutex);
    s.check_open_locked();
    if (free) s.set_capacity_locked(*free);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const TierPut& item = items[i];
      if (s.index.contains(item.key)) {
        immediate.push_back({i, TierItemStatus::kOk, 0, "already stored"});
        continue;
      }
      const std::uint64_t rec = file_tier_record_bytes(item.bytes.size());
      if (rec > s.capacity) {
        ++s.counters.puts_failed;
        immediate.push_back({i, TierItemStatus::kFailed, ENOSPC,
                             "record of " + std::to_string(rec) + " bytes exceeds capacity " +
                                 std::to_string(s.capacity) +
                                 (s.capacity < s.options.capacity_bytes
                                      ? " (configured " + std::to_string(s.options.capacity_bytes) +
                                            ", capped by the free space of " + s.root.string() + ")"
                                      : std::string())});
        continue;
      }
      while (s.used_bytes + rec > s.capacity && !s.lru.empty()) {
        const BlockKey victim = s.lru.front();
        s.erase_locked(victim, std::nullopt);
        ++s.counters.evictions;
        evicted.push_back(victim);
      }
      if (s.used_bytes + rec > s.capacity) {
        ++s.counters.puts_failed;
        immediate.push_back({i, TierItemStatus::kFailed, ENOSPC,
                             "capacity is held by writes in flight"});
        continue;
      }
      Impl::Entry e;
      e.file_bytes = rec;
      e.epoch = s.next_epoch++;
      s.index.emplace(item.key, e);
      s.used_bytes += rec;
      const std::uint64_t epoch = e.epoch;
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
            s.erase_locked(item.key, epoch);
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
      auto it = s.index.find(item.key);
      if (it == s.index.end() || !it->second.ready) {
        ++s.counters.gets_miss;
        absent.push_back(i);
        continue;
      }
      const std::uint64_t epoch = it->second.epoch;
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
              auto e = s.index.find(item.key);
              if (e != s.index.end() && e->second.epoch == epoch && e->second.ready) {
                s.lru.splice(s.lru.end(), s.lru, e->second.lru);  // most recently used
              }
              break;
            }
            case TierItemStatus::kMiss:
              ++s.counters.gets_miss;
              if (o.damaged) {
                ++s.counters.corrupt;
                drop = s.erase_locked(item.key, epoch);
              }
              break;
            case TierItemStatus::kFailed: ++s.counters.gets_failed; break;
          }
        }
        if (drop) {
          s.warnings.warn("unusable record", "file tier '{}': record {} unusable ({}); dropped", s.options.name,
                     item.key.to_hex(), o.detail);
          s.reclaim(item.key);
        }
        promise.set(i, o.status, o.err, std::move(o.detail));
        s.end_flight();
      });
    }
  }
  for (std::size_t i : absent) promise.set(i, TierItemStatus::kMiss, 0, "not held");
  s.begin_flight(tasks.size());
  s.pool->submit_many(std::move(tasks));
  return promise.batch();
}

bool FileTier::contains(const BlockKey& key) const {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->index.find(key);
  return it != impl_->index.end() && it->second.ready;
}

TierBatch FileTier::remove(std::span<const BlockKey> keys) {
  Impl& s = *impl_;
  TierBatchPromise promise(keys);
  std::vector<detail::IoPool::Task> tasks;
  {
    std::lock_guard lock(s.mutex);
    s.check_open_locked();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      s.erase_locked(keys[i], std::nullopt);
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
    out.entries = impl_->lru.size();
    out.bytes = 0;
    for (const auto& key : impl_->lru) out.bytes += impl_->index.at(key).file_bytes;
  }
  {
    std::lock_guard lock(impl_->flight_mutex);
    out.in_flight = impl_->in_flight;
  }
  out.direct_io = impl_->direct.load();
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
  if (s.lock_fd >= 0) {
    // The lock file stays (another opener needs a file to lock); closing releases the flock.
    if (s.io->close(s.lock_fd) != 0) {
      ok = false;
      log().warn("file tier '{}': {}", s.options.name, errno_text("close lock file", errno));
    }
    s.lock_fd = -1;
  }
  (void)s.warnings.flush("file tier '" + s.options.name + "'");
  log().info("file tier '{}': closed", s.options.name);
  return ok;
}

}  // namespace kvoffload
