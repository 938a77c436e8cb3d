// The pool file's lifetime: create, join, leave, remove (docs/DESIGN.md §6.6).
//
// Note [Pool file lifetime]: the protocol is the region's (§3.2, §3.5), smaller:
//  - The creator builds the whole file unnamed (O_TMPFILE, 0600): sized, allocated (fallocate,
//    so a full tmpfs is kCapacity now, never a SIGBUS later), header, robust mutex and empty
//    index written, its shared flock taken; then publishes it with linkat. linkat is the
//    election: a loser (EEXIST) drops its unnamed file and joins. Nobody ever sees a partial pool.
//  - Every attached process holds a shared flock. A joiner first tries a non-blocking exclusive
//    flock: winning it means nobody is attached, the file is stale (every tenant died), and it is
//    removed (when it is provably ours: this user's, 0600, our magic) and created afresh. Else it
//    takes the shared flock and checks that the path still names the file it holds (the last
//    tenant may have removed it meanwhile); if not, it starts over.
//  - Leaving: unmap, then a non-blocking exclusive flock; winning it means this was the last
//    process, and the path is unlinked if it still names our inode. A failed attempt leaves the
//    lock as it was (LOCK_NB), and we close anyway.
// The pool makes its system calls directly, not through the region's Syscalls seam: its faults
// are tested on a real tmpfs and by killing real processes.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include <kvoffload/error.hpp>

#include "pool/pool_impl.hpp"
#include "pool/proc_stat.hpp"
#include "util/retry_eintr.hpp"

namespace kvoffload::pool::detail {

namespace {

using kvoffload::detail::retry_eintr;

std::string q(const std::filesystem::path& p) {
  return "'" + p.string() + "'";
}

void copy_name(char* dst, std::size_t cap, const std::string& src) {
  std::memset(dst, 0, cap);
  src.copy(dst, std::min(src.size(), cap - 1));  // dst stays NUL-terminated (zeroed above)
}

std::uint64_t page_size() {
  return static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Whether `path` still names the inode (dev, ino); ENOENT is "no".
bool path_names(const std::filesystem::path& path, dev_t dev, ino_t ino) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    throw_system_error("lstat", errno, path.string());
  }
  return st.st_dev == dev && st.st_ino == ino;
}

void init_mutex(pthread_mutex_t* m) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(m, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) throw_system_error("pthread_mutex_init", rc, "(the node pool's index lock)");
}

// An empty index: every slot free, on the free list in ascending order.
void init_pool(void* base, const PoolOptions& o, const Layout& l) {
  auto* h = new (base) PoolHeader{};
  std::memcpy(h->magic, kPoolMagic, sizeof kPoolMagic);
  h->version = kPoolVersion;
  h->max_tenants = o.max_tenants;
  h->slot_bytes = o.geometry.slot_bytes;
  h->slot_count = o.geometry.slot_count;
  h->world_size = o.geometry.world_size;
  copy_name(h->layout, sizeof h->layout, o.geometry.layout);
  copy_name(h->dtype, sizeof h->dtype, o.geometry.dtype);
  copy_name(h->fingerprint, sizeof h->fingerprint, o.geometry.fingerprint);
  h->slot_stride = l.slot_stride;
  h->rank_stride = l.rank_stride;
  h->chunk_bytes = l.chunk_bytes;
  h->tenants_offset = l.tenants_offset;
  h->slots_offset = l.slots_offset;
  h->pins_offset = l.pins_offset;
  h->table_offset = l.table_offset;
  h->table_buckets = l.table_buckets;
  h->ghosts_offset = l.ghosts_offset;
  h->ghost_table_offset = l.ghost_table_offset;
  h->data_offset = l.data_offset;
  h->file_bytes = l.file_bytes;
  init_mutex(&h->mutex);
  h->list_head[0] = h->list_tail[0] = h->list_head[1] = h->list_tail[1] = kNone;
  h->free_head = h->free_tail = kNone;
  h->policy = static_cast<std::uint32_t>(o.policy);
  View v;
  v.bind(base);
  v.reset_ghosts();
  for (std::uint32_t t = 0; t < o.max_tenants; ++t) {
    auto* rec = new (&v.tenants[t]) TenantRecord{};
    rec->lru_head = rec->lru_tail = kNone;
  }
  for (std::uint32_t s = 0; s < h->slot_count; ++s) {
    auto* r = new (&v.slots[s]) SlotRecord{};
    r->owner = kNone;
    r->oprev = r->onext = kNone;
    v.push_back(h->free_head, h->free_tail, s);
  }
  h->n_free = h->slot_count;
  v.clear_table();  // the pin counts are zero: the file was zero-filled
}

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

