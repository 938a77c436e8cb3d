#include "kvoffload/region.hpp"

#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <utility>

#include "kvoffload/error.hpp"
#include "kvoffload/log.hpp"
#include "kvoffload/platform.hpp"
#include "kvoffload/syscalls.hpp"
#include "region/header.hpp"
#include "region/populate.hpp"
#include "region/region_internal.hpp"
#include "region/sys.hpp"
#include "util/clock.hpp"

// Note [Region lifetime]
// ~~~~~~~~~~~~~~~~~~~~~~
// Creation. Every caller first tries to open an existing file at the path. When there is none it
// becomes a candidate creator: it checks capacity (statvfs free space, or the memory cgroup when
// that is lower) while nothing is visible, builds an unnamed file with O_TMPFILE, takes the shared
// liveness flock and an OFD write lock on the header ("creator alive"), writes the header with
// state "creating", and publishes it with linkat. linkat is the election: exactly one candidate
// wins; the losers drop their unnamed file (nothing was allocated yet) and join. Only the winner
// then allocates the space (fallocate), maps it, sets the state to "ready" and drops the OFD lock.
// Publishing before fallocate keeps the election cheap: N racing ranks never each allocate the
// whole region, and never fail a capacity check because of each other.
//
// Joining. A joiner opens the path with O_NOFOLLOW, checks owner and mode (before the stale test,
// or root would reclaim another user's idle file), then asks "is anyone attached?" with a
// non-blocking LOCK_EX. Winning it means no process holds the liveness lock: the file is stale
// (its creator died, or every user exited without unlinking) and is reclaimed. Otherwise it takes
// LOCK_SH (never by converting a lock) and re-checks that the path still names the inode it
// holds. A header in state "creating" makes it wait, bounded by join_timeout; when the creator's
// OFD lock is gone and the state is still "creating" the creator died, and the joiner starts over
// (reclaiming the stub) instead of waiting for the timeout.
//
// Teardown. Hooks (host unregister), munmap, then "am I the last one?": a non-blocking conversion
// LOCK_SH -> LOCK_EX. Success means no one else is attached: unlink if the path still names our
// inode. Failure drops our shared lock (that is how flock conversion works), which is fine on the
// way out and is why the question can only be asked here. Then close.

namespace kvoffload {

std::string_view to_string(RegionRole role) noexcept {
  return role == RegionRole::kCreator ? "creator" : "joiner";
}

std::string_view to_string(PopulateMethod m) noexcept {
  switch (m) {
    case PopulateMethod::kMadvise: return "madvise";
    case PopulateMethod::kFallback: return "fallback";
    case PopulateMethod::kNone: return "none";
  }
  return "none";
}

std::filesystem::path default_shm_dir() {
  if (const char* env = std::getenv("KVOFFLOAD_SHM_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return "/dev/shm";
}

std::filesystem::path region_path(const std::filesystem::path& shm_dir, const std::string& engine_id) {
  detail::validate_engine_id(engine_id);
  return shm_dir / (detail::kRegionPrefix + engine_id + detail::kRegionSuffix);
}

namespace detail {

void validate_engine_id(const std::string& id) {
  if (id.empty() || id.size() > 128) {
    throw_invalid("engine id '" + id + "' has " + std::to_string(id.size()) +
                  " characters; it must have 1 to 128");
  }
  if (id == "." || id == "..") {
    throw_invalid("engine id '" + id + "' is not allowed ('.' and '..' are refused)");
  }
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      throw_invalid("engine id '" + id + "' contains the character '" + std::string(1, c) +
                    "'; only letters, digits, '.', '_' and '-' are allowed");
    }
  }
}

std::string engine_id_from_file_name(const std::string& name) {
  const std::string prefix = kRegionPrefix;
  const std::string suffix = kRegionSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return {};
  }
  return name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
}

void check_owner_and_mode(const struct stat& st, const std::string& path) {
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kPermission, path + " is not a regular file; refused");
  }
  if (st.st_uid != ::geteuid()) {
    throw Error(ErrorCode::kPermission, path + " is owned by uid " + std::to_string(st.st_uid) +
                                            "; only a region owned by this user (uid " +
                                            std::to_string(::geteuid()) + ") is joined or removed");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    (void)std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error(ErrorCode::kPermission, path + " has mode " + mode +
                                            ", wider than the 0600 regions are created with; refused");
  }
}

