#include "kvoffload/region.hpp"

#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "kvoffload/error.hpp"
#include "kvoffload/log.hpp"
#include "kvoffload/platform.hpp"
#include "kvoffload/syscalls.hpp"
#include "region/header.hpp"
#include "region/owners.hpp"
#include "region/populate.hpp"
#include "region/region_internal.hpp"
#include "region/sys.hpp"
#include "region/live_page.hpp"
#include "util/clock.hpp"

// Note [Region lifetime]
// ~~~~~~~~~~~~~~~~~~~~~~
// Creation. Every caller first tries to open an existing file at the path. When there is none it
// becomes a candidate creator: it checks capacity (statvfs free space, or the memory cgroup when
// that is lower) while nothing is visible, builds an unnamed file with O_TMPFILE, takes the shared
// liveness flock and an OFD write lock on the header ("creator alive"), writes the header with
// state "creating", sizes the file (sparse ftruncate, so no stub of the wrong size is ever
// visible), and publishes it with linkat. linkat is the election: exactly one candidate wins; the
// losers drop their unnamed file (nothing was allocated) and join. The winner maps, sets the state
// to "ready" and drops the OFD lock. Nobody allocates the whole file: every mapper allocates the
// pages it populates, in parallel with the other ranks (Note [Allocation by populate] in
// populate.hpp). A candidate whose capacity check fails looks at the path once more before it
// reports the shortfall: a winner may have published (and its ranks allocated) between our "no
// file" and our statvfs, and then the region exists and we join it instead of failing.
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
// Roles. The creator takes its role (its rank slot, or the scheduler role) before linkat, a joiner
// once the region is ready, before it maps; a refused joiner leaves like close() does (Note
// [Owners] in owners.hpp).
//
// Teardown. Hooks (host unregister), munmap, release of the role, then "am I the last one?": a
// non-blocking conversion
// LOCK_SH -> LOCK_EX. Success means no one else is attached: unlink if the path still names our
// inode. Failure drops our shared lock (that is how flock conversion works), which is fine on the
// way out and is why the question can only be asked here. Then close.

// Note [Progressive bring-up]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A ranked mapper brings its slots up in pieces of max(1, bringup_piece_bytes / row_stride) rows:
// allocate + populate the piece's ranges (Note [Allocation by populate]), hand the piece to
// on_piece_ready (a GPU rank registers it there, so no single driver call covers more than a
// piece), then publish it: the rank's entry in the readiness table after the header (one
// RankReadiness per rank, in the shared mapping, written with release stores and read with
// acquire loads) advances its ready prefix. Pieces go in row order, so "rows [0, n) are ready on
// rank r" is one number per rank, and the rows ready on every rank are the minimum of those
// numbers (chunks_ready_on_all_ranks). The scheduler feeds that minimum to the Manager
// (Manager::set_ready_chunks), which hands out only slots of ready rows: before a row is ready on
// every rank a lookup of its keys misses and a store that finds no ready room is skipped;
// neither blocks.
// kBlocking runs the pieces in create_or_join and throws the first failure (the Region is then
// closed like any failed creation). kBackground runs them on one thread per mapper (each piece
// still populates with populate_threads threads) and turns a failure into state kFailed with the
// Error kept for bringup_status() / wait_bringup() and the errno in the rank's table entry: the
// rows made ready before it stay usable, nothing crashes. close() stops the thread between pieces
// and joins it before the teardown hooks, and marks the rank stopped (ready prefix 0: a detached
// rank serves nothing). A rank killed mid-way leaves its entry "running" with the prefix it
// reached; its liveness lock is gone, so the region is reclaimed as stale once everyone left.
// An unranked mapper (the scheduler) has no entry: in background mode it populates nothing and
// touches only rows every rank made ready; in blocking mode it populates the whole region.