void* map_file(int fd, std::uint64_t bytes, const std::filesystem::path& path) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) throw_system_error("mmap", errno, "of the node pool " + q(path));
  return base;
}

// Creates the pool; nullopt when another process published one first (join it).
std::optional<PoolFile> try_create(const PoolOptions& o, const std::filesystem::path& path) {
  const Layout l = compute_layout(o.geometry.slot_bytes, o.geometry.slot_count,
                                  o.geometry.world_size, o.max_tenants, page_size());
  const std::filesystem::path dir = path.parent_path();
  Fd fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd.fd < 0) throw_system_error("open", errno, "O_TMPFILE in the shm dir " + q(dir));
  if (::fchmod(fd.fd, 0600) != 0) throw_system_error("fchmod", errno, "of a new node pool");
  if (retry_eintr([&] { return ::ftruncate(fd.fd, static_cast<off_t>(l.file_bytes)); }) != 0)
    throw_system_error("ftruncate", errno, "of a new node pool to " + std::to_string(l.file_bytes));
  const int rc =
      retry_eintr([&] { return ::fallocate(fd.fd, 0, 0, static_cast<off_t>(l.file_bytes)); });
  if (rc != 0) {
    const int e = errno;
    if (e == ENOSPC || e == ENOMEM) {
      throw Error(ErrorCode::kCapacity,
                  "node pool " + q(path) + " needs " + std::to_string(l.file_bytes) + " bytes (" +
                      std::to_string(o.geometry.slot_count) + " chunks of " +
                      std::to_string(l.chunk_bytes) + " bytes, " +
                      std::to_string(o.geometry.world_size) + " ranks' ranges of " +
                      std::to_string(l.rank_stride) + ", plus the index) and " + q(dir) +
                      " has not that much free: use a smaller slot_count, or a larger shm "
                      "(--shm-size, --ipc=host)",
                  e, "fallocate");
    }
    throw_system_error("fallocate", e, "of the node pool " + q(path));
  }
  void* base = map_file(fd.fd, l.file_bytes, path);
  try {
    init_pool(base, o, l);
  } catch (...) {
    ::munmap(base, l.file_bytes);
    throw;
  }
  if (retry_eintr([&] { return ::flock(fd.fd, LOCK_SH); }) != 0) {
    const int e = errno;
    ::munmap(base, l.file_bytes);
    throw_system_error("flock", e, "LOCK_SH on a new node pool");
  }
  const std::string proc = "/proc/self/fd/" + std::to_string(fd.fd);
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0) {
    const int e = errno;
    ::munmap(base, l.file_bytes);
    if (e == EEXIST) return std::nullopt;
    throw_system_error("linkat", e, "publishing the node pool " + q(path));
  }
  struct stat st {};
  ::fstat(fd.fd, &st);
  PoolFile f;
  f.base = base;
  f.bytes = l.file_bytes;
  f.path = path;
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  f.fd = fd.release();
  return f;
}

std::string str(const char* field, std::size_t cap) {
  return std::string(field, strnlen(field, cap));
}