bool path_names_inode(const Syscalls& sys, int dirfd, const std::string& name, const struct stat& held) {
  struct stat now {};
  if (sys.fstatat(sys.context, dirfd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    throw_system_error("fstatat", errno, name);
  }
  return now.st_dev == held.st_dev && now.st_ino == held.st_ino;
}

int open_shm_dir(const Syscalls& sys, const std::string& dir) {
  const int fd = retry_eintr([&] {
    return sys.openat(sys.context, AT_FDCWD, dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  });
  if (fd >= 0) return fd;
  const int err = errno;
  if (err == ENOTDIR) throw_invalid("shm dir " + dir + " is not a directory");
  if (err == ENOENT) throw_invalid("shm dir " + dir + " does not exist");
  throw_system_error("open", err, "of the shm dir " + dir);
}

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

std::string describe_layout(const RegionLayout& l) {
  return "{num_chunks=" + std::to_string(l.num_chunks) + ", slot_bytes=" + std::to_string(l.slot_bytes) +
         ", world_size=" + std::to_string(l.world_size) +
         ", replicated=" + (l.replicated ? "true" : "false") + "}";
}

using util::seconds_since;

// A short randomised pause between attempts, so that processes racing over a stale file do not
// retry in lock step.
void backoff() {
  thread_local std::minstd_rand rng(static_cast<unsigned>(
      std::hash<std::thread::id>{}(std::this_thread::get_id()) ^ static_cast<unsigned>(::getpid())));
  std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 2000));
}

// Everything one create_or_join call works with.
struct Attempt {
  const Syscalls& sys;
  const RegionOptions& options;
  const RegionGeometry& geometry;
  std::string dir;
  std::string name;
  std::string path;
  int dirfd = -1;
  std::uint64_t file_bytes = 0;  // header page + data
  Clock::time_point started;
  Clock::time_point deadline;
  std::string last_observed = "absent";
};

// What an attempt produced: an attached descriptor (holding LOCK_SH) or a reason to go around.
enum class Step { kAttached, kAbsent, kRetry, kRetryNow, kLostRace };

struct Attached {
  detail::UniqueFd fd;
  struct stat st {};
  detail::Mapping mapping;  // set by the creator; joiners map after validation
  RegionRole role = RegionRole::kJoiner;
};

[[noreturn]] void throw_timeout(const Attempt& a) {
  char secs[32];
  (void)std::snprintf(secs, sizeof secs, "%.3f", seconds_since(a.started));
  throw Error(ErrorCode::kTimeout,
              "timed out joining region " + a.path + " after " + secs +
                  " s (join_timeout): expected state 'ready', observed '" + a.last_observed +
                  "'. The creating process is still working or is stuck; raise the join timeout "
                  "or check that process");
}