namespace kvoffload {

std::string_view to_string(BringupMode m) noexcept {
  return m == BringupMode::kBlocking ? "blocking" : "background";
}

std::string_view to_string(BringupState s) noexcept {
  switch (s) {
    case BringupState::kPending:
      return "pending";
    case BringupState::kRunning:
      return "running";
    case BringupState::kReady:
      return "ready";
    case BringupState::kFailed:
      return "failed";
    case BringupState::kStopped:
      return "stopped";
  }
  return "unknown";
}

BringupMode parse_bringup_mode(std::string_view name) {
  if (name == "blocking") return BringupMode::kBlocking;
  if (name == "background") return BringupMode::kBackground;
  throw_invalid("bring-up mode '" + std::string(name) +
                "' is unknown; use 'background' or 'blocking'");
}

std::string_view to_string(RegionRole role) noexcept {
  return role == RegionRole::kCreator ? "creator" : "joiner";
}

std::string_view to_string(PopulateMethod m) noexcept {
  switch (m) {
    case PopulateMethod::kMadvise:
      return "madvise";
    case PopulateMethod::kFallback:
      return "fallback";
    case PopulateMethod::kNone:
      return "none";
  }
  return "none";
}

std::filesystem::path default_shm_dir() {
  if (const char* env = std::getenv("KVOFFLOAD_SHM_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return "/dev/shm";
}

std::filesystem::path region_path(const std::filesystem::path& shm_dir,
                                  const std::string& engine_id) {
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
    throw Error(
        ErrorCode::kPermission,
        path + " has mode " + mode + ", wider than the 0600 regions are created with; refused");
  }
}

bool path_names_inode(const Syscalls& sys, int dirfd, const std::string& name,
                      const struct stat& held) {
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
  return "{num_chunks=" + std::to_string(l.num_chunks) +
         ", slot_bytes=" + std::to_string(l.slot_bytes) +
         ", world_size=" + std::to_string(l.world_size) +
         ", replicated=" + (l.replicated ? "true" : "false") +
         ", slot_align=" + std::to_string(l.slot_align) + "}";
}

using util::seconds_since;

// A short randomised pause between attempts, so that processes racing over a stale file do not
// retry in lock step.
void backoff() {
  thread_local std::minstd_rand rng(
      static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
                            static_cast<unsigned>(::getpid())));
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
    throw_system_error("fstatvfs", errno,
                       "of " + a.dir + " (checking space for region " + a.path + ")");
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
      "not enough shared memory for region " + a.path + ": it needs " +
          std::to_string(a.file_bytes) + " bytes but " + std::to_string(available) +
          " bytes are available (checked against the " + source +
          "). The size comes from num_chunks=" + std::to_string(g.num_chunks()) + " x row_stride=" +
          std::to_string(g.row_stride()) + " (slot_bytes=" + std::to_string(g.slot_bytes()) +
          " x " + copies + ", rounded up to the " + std::to_string(g.page_size()) +
          "-byte page) plus a " + std::to_string(a.file_bytes - g.data_bytes()) +
          "-byte header. Fixes: give the container a larger shm (docker run --shm-size=...), "
          "share the host's (--ipc=host), or ask for a smaller region (fewer chunks or smaller "
          "slots)");
}

// Unlinks `name` only when it still names the inode we hold; returns errno of the failed step.
int unlink_if_ours(const Syscalls& sys, int dirfd, const std::string& name,
                   const struct stat& st) noexcept {
  try {
    if (!detail::path_names_inode(sys, dirfd, name, st)) return 0;
  } catch (const Error& e) {
    return e.sys_errno();
  }
  if (sys.unlinkat(sys.context, dirfd, name.c_str(), 0) != 0 && errno != ENOENT) return errno;
  return 0;
}

// "Am I the last one?", asked on the way out only (Note [Region lifetime]): unlinks the file when
// no other process holds the liveness lock. Returns "" or what failed.
std::string unlink_if_last(const Syscalls& sys, int fd, int dirfd, const std::string& name,
                           const struct stat& st) noexcept {
  if (sys.flock(sys.context, fd, LOCK_EX | LOCK_NB) == 0) {
    if (const int err = unlink_if_ours(sys, dirfd, name, st)) return "unlink: " + errno_name(err);
  } else if (errno != EWOULDBLOCK) {
    return "flock: " + errno_name(errno) +
           " (the file stays; it is stale and `region clean` removes it)";
  }
  return {};
}

detail::Role role_of(const Attempt& a) {
  return {.world_size = a.geometry.world_size(), .rank = a.options.rank};
}