// Refuses a pool whose geometry or fingerprint differ from the joiner's, naming both values.
void check_geometry(const PoolHeader& h, const PoolOptions& o, const std::filesystem::path& path) {
  std::string diff;
  auto field = [&](const char* name, const std::string& pool, const std::string& mine) {
    if (pool == mine) return;
    if (!diff.empty()) diff += "; ";
    diff += std::string(name) + " is " + pool + " in the pool, " + mine + " for engine '" +
            o.engine_id + "'";
  };
  const PoolGeometry& g = o.geometry;
  field("slot_bytes", std::to_string(h.slot_bytes), std::to_string(g.slot_bytes));
  field("slot_count", std::to_string(h.slot_count), std::to_string(g.slot_count));
  field("world_size", std::to_string(h.world_size), std::to_string(g.world_size));
  field("layout", "'" + str(h.layout, sizeof h.layout) + "'", "'" + g.layout + "'");
  field("dtype", "'" + str(h.dtype, sizeof h.dtype) + "'", "'" + g.dtype + "'");
  field("fingerprint", "'" + str(h.fingerprint, sizeof h.fingerprint) + "'",
        "'" + g.fingerprint + "'");
  const bool known = h.policy <= static_cast<std::uint32_t>(PolicyKind::kArc);
  field("policy",
        known ? "'" + std::string(to_string(static_cast<PolicyKind>(h.policy))) + "'"
              : std::to_string(h.policy),
        "'" + std::string(to_string(o.policy)) + "'");
  if (!diff.empty()) {
    throw Error(ErrorCode::kMismatch,
                "node pool " + q(path) + " refuses engine '" + o.engine_id + "': " + diff +
                    " (every tenant of one pool must use the same geometry, model "
                    "fingerprint and eviction policy)");
  }
}

// The format version of an open file with the pool magic; nullopt when it has none (not a pool).
std::optional<std::uint32_t> pool_version(int fd) {
  PoolHeader h{};
  constexpr std::size_t kHead = offsetof(PoolHeader, version) + sizeof h.version;
  const ssize_t got = retry_eintr([&] { return ::pread(fd, &h, kHead, 0); });
  if (got != static_cast<ssize_t>(kHead) ||
      std::memcmp(h.magic, kPoolMagic, sizeof kPoolMagic) != 0)
    return std::nullopt;
  return h.version;
}

// Reads and checks the header of an open file: ours (magic, version), consistent with its size.
PoolHeader read_header(int fd, const std::filesystem::path& path, std::uint64_t file_size) {
  PoolHeader h{};
  const ssize_t got = retry_eintr([&] { return ::pread(fd, &h, sizeof h, 0); });
  if (got != static_cast<ssize_t>(sizeof h) ||
      std::memcmp(h.magic, kPoolMagic, sizeof kPoolMagic) != 0) {
    throw Error(ErrorCode::kMismatch, "the file " + q(path) +
                                          " is not a kvoffload node pool (no pool header); it is "
                                          "left in place: remove it or use another pool name");
  }
  if (h.version != kPoolVersion) {
    throw Error(
        ErrorCode::kMismatch,
        "node pool " + q(path) + " has format version " + std::to_string(h.version) +
            (h.version == 1 ? " (chunk-major, from a kvoffload before rank-major pools)" : "") +
            ", this library reads and writes only version " + std::to_string(kPoolVersion) +
            ": its tenants run another kvoffload; stop them (the last one out removes "
            "the file, and a stale one is removed by the next tenant or `kvoffload "
            "region clean`) or use another pool name");
  }
  const Layout l =
      compute_layout(h.slot_bytes, h.slot_count, h.world_size, h.max_tenants, page_size());
  if (h.max_tenants < 1 || h.max_tenants > 64 || h.slot_count < 1 || h.world_size < 1 ||
      l.file_bytes != h.file_bytes || l.data_offset != h.data_offset ||
      l.table_offset != h.table_offset || l.ghosts_offset != h.ghosts_offset ||
      l.ghost_table_offset != h.ghost_table_offset || l.slot_stride != h.slot_stride ||
      l.rank_stride != h.rank_stride || file_size != h.file_bytes) {
    throw Error(ErrorCode::kMismatch, "node pool " + q(path) +
                                          " is inconsistent: its header gives " +
                                          std::to_string(h.file_bytes) + " bytes, the file has " +
                                          std::to_string(file_size) + "; it is left in place");
  }
  return h;
}