void check_capacity(const Attempt& a) {
  struct statvfs vfs {};
  if (a.sys.fstatvfs(a.sys.context, a.dirfd, &vfs) != 0) {
    throw_system_error("fstatvfs", errno, "of " + a.dir + " (checking space for region " + a.path + ")");
  }
  const std::uint64_t fs_free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  std::uint64_t available = fs_free;
  std::string source = "free space of " + a.dir;
  const auto cgroup = platform::memory_cgroup_available(&a.sys);
  if (cgroup && *cgroup < fs_free) {
    available = *cgroup;
    source = "memory cgroup limit (" + std::to_string(*cgroup) +
             " bytes left under it), which is lower than the free space of " + a.dir + " (" +
             std::to_string(fs_free) + " bytes)";
  }
  if (a.file_bytes <= available) return;
  const RegionGeometry& g = a.geometry;
  const std::string copies =
      g.replicated() ? "1 copy (replicated)" : std::to_string(g.copies()) + " copies (world_size)";
  throw Error(
      ErrorCode::kCapacity,
      "not enough shared memory for region " + a.path + ": it needs " + std::to_string(a.file_bytes) +
          " bytes but " + std::to_string(available) + " bytes are available (checked against the " +
          source + "). The size comes from num_chunks=" + std::to_string(g.num_chunks()) +
          " x row_stride=" + std::to_string(g.row_stride()) + " (slot_bytes=" +
          std::to_string(g.slot_bytes()) + " x " + copies + ", rounded up to the " +
          std::to_string(g.page_size()) + "-byte page) plus a " +
          std::to_string(a.file_bytes - g.data_bytes()) +
          "-byte header. Fixes: give the container a larger shm (docker run --shm-size=...), "
          "share the host's (--ipc=host), or ask for a smaller region (fewer chunks or smaller "
          "slots)");
}

// Unlinks `name` only when it still names the inode we hold; returns errno of the failed step.
int unlink_if_ours(const Syscalls& sys, int dirfd, const std::string& name, const struct stat& st) noexcept {
  try {
    if (!detail::path_names_inode(sys, dirfd, name, st)) return 0;
  } catch (const Error& e) {
    return e.sys_errno();
  }
  if (sys.unlinkat(sys.context, dirfd, name.c_str(), 0) != 0 && errno != ENOENT) return errno;
  return 0;
}