// The creator path (see Note [Region lifetime]). Returns kAttached with `out` filled, or kLostRace
// when another process published first. Throws on failure, leaving nothing behind.
Step try_create(Attempt& a, Attached& out) {
  const Syscalls& sys = a.sys;
  try {
    check_capacity(a);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCapacity) throw;
    // The space may be gone because a winner published and allocated after we saw no file.
    struct stat now {};
    if (sys.fstatat(sys.context, a.dirfd, a.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0) {
      log().info(
          "region {}: capacity check failed, but another process created the region "
          "meanwhile; joining it",
          a.path);
      return Step::kLostRace;
    }
    throw;
  }

  const int raw = detail::retry_eintr(
      [&] { return sys.openat(sys.context, a.dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600); });
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
  if (detail::retry_eintr(
          [&] { return sys.fcntl_lock(sys.context, fd.get(), F_OFD_SETLK, &creator_lock); }) != 0) {
    throw_system_error("fcntl", errno, "(F_OFD_SETLK) on the header of the new region " + a.path);
  }
  detail::write_header(sys, fd.get(), detail::make_header(a.geometry, a.options.engine_id), a.path);
  // Nobody else can open the unnamed file: the creator always gets its own role (Note [Owners]).
  if (detail::claim_role(sys, fd.get(), role_of(a), a.path)) {
    throw Error(ErrorCode::kInternal, "region " + a.path + ": " + role_of(a).name() +
                                          " of the unnamed new file is held by another process");
  }
  // Sparse: the pages are allocated by the mappers that populate them (Note [Allocation by
  // populate]); the size is set before publication so a joiner never sees a short file.
  if (detail::retry_eintr([&] {
        return sys.ftruncate(sys.context, fd.get(), static_cast<off_t>(a.file_bytes));
      }) != 0) {
    throw_system_error("ftruncate", errno,
                       "to " + std::to_string(a.file_bytes) + " bytes of the new region " + a.path);
  }
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
    void* addr = sys.mmap(sys.context, nullptr, a.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                          fd.get(), 0);
    if (addr == MAP_FAILED) {
      throw_system_error("mmap", errno,
                         "of " + std::to_string(a.file_bytes) + " bytes of region " + a.path);
    }
    detail::Mapping mapping(sys, addr, a.file_bytes);
    detail::write_state(sys, fd.get(), detail::RegionState::kReady, a.path);
    out.mapping = std::move(mapping);
  } catch (...) {
    if (const int err = unlink_if_ours(sys, a.dirfd, a.name, st)) {
      log().error("region {}: could not remove it after a failed creation: {}", a.path,
                  errno_name(err));
    }
    throw;
  }
  // Joiners see "ready" in the header already; dropping the creator lock only matters to those
  // deciding whether a "creating" header has a live creator, and close() drops it anyway.
  creator_lock.l_type = F_UNLCK;
  if (sys.fcntl_lock(sys.context, fd.get(), F_OFD_SETLK, &creator_lock) != 0) {
    log().warn("region {}: could not drop the creator lock ({}); it goes at close", a.path,
               errno_name(errno));
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
  if (layout && layout->slot_align != a.geometry.slot_align()) {
    throw Error(
        ErrorCode::kMismatch,
        "region " + a.path + " was created with slot_align=" + std::to_string(layout->slot_align) +
            " but this process asks for slot_align=" + std::to_string(a.geometry.slot_align()) +
            "; every rank must use the same slot alignment");
  }
  if (!layout) {
    throw Error(ErrorCode::kMismatch, a.path + " is not a kvoffload region of format version " +
                                          std::to_string(detail::kRegionVersion) +
                                          " (bad magic or version " + std::to_string(h.version) +
                                          "); refused");
  }
  if (!(*layout == a.geometry.layout())) {
    throw Error(ErrorCode::kMismatch, "region " + a.path + " has geometry " +
                                          describe_layout(*layout) + " but this process expects " +
                                          describe_layout(a.geometry.layout()));
  }
  if (h.page_size != a.geometry.page_size() || h.row_stride != a.geometry.row_stride() ||
      h.data_bytes != a.geometry.data_bytes() ||
      h.data_offset != detail::data_offset_for(a.geometry.page_size(), a.geometry.world_size()) ||
      h.readiness_offset != detail::kReadinessOffset ||
      h.owners_offset != detail::owners_offset_for(a.geometry.world_size()) ||
      h.stats_offset != detail::stats_offset_for(a.geometry.page_size(), a.geometry.world_size()) ||
      h.stats_bytes != detail::stats_bytes_for(a.geometry.page_size(), a.geometry.world_size())) {
    throw Error(ErrorCode::kMismatch,
                "region " + a.path + " was built with page size " + std::to_string(h.page_size) +
                    ", row stride " + std::to_string(h.row_stride) + " and data offset " +
                    std::to_string(h.data_offset) + "; this process computes " +
                    std::to_string(a.geometry.page_size()) + ", " +
                    std::to_string(a.geometry.row_stride()) + " and " +
                    std::to_string(
                        detail::data_offset_for(a.geometry.page_size(), a.geometry.world_size())));
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
      throw Error(ErrorCode::kPermission,
                  a.path +
                      " is a symbolic link; regions are never opened "
                      "through a link (O_NOFOLLOW). Remove it",
                  err, "open");
    }
    if (err == EACCES || err == EPERM) {
      throw Error(ErrorCode::kPermission,
                  "open of region " + a.path + ": permission denied (" + errno_name(err) +
                      "); it belongs to another user",
                  err, "open");
    }
    throw_system_error("open", err, "of region " + a.path);
  }
  detail::UniqueFd fd(sys, raw);
  struct stat st {};
  if (sys.fstat(sys.context, fd.get(), &st) != 0)
    throw_system_error("fstat", errno, "of region " + a.path);
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
  if (errno != EWOULDBLOCK)
    throw_system_error("flock", errno, "(LOCK_EX|LOCK_NB) of region " + a.path);
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

  if (sys.fstat(sys.context, fd.get(), &st) != 0)
    throw_system_error("fstat", errno, "of region " + a.path);
  if (static_cast<std::uint64_t>(st.st_size) < a.file_bytes) {
    throw Error(ErrorCode::kMismatch, "region " + a.path + " is " + std::to_string(st.st_size) +
                                          " bytes, expected " + std::to_string(a.file_bytes));
  }
  if (const auto holder = detail::claim_role(sys, fd.get(), role_of(a), a.path)) {
    Error refused = detail::role_taken(a.path, a.options.engine_id, role_of(a), *holder);
    // We hold the liveness lock: leave as close() does, in case the holder left meanwhile.
    if (const std::string failed = unlink_if_last(sys, fd.get(), a.dirfd, a.name, st);
        !failed.empty()) {
      log().error("region {}: leaving after a refused claim: {}", a.path, failed);
    }
    throw refused;
  }
  void* addr =
      sys.mmap(sys.context, nullptr, a.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) {
    throw_system_error("mmap", errno,
                       "of " + std::to_string(a.file_bytes) + " bytes of region " + a.path);
  }
  out.mapping = detail::Mapping(sys, addr, a.file_bytes);
  out.fd = std::move(fd);
  out.st = st;
  out.role = RegionRole::kJoiner;
  return Step::kAttached;
}

}  // namespace

