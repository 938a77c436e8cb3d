// The create-join protocol (Note [Region lifetime]): one attempt at joining the file at the path,
// one at creating and publishing it when there is none, and the loop that goes around until this
// process is attached, reclaiming a stale file or starting over after a dead creator on the way.

#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "region/header.hpp"
#include "region/owners.hpp"
#include "region/ownership.hpp"
#include "region/region_internal.hpp"
#include "sys/sys.hpp"
#include "sys/syscalls.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

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

namespace kvoffload {

std::string_view to_string(RegionRole role) noexcept {
  return role == RegionRole::kCreator ? "creator" : "joiner";
}

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
using util::seconds_since;

// A short randomised pause between attempts, so that processes racing over a stale file do not
// retry in lock step.
void backoff() {
  thread_local std::minstd_rand rng(
      static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
                            static_cast<unsigned>(::getpid())));
  std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 2000));
}

// What an attempt produced: an attached descriptor (holding LOCK_SH) or a reason to go around.
enum class Step { kAttached, kAbsent, kRetry, kRetryNow, kLostRace };

[[noreturn]] void throw_timeout(const Attempt& a) {
  char secs[32];
  (void)std::snprintf(secs, sizeof secs, "%.3f", seconds_since(a.started));
  throw Error(ErrorCode::kTimeout,
              "timed out joining region " + a.path + " after " + secs +
                  " s (join_timeout): expected state 'ready', observed '" + a.last_observed +
                  "'. The creating process is still working or is stuck; raise the join timeout "
                  "or check that process");
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

// Opens an existing region file (never through a link): its descriptor, or -1 when there is none.
int open_existing(const Attempt& a) {
  const Syscalls& sys = a.sys;
  const int raw = detail::retry_eintr([&] {
    return sys.openat(sys.context, a.dirfd, a.name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  });
  if (raw < 0) {
    const int err = errno;
    if (err == ENOENT) return -1;
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
  return raw;
}

// Waits while the creator works: true once the header says ready, false when the creator died
// before (start over). Checks the header on its first read, so a mismatch fails fast.
bool wait_until_ready(Attempt& a, int fd) {
  const Syscalls& sys = a.sys;
  detail::RegionHeader header{};
  bool checked = false;
  for (;;) {
    if (!detail::read_header(sys, fd, header, a.path)) {
      throw Error(ErrorCode::kMismatch, a.path + " is shorter than a region header (" +
                                            std::to_string(sizeof header) +
                                            " bytes); it is not a kvoffload region");
    }
    if (!checked) {
      check_header(a, header);  // fail fast on a mismatch, even while the creator works
      checked = true;
    }
    if (header.state == static_cast<std::uint32_t>(detail::RegionState::kReady)) return true;
    if (header.state != static_cast<std::uint32_t>(detail::RegionState::kCreating)) {
      throw Error(ErrorCode::kMismatch, "region " + a.path + " has an unknown state " +
                                            std::to_string(header.state) + "; expected 'ready'");
    }
    a.last_observed = "creating";
    if (!creator_alive(a, fd)) {
      // The state may have turned ready just before the creator dropped its lock.
      if (!detail::read_header(sys, fd, header, a.path)) continue;
      if (header.state == static_cast<std::uint32_t>(detail::RegionState::kReady)) return true;
      log().warn("region {}: its creator died during creation; starting over", a.path);
      a.last_observed = "creating, creator gone";
      return false;
    }
    if (Clock::now() >= a.deadline) throw_timeout(a);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// The joiner's last steps on a ready region: its size, its role claimed, the mapping.
Step claim_and_map(Attempt& a, detail::UniqueFd fd, struct stat st, Attached& out) {
  const Syscalls& sys = a.sys;
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

// The joiner path (see Note [Region lifetime]).
Step try_join(Attempt& a, Attached& out) {
  const Syscalls& sys = a.sys;
  const int raw = open_existing(a);
  if (raw < 0) return Step::kAbsent;
  detail::UniqueFd fd(sys, raw);
  struct stat st {};
  if (sys.fstat(sys.context, fd.get(), &st) != 0)
    throw_system_error("fstat", errno, "of region " + a.path);
  // Owner and mode before the stale test: root must never reclaim another user's idle file.
  detail::check_owner_and_mode(st, a.path);

  if (sys.flock(sys.context, fd.get(), LOCK_EX | LOCK_NB) == 0) {
    // No process holds the liveness lock: stale. Reclaim it and go around to create, but only
    // when it is provably a region (Note [What is ours to remove], the rule `region clean` uses).
    if (const std::string why = detail::why_not_ours(sys, fd.get(), st, a.path); !why.empty()) {
      throw Error(ErrorCode::kMismatch,
                  a.path + " is in the way and was left alone: " + why +
                      ". Only a file that is provably a stale kvoffload region of this user is "
                      "removed; if this one is junk, remove it by hand");
    }
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

  if (!wait_until_ready(a, fd.get())) return Step::kRetry;
  return claim_and_map(a, std::move(fd), st, out);
}

}  // namespace

Attached attach(Attempt& a) {
  Attached attached;
  for (;;) {
    Step step = try_join(a, attached);
    if (step == Step::kAbsent) step = try_create(a, attached);
    if (step == Step::kAttached) break;
    if (step == Step::kRetryNow || step == Step::kLostRace || step == Step::kAbsent) continue;
    if (Clock::now() >= a.deadline) throw_timeout(a);
    backoff();
  }
  return attached;
}

}  // namespace detail

}  // namespace kvoffload