// The creator path (see Note [Region lifetime]). Returns kAttached with `out` filled, or kLostRace
// when another process published first. Throws on failure, leaving nothing behind.
Step try_create(Attempt& a, Attached& out) {
  const Syscalls& sys = a.sys;
  check_capacity(a);

  const int raw = detail::retry_eintr([&] {
    return sys.openat(sys.context, a.dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  });
  if (raw < 0) {
    throw_system_error("open", errno, "(O_TMPFILE) in " + a.dir + " for region " + a.path);
  }
  detail::UniqueFd fd(sys, raw);
  // The umask may have narrowed the mode; joiners need exactly 0600.
  if (sys.fchmod(sys.context, fd.get(), 0600) != 0) {
    throw_system_error("fchmod", errno, "0600 of the new region " + a.path);
  }
  if (sys.flock(sys.context, fd.get(), LOCK_SH | LOCK_NB) != 0) {
    throw_system_error("flock", errno, "(LOCK_SH) of the new region " + a.path);
  }
  struct flock creator_lock {};
  creator_lock.l_type = F_WRLCK;
  creator_lock.l_whence = SEEK_SET;
  creator_lock.l_start = detail::kCreatorLockStart;
  creator_lock.l_len = detail::kCreatorLockLen;
  if (detail::retry_eintr([&] { return sys.fcntl_lock(sys.context, fd.get(), F_OFD_SETLK, &creator_lock); }) != 0) {
    throw_system_error("fcntl", errno, "(F_OFD_SETLK) on the header of the new region " + a.path);
  }
  detail::write_header(sys, fd.get(), detail::make_header(a.geometry, a.options.engine_id), a.path);
  struct stat st {};
  if (sys.fstat(sys.context, fd.get(), &st) != 0) {
    throw_system_error("fstat", errno, "of the new region " + a.path);
  }

  const std::string proc_path = "/proc/self/fd/" + std::to_string(fd.get());
  if (sys.linkat(sys.context, AT_FDCWD, proc_path.c_str(), a.dirfd, a.name.c_str(),
                 AT_SYMLINK_FOLLOW) != 0) {
    if (errno == EEXIST) return Step::kLostRace;  // fd closes: the unnamed file disappears
    throw_system_error("linkat", errno, "publishing the new region as " + a.path);
  }

  // Visible from here on: a failure must remove the name before the descriptor goes.
  try {
    const int rc = detail::retry_eintr([&] {
      return sys.fallocate(sys.context, fd.get(), 0, 0, static_cast<off_t>(a.file_bytes));
    });
    if (rc != 0) {
      const int err = errno;
      if (err == ENOSPC || err == EDQUOT) {
        throw Error(ErrorCode::kCapacity,
                    "fallocate of " + std::to_string(a.file_bytes) + " bytes for region " + a.path +
                        ": " + strerrordesc_np(err) + " (" + errno_name(err) +
                        "); the space went to someone else after the capacity check. Fixes: a "
                        "larger shm (--shm-size), --ipc=host, or a smaller region",
                    err, "fallocate");
      }
      throw_system_error("fallocate", err, "of " + std::to_string(a.file_bytes) + " bytes for region " + a.path);
    }
    void* addr = sys.mmap(sys.context, nullptr, a.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                          fd.get(), 0);
    if (addr == MAP_FAILED) {
      throw_system_error("mmap", errno, "of " + std::to_string(a.file_bytes) + " bytes of region " + a.path);
    }
    detail::Mapping mapping(sys, addr, a.file_bytes);
    detail::write_state(sys, fd.get(), detail::RegionState::kReady, a.path);
    out.mapping = std::move(mapping);
  } catch (...) {
    if (const int err = unlink_if_ours(sys, a.dirfd, a.name, st)) {
      log().error("region {}: could not remove it after a failed creation: {}", a.path, errno_name(err));
    }
    throw;
  }
  // Joiners see "ready" in the header already; dropping the creator lock only matters to those
  // deciding whether a "creating" header has a live creator, and close() drops it anyway.
  creator_lock.l_type = F_UNLCK;
  if (sys.fcntl_lock(sys.context, fd.get(), F_OFD_SETLK, &creator_lock) != 0) {
    log().warn("region {}: could not drop the creator lock ({}); it goes at close", a.path, errno_name(errno));
  }
  out.fd = std::move(fd);
  out.st = st;
  out.role = RegionRole::kCreator;
  return Step::kAttached;
}

// Whether the creator still holds its OFD lock on the header.
bool creator_alive(const Attempt& a, int fd) {
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = detail::kCreatorLockStart;
  probe.l_len = detail::kCreatorLockLen;
  if (a.sys.fcntl_lock(a.sys.context, fd, F_OFD_GETLK, &probe) != 0) {
    throw_system_error("fcntl", errno, "(F_OFD_GETLK) on the header of region " + a.path);
  }
  return probe.l_type != F_UNLCK;
}

// Validates a header against our geometry; throws kMismatch naming both values.
void check_header(const Attempt& a, const detail::RegionHeader& h) {
  const auto layout = detail::header_layout(h);
  if (!layout) {
    throw Error(ErrorCode::kMismatch, a.path + " is not a kvoffload region of format version " +
                                          std::to_string(detail::kRegionVersion) + " (bad magic or version " +
                                          std::to_string(h.version) + "); refused");
  }
  if (!(*layout == a.geometry.layout())) {
    throw Error(ErrorCode::kMismatch, "region " + a.path + " has geometry " + describe_layout(*layout) +
                                          " but this process expects " +
                                          describe_layout(a.geometry.layout()));
  }
  if (h.page_size != a.geometry.page_size() || h.row_stride != a.geometry.row_stride() ||
      h.data_bytes != a.geometry.data_bytes() ||
      h.data_offset != detail::data_offset_for(a.geometry.page_size())) {
    throw Error(ErrorCode::kMismatch,
                "region " + a.path + " was built with page size " + std::to_string(h.page_size) +
                    ", row stride " + std::to_string(h.row_stride) + " and data offset " +
                    std::to_string(h.data_offset) + "; this process computes " +
                    std::to_string(a.geometry.page_size()) + ", " + std::to_string(a.geometry.row_stride()) +
                    " and " + std::to_string(detail::data_offset_for(a.geometry.page_size())));
  }
}

// The joiner path (see Note [Region lifetime]).
Step try_join(Attempt& a, Attached& out) {
  const Syscalls& sys = a.sys;
  const int raw = detail::retry_eintr([&] {
    return sys.openat(sys.context, a.dirfd, a.name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  });
  if (raw < 0) {
    const int err = errno;
    if (err == ENOENT) return Step::kAbsent;
    if (err == ELOOP) {
      throw Error(ErrorCode::kPermission, a.path + " is a symbolic link; regions are never opened "
                                                  "through a link (O_NOFOLLOW). Remove it",
                  err, "open");
    }
    if (err == EACCES || err == EPERM) {
      throw Error(ErrorCode::kPermission, "open of region " + a.path + ": permission denied (" +
                                              errno_name(err) + "); it belongs to another user",
                  err, "open");
    }
    throw_system_error("open", err, "of region " + a.path);
  }
  detail::UniqueFd fd(sys, raw);
  struct stat st {};
  if (sys.fstat(sys.context, fd.get(), &st) != 0) throw_system_error("fstat", errno, "of region " + a.path);
  // Owner and mode before the stale test: root must never reclaim another user's idle file.
  detail::check_owner_and_mode(st, a.path);

  if (sys.flock(sys.context, fd.get(), LOCK_EX | LOCK_NB) == 0) {
    // No process holds the liveness lock: stale. Reclaim it and go around to create.
    log().warn("region {}: no process is attached (stale); reclaiming it", a.path);
    if (detail::path_names_inode(sys, a.dirfd, a.name, st) &&
        sys.unlinkat(sys.context, a.dirfd, a.name.c_str(), 0) != 0 && errno != ENOENT) {
      throw_system_error("unlinkat", errno, "of the stale region " + a.path);
    }
    return Step::kRetryNow;
  }
  if (errno != EWOULDBLOCK) throw_system_error("flock", errno, "(LOCK_EX|LOCK_NB) of region " + a.path);
  if (sys.flock(sys.context, fd.get(), LOCK_SH | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) throw_system_error("flock", errno, "(LOCK_SH) of region " + a.path);
    a.last_observed = "locked exclusively by another process (being removed)";
    return Step::kRetry;
  }
  if (!detail::path_names_inode(sys, a.dirfd, a.name, st)) {
    a.last_observed = "replaced while opening";
    return Step::kRetryNow;
  }

  detail::RegionHeader header{};
  bool checked = false;
  for (;;) {
    if (!detail::read_header(sys, fd.get(), header, a.path)) {
      throw Error(ErrorCode::kMismatch, a.path + " is shorter than a region header (" +
                                            std::to_string(sizeof header) +
                                            " bytes); it is not a kvoffload region");
    }
    if (!checked) {
      check_header(a, header);  // fail fast on a mismatch, even while the creator works
      checked = true;
    }
    if (header.state == static_cast<std::uint32_t>(detail::RegionState::kReady)) break;
    if (header.state != static_cast<std::uint32_t>(detail::RegionState::kCreating)) {
      throw Error(ErrorCode::kMismatch, "region " + a.path + " has an unknown state " +
                                            std::to_string(header.state) + "; expected 'ready'");
    }
    a.last_observed = "creating";
    if (!creator_alive(a, fd.get())) {
      // The state may have turned ready just before the creator dropped its lock.
      if (!detail::read_header(sys, fd.get(), header, a.path)) continue;
      if (header.state == static_cast<std::uint32_t>(detail::RegionState::kReady)) break;
      log().warn("region {}: its creator died during creation; starting over", a.path);
      a.last_observed = "creating, creator gone";
      return Step::kRetry;
    }
    if (Clock::now() >= a.deadline) throw_timeout(a);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  if (sys.fstat(sys.context, fd.get(), &st) != 0) throw_system_error("fstat", errno, "of region " + a.path);
  if (static_cast<std::uint64_t>(st.st_size) < a.file_bytes) {
    throw Error(ErrorCode::kMismatch, "region " + a.path + " is " + std::to_string(st.st_size) +
                                          " bytes, expected " + std::to_string(a.file_bytes));
  }
  void* addr = sys.mmap(sys.context, nullptr, a.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) {
    throw_system_error("mmap", errno, "of " + std::to_string(a.file_bytes) + " bytes of region " + a.path);
  }
  out.mapping = detail::Mapping(sys, addr, a.file_bytes);
  out.fd = std::move(fd);
  out.st = st;
  out.role = RegionRole::kJoiner;
  return Step::kAttached;
}

}  // namespace

struct Region::State {
  const Syscalls* sys = nullptr;
  std::string engine_id;
  std::filesystem::path path;
  std::string name;
  RegionGeometry geometry;
  RegionRole role = RegionRole::kJoiner;
  std::optional<std::uint32_t> rank;
  PopulateReport populate;
  detail::UniqueFd dir;
  detail::UniqueFd fd;
  detail::Mapping mapping;
  std::byte* data = nullptr;
  struct stat st {};
  std::vector<std::function<void()>> hooks;
  bool open = false;
};

Region Region::create_or_join(const RegionOptions& options) {
  const Syscalls& sys = options.syscalls != nullptr ? *options.syscalls : real_syscalls();
  // Everything the caller gave is checked before any file is touched.
  detail::validate_engine_id(options.engine_id);
  if (options.populate_threads == 0) throw_invalid("populate_threads is 0; it must be at least 1");
  if (options.join_timeout.count() < 0) {
    throw_invalid("join_timeout is " + std::to_string(options.join_timeout.count()) +
                  " ms; it must be >= 0");
  }
  const RegionGeometry geometry = RegionGeometry::compute(options.layout, platform::page_size());
  if (options.rank) (void)geometry.copy_index(*options.rank);
  const std::filesystem::path shm_dir = options.shm_dir.empty() ? default_shm_dir() : options.shm_dir;
  const std::filesystem::path path = region_path(shm_dir, options.engine_id);

  detail::UniqueFd dir(sys, detail::open_shm_dir(sys, shm_dir.string()));
  Attempt a{.sys = sys, .options = options, .geometry = geometry, .dir = shm_dir.string(),
            .name = path.filename().string(), .path = path.string(), .dirfd = dir.get(),
            .file_bytes = detail::data_offset_for(geometry.page_size()) + geometry.data_bytes(),
            .started = Clock::now(), .deadline = Clock::now() + options.join_timeout};

  Attached attached;
  for (;;) {
    Step step = try_join(a, attached);
    if (step == Step::kAbsent) step = try_create(a, attached);
    if (step == Step::kAttached) break;
    if (step == Step::kRetryNow || step == Step::kLostRace || step == Step::kAbsent) continue;
    if (Clock::now() >= a.deadline) throw_timeout(a);
    backoff();
  }

  auto state = std::make_unique<State>();
  state->sys = &sys;
  state->engine_id = options.engine_id;
  state->path = path;
  state->name = a.name;
  state->geometry = geometry;
  state->role = attached.role;
  state->rank = options.rank;
  state->dir = std::move(dir);
  state->fd = std::move(attached.fd);
  state->mapping = std::move(attached.mapping);
  state->data = state->mapping.data() + detail::data_offset_for(geometry.page_size());
  state->st = attached.st;
  state->open = true;
  Region region(std::move(state));
  log().info("region {}: {} ({} bytes, {} chunks x {} row stride)", a.path,
             region.role() == RegionRole::kCreator ? "created" : "joined", a.file_bytes,
             geometry.num_chunks(), geometry.row_stride());

  if (options.populate) {
    // A failure here goes through the normal teardown (other processes may be attached already),
    // and the caller sees the populate error.
    const detail::PopulatePlan plan(geometry, region.data(), options.rank);
    region.state_->populate =
        detail::populate(sys, plan, geometry.page_size(), options.populate_threads, "region " + a.path);
  }
  return region;
}

Region::Region(std::unique_ptr<State> state) : state_(std::move(state)) {}
Region::Region(Region&& other) noexcept = default;
Region& Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    close();
    state_ = std::move(other.state_);
  }
  return *this;
}
Region::~Region() { close(); }