struct Region::State {
  ~State() {
    // A Region whose create_or_join threw after starting nothing has no thread; a moved-from or
    // closed one has joined it. This is the last line of defence, never the normal path.
    if (bringup_thread.joinable()) {
      stop.store(true);
      bringup_thread.join();
    }
  }
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

  // Bring-up (Note [Progressive bring-up]).
  std::string shm_dir;
  bool populate_pages = true;
  unsigned populate_threads = 1;
  std::uint64_t piece_rows = 1;
  std::function<void(std::span<std::byte>, std::uint64_t, std::uint64_t)> on_piece_ready;
  detail::RankReadiness* table = nullptr;  // in the mapping, one entry per rank
  detail::LivePage* live = nullptr;        // in the mapping (Note [Live stats])
  std::chrono::steady_clock::time_point started;
  std::thread bringup_thread;
  std::atomic<bool> stop{false};
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  BringupStatus bringup;  // under mu
};

namespace {

std::atomic_ref<std::uint32_t> table_state(detail::RankReadiness& e) {
  return std::atomic_ref(e.state);
}
std::atomic_ref<std::uint32_t> table_errno(detail::RankReadiness& e) {
  return std::atomic_ref(e.sys_errno);
}
std::atomic_ref<std::uint64_t> table_ready(detail::RankReadiness& e) {
  return std::atomic_ref(e.ready_chunks);
}

}  // namespace