// Removes a stale pool file (nobody attached: its exclusive flock is held) at path when it is
// provably a pool: this library's version and consistent, or any version with the pool magic (a
// stale pool of an older format is removed, never joined). Throws, leaving it, otherwise.
bool remove_stale(int fd, const std::filesystem::path& path, const struct stat& st) {
  const std::optional<std::uint32_t> version = pool_version(fd);
  if (!version || *version == kPoolVersion)
    (void)read_header(fd, path, static_cast<std::uint64_t>(st.st_size));
  if (!path_names(path, st.st_dev, st.st_ino)) return false;
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return false;
    throw_system_error("unlink", errno, path.string());
  }
  return true;
}

enum class JoinResult { kJoined, kAbsent, kRetry };

JoinResult try_join(const PoolOptions& o, const std::filesystem::path& path, PoolFile* out) {
  Fd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (fd.fd < 0) {
    if (errno == ENOENT) return JoinResult::kAbsent;
    if (errno == ELOOP) {
      throw Error(ErrorCode::kPermission,
                  "node pool path " + q(path) + " is a symbolic link; refused (remove it)");
    }
    throw_system_error("open", errno, "of the node pool " + q(path));
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw_system_error("fstat", errno, path.string());
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 07777) != 0600) {
    char mode[8];
    (void)std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error(
        ErrorCode::kPermission,
        "node pool " + q(path) + " is refused: " +
            (!S_ISREG(st.st_mode) ? std::string("not a regular file")
                                  : "owner uid " + std::to_string(st.st_uid) + ", mode " + mode) +
            "; a pool must be a regular file of this user (uid " + std::to_string(::geteuid()) +
            ") with mode 0600");
  }
  if (::flock(fd.fd, LOCK_EX | LOCK_NB) == 0) {
    // Nobody attached: stale (every tenant died). Remove it when it is provably a pool.
    (void)remove_stale(fd.fd, path, st);
    return JoinResult::kRetry;
  }
  if (errno != EWOULDBLOCK)
    throw_system_error("flock", errno, "LOCK_EX|LOCK_NB on " + path.string());
  if (::flock(fd.fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return JoinResult::kRetry;  // a leaver or a reclaimer holds it
    throw_system_error("flock", errno, "LOCK_SH on " + path.string());
  }
  if (!path_names(path, st.st_dev, st.st_ino)) return JoinResult::kRetry;
  const PoolHeader h = read_header(fd.fd, path, static_cast<std::uint64_t>(st.st_size));
  check_geometry(h, o, path);
  out->base = map_file(fd.fd, h.file_bytes, path);
  out->bytes = h.file_bytes;
  out->path = path;
  out->dev = st.st_dev;
  out->ino = st.st_ino;
  out->fd = fd.release();
  return JoinResult::kJoined;
}

}  // namespace