const RegionGeometry& Region::geometry() const noexcept { return state_->geometry; }
RegionRole Region::role() const noexcept { return state_->role; }
const std::filesystem::path& Region::path() const noexcept { return state_->path; }
const std::string& Region::engine_id() const noexcept { return state_->engine_id; }
std::optional<std::uint32_t> Region::rank() const noexcept { return state_->rank; }
const PopulateReport& Region::populate_report() const noexcept { return state_->populate; }
bool Region::is_open() const noexcept { return state_ != nullptr && state_->open; }
std::byte* Region::data() const noexcept { return is_open() ? state_->data : nullptr; }

std::span<std::byte> Region::slot(std::uint64_t chunk, std::uint32_t rank) const {
  if (!is_open()) throw Error(ErrorCode::kState, "slot() on a closed region");
  return {state_->data + state_->geometry.slot_offset(chunk, rank), state_->geometry.slot_bytes()};
}

std::span<std::byte> Region::slot(std::uint64_t chunk) const {
  if (!is_open()) throw Error(ErrorCode::kState, "slot() on a closed region");
  if (!state_->rank) {
    throw Error(ErrorCode::kState, "slot(chunk) needs a rank; region " + state_->path.string() +
                                       " was mapped unranked (use slot(chunk, rank))");
  }
  return slot(chunk, *state_->rank);
}