// The pieces of a ranked mapper (Note [Progressive bring-up]). Throws the first failure after
// recording it in the status and the rank's table entry.
void Region::run_bringup(State& s) {
  const RegionGeometry& g = s.geometry;
  const std::uint32_t rank = *s.rank;
  detail::RankReadiness& entry = s.table[rank];
  // This thread is the only writer of the rank's bring-up block (Note [Live stats]).
  detail::RankBringupBlock& live = s.live->ranks()[rank].bringup;
  std::uint64_t live_bytes = 0;
  std::uint64_t live_pieces = 0;
  auto publish_progress = [&] {
    const detail::LiveWrite write(live.seq);
    detail::LiveWrite::put(live.populated_bytes, live_bytes);
    detail::LiveWrite::put(live.pieces, live_pieces);
    detail::LiveWrite::put(
        live.elapsed_ns,
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - s.started)
                                       .count()));
  };
  publish_progress();
  table_ready(entry).store(0, std::memory_order_release);
  table_errno(entry).store(0, std::memory_order_relaxed);
  table_state(entry).store(static_cast<std::uint32_t>(BringupState::kRunning),
                           std::memory_order_release);
  const Syscalls& sys = *s.sys;
  const std::string what = "region " + s.path.string();
  const detail::PopulatePlan plan(g, s.data, s.rank);
  const detail::BackingFile file{
      .fd = s.fd.get(), .file_base = s.mapping.data(), .dirfd = s.dir.get(), .dir = s.shm_dir};
  auto finish = [&](BringupState state, std::optional<Error> error, std::uint64_t failed_chunk) {
    publish_progress();
    if (error)
      table_errno(entry).store(static_cast<std::uint32_t>(error->sys_errno()),
                               std::memory_order_relaxed);
    if (state == BringupState::kStopped) table_ready(entry).store(0, std::memory_order_release);
    table_state(entry).store(static_cast<std::uint32_t>(state), std::memory_order_release);
    const std::lock_guard lock(s.mu);
    s.bringup.state = state;
    s.bringup.error = std::move(error);
    s.bringup.failed_chunk = failed_chunk;
    s.bringup.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
    s.cv.notify_all();
  };
  std::uint64_t first = 0;
  try {
    for (; first < g.num_chunks(); first += s.piece_rows) {
      if (s.stop.load(std::memory_order_relaxed)) {
        finish(BringupState::kStopped, std::nullopt, first);
        return;
      }
      const std::uint64_t rows = std::min(s.piece_rows, g.num_chunks() - first);
      const detail::PopulatePlan piece = plan.rows(first, rows);
      if (s.populate_pages) {
        const PopulateReport r =
            detail::populate(sys, piece, g.page_size(), s.populate_threads, what, file);
        live_bytes += r.bytes;
        const std::lock_guard lock(s.mu);
        s.populate.method = r.method;
        s.populate.bytes += r.bytes;
        s.populate.seconds += r.seconds;
      } else {
        detail::allocate(sys, piece, file, what);
      }
      if (s.on_piece_ready) {
        s.on_piece_ready(
            {s.data + first * g.row_stride(), static_cast<std::size_t>(rows * g.row_stride())},
            first, rows);
      }
      table_ready(entry).store(first + rows, std::memory_order_release);
      ++live_pieces;
      publish_progress();
      const std::lock_guard lock(s.mu);
      s.bringup.ready_chunks = first + rows;
    }
  } catch (const Error& e) {
    log().error("{}: bring-up of rank {} failed at chunks [{}, {}): {}", what, rank, first,
                std::min(first + s.piece_rows, g.num_chunks()), e.what());
    finish(BringupState::kFailed, e, first);
    throw;
  } catch (const std::exception& e) {
    Error wrapped(ErrorCode::kInternal, what + ": bring-up of rank " + std::to_string(rank) +
                                            " failed at chunk " + std::to_string(first) + ": " +
                                            e.what());
    log().error("{}", wrapped.what());
    finish(BringupState::kFailed, wrapped, first);
    throw wrapped;
  }
  finish(BringupState::kReady, std::nullopt, 0);
}