PoolFile PoolFile::open(const PoolOptions& o, const std::filesystem::path& path) {
  const auto deadline = std::chrono::steady_clock::now() + o.lock_timeout;
  for (int round = 0;; ++round) {
    PoolFile f;
    switch (try_join(o, path, &f)) {
      case JoinResult::kJoined:
        return f;
      case JoinResult::kAbsent:
        if (auto created = try_create(o, path)) return std::move(*created);
        continue;  // another process published first: join it
      case JoinResult::kRetry:
        break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(ErrorCode::kTimeout,
                  "node pool " + q(path) + ": could not join within " +
                      std::to_string(o.lock_timeout.count()) + " ms (" + std::to_string(round + 1) +
                      " attempts; its last tenant kept removing it or a process holds its "
                      "exclusive lock)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void PoolFile::close() noexcept {
  if (base != nullptr) {
    ::munmap(base, bytes);
    base = nullptr;
  }
  if (fd < 0) return;
  // Note [Pool file lifetime]: the last one out removes the file.
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    try {
      if (path_names(path, dev, ino)) ::unlink(path.c_str());
    } catch (...) {
    }
  }
  ::close(fd);
  fd = -1;
}

}  // namespace kvoffload::pool::detail

namespace kvoffload::pool::detail {

// Note [Pool observer]: how a monitor reads a pool. It opens the file O_RDONLY, checks the header
// as a joiner does, maps the index part PROT_READ and copies the counters, tenant records and
// header fields with no lock and no flock. The alternatives were worse for a monitor: attaching
// takes a tenant slot (and could be refused with a full table), and even a bounded lock wait
// would stall `top` and /metrics for lock_timeout behind a stopped holder, which is exactly when
// an operator looks. Taking the mutex also writes the file. A shared flock would keep the last
// tenant's exclusive try from winning, leaving the file behind. The cost: the copy may straddle
// an operation (a tenant's occupancy and the pool's free count from either side of it); every
// field is one aligned word, so no value is torn. Liveness is the repair's own: a tenant record
// whose PID and start time no longer name a live process is dead, and a pool with no live record
// is stale. remove_stale_pool decides removal by the flock instead (nobody attached at all), as
// the joiners do, so a tenant between taking its flock and writing its record is never removed.
namespace {

PoolObservation observe_one(const std::filesystem::path& path, std::string name) {
  PoolObservation o;
  o.path = path;
  o.name = std::move(name);
  try {
    Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (fd.fd < 0) throw_system_error("open", errno, "of the node pool " + q(path));
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) throw_system_error("fstat", errno, path.string());
    if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::kMismatch, "not a regular file");
    const PoolHeader h = read_header(fd.fd, path, static_cast<std::uint64_t>(st.st_size));
    const std::uint64_t index_bytes = h.data_offset;  // header, records, pins, key table
    void* base = ::mmap(nullptr, index_bytes, PROT_READ, MAP_SHARED, fd.fd, 0);
    if (base == MAP_FAILED) throw_system_error("mmap", errno, "PROT_READ of " + path.string());
    View v;
    v.bind(base);
    const PoolHeader& m = *v.h;
    o.geometry.slot_bytes = h.slot_bytes;
    o.geometry.slot_count = h.slot_count;
    o.geometry.world_size = h.world_size;
    o.geometry.layout = std::string(h.layout, strnlen(h.layout, sizeof h.layout));
    o.geometry.dtype = std::string(h.dtype, strnlen(h.dtype, sizeof h.dtype));
    o.geometry.fingerprint =
        std::string(h.fingerprint, strnlen(h.fingerprint, sizeof h.fingerprint));
    PoolStats& s = o.stats;
    s.slot_count = h.slot_count;
    s.free = __atomic_load_n(&m.n_free, __ATOMIC_RELAXED);
    s.writing = __atomic_load_n(&m.n_writing, __ATOMIC_RELAXED);
    s.ready = __atomic_load_n(&m.n_ready, __ATOMIC_RELAXED);
    s.pinned = __atomic_load_n(&m.n_pinned, __ATOMIC_RELAXED);
    s.repairs = __atomic_load_n(&m.repairs, __ATOMIC_RELAXED);
    s.tenants_reclaimed = __atomic_load_n(&m.tenants_reclaimed, __ATOMIC_RELAXED);
    bool any_alive = false;
    for (std::uint32_t t = 0; t < h.max_tenants; ++t) {
      const TenantRecord& r = v.tenants[t];
      if (__atomic_load_n(&r.in_use, __ATOMIC_ACQUIRE) == 0) continue;
      TenantStats ts;
      ts.index = t;
      char id[sizeof r.engine_id];
      std::memcpy(id, r.engine_id, sizeof id);
      id[sizeof id - 1] = '\0';
      ts.engine_id = id;
      ts.pid = __atomic_load_n(&r.pid, __ATOMIC_RELAXED);
      ts.lookup_keys = __atomic_load_n(&r.lookup_keys, __ATOMIC_RELAXED);
      ts.hits = __atomic_load_n(&r.hits, __ATOMIC_RELAXED);
      ts.cross_engine_hits = __atomic_load_n(&r.cross_engine_hits, __ATOMIC_RELAXED);
      ts.stores_prepared = __atomic_load_n(&r.stores_prepared, __ATOMIC_RELAXED);
      ts.stores_committed = __atomic_load_n(&r.stores_committed, __ATOMIC_RELAXED);
      ts.stores_aborted = __atomic_load_n(&r.stores_aborted, __ATOMIC_RELAXED);
      ts.evictions = __atomic_load_n(&r.evictions, __ATOMIC_RELAXED);
      ts.pins = __atomic_load_n(&r.pins, __ATOMIC_RELAXED);
      ts.pinned = __atomic_load_n(&r.pinned, __ATOMIC_RELAXED);
      ts.occupancy = __atomic_load_n(&r.occupancy, __ATOMIC_RELAXED);
      ts.cap_slots = __atomic_load_n(&r.cap_slots, __ATOMIC_RELAXED);
      ts.alive = process_alive(ts.pid, __atomic_load_n(&r.start_time, __ATOMIC_RELAXED));
      any_alive = any_alive || ts.alive;
      s.tenants.push_back(std::move(ts));
    }
    ::munmap(base, index_bytes);
    o.stale = !any_alive;
  } catch (const std::exception& e) {
    PoolObservation bad;
    bad.path = path;
    bad.name = o.name;
    bad.problem = e.what();
    return bad;
  }
  return o;
}

}  // namespace

}  // namespace kvoffload::pool::detail