std::span<std::byte> Region::row(std::uint64_t chunk) const {
  if (!is_open()) throw Error(ErrorCode::kState, "row() on a closed region");
  const RegionGeometry& g = state_->geometry;
  if (chunk >= g.num_chunks()) {
    throw_invalid("chunk " + std::to_string(chunk) + " is out of range: the region has " +
                  std::to_string(g.num_chunks()) + " chunks, so chunk must be 0.." +
                  std::to_string(g.num_chunks() - 1));
  }
  return {state_->data + chunk * g.row_stride(), static_cast<std::size_t>(g.row_stride())};
}

void Region::add_teardown_hook(std::function<void()> hook) {
  if (!is_open()) throw Error(ErrorCode::kState, "add_teardown_hook() on a closed region");
  state_->hooks.push_back(std::move(hook));
}

bool Region::close() noexcept {
  if (!is_open()) return true;
  State& s = *state_;
  s.open = false;
  const std::string path = s.path.string();
  bool ok = true;
  // Teardown keeps going: every step runs whatever the previous one did; the first error wins
  // the log line, the return value says something failed.
  auto failed = [&](const char* step, const std::string& why) {
    log().error("region {}: teardown step {} failed: {}", path, step, why);
    ok = false;
  };
  for (auto it = s.hooks.rbegin(); it != s.hooks.rend(); ++it) {
    try {
      (*it)();
    } catch (const std::exception& e) {
      failed("teardown hook", e.what());
    } catch (...) {
      failed("teardown hook", "unknown exception");
    }
  }
  s.hooks.clear();
  s.data = nullptr;
  if (const int err = s.mapping.reset()) failed("munmap", errno_name(err));

  // "Am I the last one?" can only be asked on the way out (Note [Region lifetime]).
  const Syscalls& sys = *s.sys;
  if (sys.flock(sys.context, s.fd.get(), LOCK_EX | LOCK_NB) == 0) {
    if (const int err = unlink_if_ours(sys, s.dir.get(), s.name, s.st)) failed("unlink", errno_name(err));
  } else if (errno != EWOULDBLOCK) {
    failed("flock", errno_name(errno) + " (the file stays; it is stale and `region clean` removes it)");
  }
  if (const int err = s.fd.reset()) failed("close", errno_name(err));
  if (const int err = s.dir.reset()) failed("close (shm dir)", errno_name(err));
  return ok;
}

}  // namespace kvoffload