Region Region::create_or_join(const RegionOptions& options) {
  const Syscalls& sys = options.syscalls != nullptr ? *options.syscalls : real_syscalls();
  // Everything the caller gave is checked before any file is touched.
  detail::validate_engine_id(options.engine_id);
  if (options.populate_threads == 0) throw_invalid("populate_threads is 0; it must be at least 1");
  if (options.bringup_piece_bytes == 0) {
    throw_invalid("bringup_piece_bytes is 0; it must be at least 1 (default " +
                  std::to_string(kDefaultBringupPieceBytes) + ")");
  }
  if (options.bringup != BringupMode::kBlocking && options.bringup != BringupMode::kBackground) {
    throw_invalid("bringup mode " + std::to_string(static_cast<int>(options.bringup)) +
                  " is unknown");
  }
  if (options.join_timeout.count() < 0) {
    throw_invalid("join_timeout is " + std::to_string(options.join_timeout.count()) +
                  " ms; it must be >= 0");
  }
  const RegionGeometry geometry = RegionGeometry::compute(options.layout, platform::page_size());
  if (options.rank) (void)geometry.copy_index(*options.rank);
  const std::filesystem::path shm_dir =
      options.shm_dir.empty() ? default_shm_dir() : options.shm_dir;
  const std::filesystem::path path = region_path(shm_dir, options.engine_id);

  detail::UniqueFd dir(sys, detail::open_shm_dir(sys, shm_dir.string()));
  Attempt a{.sys = sys,
            .options = options,
            .geometry = geometry,
            .dir = shm_dir.string(),
            .name = path.filename().string(),
            .path = path.string(),
            .dirfd = dir.get(),
            .file_bytes = detail::data_offset_for(geometry.page_size(), geometry.world_size()) +
                          geometry.data_bytes(),
            .started = Clock::now(),
            .deadline = Clock::now() + options.join_timeout};

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
  state->data =
      state->mapping.data() + detail::data_offset_for(geometry.page_size(), geometry.world_size());
  state->table =
      reinterpret_cast<detail::RankReadiness*>(state->mapping.data() + detail::kReadinessOffset);
  state->live = reinterpret_cast<detail::LivePage*>(
      state->mapping.data() +
      detail::stats_offset_for(geometry.page_size(), geometry.world_size()));
  state->st = attached.st;
  state->open = true;
  state->shm_dir = shm_dir.string();
  state->populate_pages = options.populate;
  state->populate_threads = options.populate_threads;
  state->piece_rows =
      std::max<std::uint64_t>(1, options.bringup_piece_bytes / geometry.row_stride());
  state->on_piece_ready = options.on_piece_ready;
  state->started = a.started;
  state->bringup.num_chunks = geometry.num_chunks();
  Region region(std::move(state));
  log().info("region {}: {} ({} bytes, {} chunks x {} row stride)", a.path,
             region.role() == RegionRole::kCreator ? "created" : "joined", a.file_bytes,
             geometry.num_chunks(), geometry.row_stride());

  // A failure here goes through the normal teardown (other processes may be attached already),
  // and the caller sees the populate (or allocation) error.
  State& s = *region.state_;
  if (options.rank) {
    if (options.bringup == BringupMode::kBlocking) {
      run_bringup(s);
    } else {
      s.bringup.state = BringupState::kRunning;
      s.bringup_thread = std::thread([&s] {
        try {
          run_bringup(s);
        } catch (...) {
          // Recorded in the status and the table by run_bringup (Note [Progressive bring-up]).
        }
      });
    }
    return region;
  }
  // Unranked: everything in blocking mode, nothing in background mode.
  if (options.bringup == BringupMode::kBlocking) {
    const detail::PopulatePlan plan(geometry, region.data(), std::nullopt);
    const detail::BackingFile file{
        .fd = s.fd.get(), .file_base = s.mapping.data(), .dirfd = s.dir.get(), .dir = s.shm_dir};
    if (options.populate) {
      s.populate = detail::populate(sys, plan, geometry.page_size(), options.populate_threads,
                                    "region " + a.path, file);
    } else {
      // Not pre-faulted, but allocated: a later first touch must never meet a full tmpfs.
      detail::allocate(sys, plan, file, "region " + a.path);
    }
    s.bringup.ready_chunks = geometry.num_chunks();
  }
  s.bringup.state = BringupState::kReady;
  s.bringup.seconds = seconds_since(a.started);
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
Region::~Region() {
  close();
}

const RegionGeometry& Region::geometry() const noexcept {
  return state_->geometry;
}
RegionRole Region::role() const noexcept {
  return state_->role;
}
const std::filesystem::path& Region::path() const noexcept {
  return state_->path;
}
const std::string& Region::engine_id() const noexcept {
  return state_->engine_id;
}
std::optional<std::uint32_t> Region::rank() const noexcept {
  return state_->rank;
}
PopulateReport Region::populate_report() const {
  const std::lock_guard lock(state_->mu);
  return state_->populate;
}

BringupStatus Region::bringup_status() const {
  const std::lock_guard lock(state_->mu);
  return state_->bringup;
}

void Region::wait_bringup() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->bringup.state != BringupState::kRunning; });
  if (state_->bringup.state == BringupState::kFailed && state_->bringup.error)
    throw *state_->bringup.error;
  if (state_->bringup.state == BringupState::kStopped) {
    throw Error(ErrorCode::kState, "region " + state_->path.string() +
                                       ": bring-up was stopped by close() before it finished");
  }
}