namespace kvoffload::pool {

std::vector<PoolObservation> observe_pools(const std::filesystem::path& shm_dir) {
  std::vector<PoolObservation> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(shm_dir, ec)) {
    const std::string f = e.path().filename().string();
    constexpr std::string_view kPrefix = "kvoffload_";
    constexpr std::string_view kSuffix = ".pool";
    if (f.size() <= kPrefix.size() + kSuffix.size() || !f.starts_with(kPrefix) ||
        !f.ends_with(kSuffix))
      continue;
    out.push_back(detail::observe_one(
        e.path(), f.substr(kPrefix.size(), f.size() - kPrefix.size() - kSuffix.size())));
  }
  if (ec) throw_system_error("opendir", ec.value(), shm_dir.string());
  std::sort(out.begin(), out.end(),
            [](const PoolObservation& a, const PoolObservation& b) { return a.name < b.name; });
  return out;
}

bool remove_stale_pool(const std::filesystem::path& path) {
  detail::Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (fd.fd < 0) {
    if (errno == ENOENT) return false;
    throw_system_error("open", errno, "of the node pool " + detail::q(path));
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw_system_error("fstat", errno, path.string());
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 07777) != 0600) {
    throw Error(ErrorCode::kPermission,
                "node pool " + detail::q(path) +
                    " is not a regular file of this user with mode 0600; left in place");
  }
  if (::flock(fd.fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return false;  // a tenant is attached (or leaving)
    throw_system_error("flock", errno, "LOCK_EX|LOCK_NB on " + path.string());
  }
  // Nobody attached. Remove it when it is provably a pool (the header check throws otherwise),
  // of this format or an older one.
  return detail::remove_stale(fd.fd, path, st);
}

}  // namespace kvoffload::pool