RankBringup Region::rank_bringup(std::uint32_t rank) const {
  if (!is_open()) throw Error(ErrorCode::kState, "rank_bringup() on a closed region");
  (void)state_->geometry.copy_index(rank);  // validates the rank
  detail::RankReadiness& e = state_->table[rank];
  RankBringup r;
  r.state = static_cast<BringupState>(table_state(e).load(std::memory_order_acquire));
  r.ready_chunks = table_ready(e).load(std::memory_order_acquire);
  r.sys_errno = static_cast<int>(table_errno(e).load(std::memory_order_relaxed));
  return r;
}

std::uint64_t Region::chunks_ready_on_all_ranks() const {
  if (!is_open()) throw Error(ErrorCode::kState, "chunks_ready_on_all_ranks() on a closed region");
  const RegionGeometry& g = state_->geometry;
  std::uint64_t ready = g.num_chunks();
  for (std::uint32_t r = 0; r < g.world_size(); ++r) {
    // A value past num_chunks can only come from a corrupt table; never hand out such rows.
    ready = std::min(ready, table_ready(state_->table[r]).load(std::memory_order_acquire));
  }
  return ready;
}
bool Region::is_open() const noexcept {
  return state_ != nullptr && state_->open;
}
std::byte* Region::data() const noexcept {
  return is_open() ? state_->data : nullptr;
}
detail::LivePage* Region::live_page() const noexcept {
  return is_open() ? state_->live : nullptr;
}

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
  // The bring-up thread first: it may be registering a piece, and the hooks below unregister.
  if (s.bringup_thread.joinable()) {
    s.stop.store(true);
    s.bringup_thread.join();
  }
  if (s.rank && s.table != nullptr) {
    // A detached rank serves nothing: its entry says so (Note [Progressive bring-up]).
    detail::RankReadiness& entry = s.table[*s.rank];
    table_ready(entry).store(0, std::memory_order_release);
    // A failure stays visible (with its errno) to the processes still attached.
    const auto failed = static_cast<std::uint32_t>(BringupState::kFailed);
    if (table_state(entry).load(std::memory_order_acquire) != failed) {
      table_state(entry).store(static_cast<std::uint32_t>(BringupState::kStopped),
                               std::memory_order_release);
    }
  }
  s.open = false;
  const std::string path = s.path.string();
  bool ok = true;
  // Teardown keeps going: every step runs whatever the previous one did; the first error wins
  // the log line, the return value says something failed.
  auto failed = [&](std::string_view step, const std::string& why) {
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
  s.live = nullptr;
  if (const int err = s.mapping.reset()) failed("munmap", errno_name(err));

  // Nothing of ours touches the slots any more: the next holder may take the role (Note [Owners]).
  const Syscalls& sys = *s.sys;
  const detail::Role role{.world_size = s.geometry.world_size(), .rank = s.rank};
  if (const int err = detail::release_role(sys, s.fd.get(), role)) {
    failed("release of " + role.name(), errno_name(err) + " (it goes when the file closes)");
  }
  if (std::string why = unlink_if_last(sys, s.fd.get(), s.dir.get(), s.name, s.st); !why.empty())
    failed("last-out", why);
  if (const int err = s.fd.reset()) failed("close", errno_name(err));
  if (const int err = s.dir.reset()) failed("close (shm dir)", errno_name(err));
  return ok;
}

}  // namespace kvoffload
