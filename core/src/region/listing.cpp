// `region list` and `region clean` (docs/DESIGN.md §3.5 and §3.7).
//
// Note [Hostile entries]: anything can sit in a shm dir under a region's name: a FIFO, a
// directory, a symbolic link, a socket, a file someone else wrote. Every candidate is opened with
// O_NONBLOCK (a FIFO would block open() until a writer comes) and O_NOFOLLOW (a link is never
// followed), its type is checked with fstat before a byte is read, and a bad entry is reported
// with its reason while the command goes on with the others. `clean` removes only what Note
// [What is ours to remove] (ownership.hpp) allows; everything else is skipped with its reason.
#include "region/listing.hpp"

#include <sys/file.h>

#include <algorithm>
#include <cerrno>

#include <kvoffload/error.hpp>
#include <kvoffload/geometry.hpp>
#include <kvoffload/region.hpp>

#include "region/header.hpp"
#include "region/owners.hpp"
#include "region/ownership.hpp"
#include "region/proc_locks.hpp"
#include "region/region_internal.hpp"
#include "sys/sys.hpp"
#include "sys/syscalls.hpp"
#include "util/log.hpp"

namespace kvoffload {
namespace {

const Syscalls& table(const Syscalls* sys) {
  return sys != nullptr ? *sys : real_syscalls();
}

// Region file names in the directory, sorted, optionally only `engine_id`'s.
std::vector<std::string> region_names(const Syscalls& sys, int dirfd, const std::string& dir,
                                      const std::optional<std::string>& engine_id) {
  std::vector<std::string> names;
  if (sys.list_dir(sys.context, dirfd, &names) != 0)
    throw_system_error("readdir", errno, "of " + dir);
  std::erase_if(names, [&](const std::string& n) {
    const std::string id = detail::engine_id_from_file_name(n);
    return id.empty() || (engine_id && id != *engine_id);
  });
  std::sort(names.begin(), names.end());
  return names;
}

// What a non-regular file is, for the reason shown next to it.
std::string type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

std::string not_a_region(mode_t mode) {
  return type_name(mode) + ", not a region file";
}

// One opened candidate: the descriptor (invalid when open failed), its stat, and the reason it is
// not a region ("" when it is a regular file we could open).
struct Candidate {
  detail::UniqueFd fd;
  struct stat st {};
  bool have_stat = false;
  std::string problem;
  bool gone = false;  // removed while we looked
};

Candidate open_candidate(const Syscalls& sys, int dirfd, const std::string& name) {
  Candidate c;
  // Read-only and never locked here (docs/DESIGN.md §3.7). O_NONBLOCK: see
  // Note [Hostile entries].
  const int raw = detail::retry_eintr([&] {
    return sys.openat(sys.context, dirfd, name.c_str(),
                      O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
  });
  if (raw < 0) {
    const int err = errno;
    if (err == ENOENT) {
      c.gone = true;
      return c;
    }
    // Learn what it is without following it: ELOOP is a link, ENXIO a socket, EACCES a file of
    // another user.
    if (sys.fstatat(sys.context, dirfd, name.c_str(), &c.st, AT_SYMLINK_NOFOLLOW) == 0) {
      c.have_stat = true;
      c.problem =
          S_ISREG(c.st.st_mode) ? "cannot open it: " + errno_name(err) : not_a_region(c.st.st_mode);
    } else {
      c.gone = errno == ENOENT;
      c.problem = "cannot open it: " + errno_name(err);
    }
    return c;
  }
  c.fd = detail::UniqueFd(sys, raw);
  if (sys.fstat(sys.context, c.fd.get(), &c.st) != 0) {
    c.problem = "fstat failed: " + errno_name(errno);
    return c;
  }
  c.have_stat = true;
  if (!S_ISREG(c.st.st_mode)) c.problem = not_a_region(c.st.st_mode);
  return c;
}

// Reads the header of a regular candidate; nullopt with `problem` set when there is none.
std::optional<detail::RegionHeader> candidate_header(const Syscalls& sys, const Candidate& c,
                                                     const std::string& path,
                                                     std::string& problem) {
  detail::RegionHeader header{};
  try {
    if (!detail::read_header(sys, c.fd.get(), header, path)) {
      problem = "shorter than a region header; not a region file";
      return std::nullopt;
    }
  } catch (const Error& e) {
    problem = "cannot read its header: " + errno_name(e.sys_errno());
    return std::nullopt;
  }
  problem = detail::header_problem(header, static_cast<std::uint64_t>(c.st.st_size));
  if (!problem.empty()) return std::nullopt;
  return header;
}

}  // namespace

std::vector<RegionInfo> list_regions(const std::filesystem::path& shm_dir,
                                     const Syscalls* syscalls) {
  return detail::list_regions_with(shm_dir, table(syscalls), {});
}

namespace detail {

std::vector<RegionInfo> list_regions_with(const std::filesystem::path& shm_dir, const Syscalls& sys,
                                          const RegionInspector& inspect) {
  const std::string dir = shm_dir.string();
  const detail::UniqueFd dirfd(sys, detail::open_shm_dir(sys, dir));
  std::string locks;
  if (detail::read_proc_locks(sys, &locks) != 0) {
    throw_system_error("read", errno, "of /proc/locks (counting the holders of regions)");
  }
  std::vector<RegionInfo> out;
  for (const std::string& name : region_names(sys, dirfd.get(), dir, std::nullopt)) {
    RegionInfo info;
    info.path = shm_dir / name;
    info.engine_id = detail::engine_id_from_file_name(name);
    Candidate c = open_candidate(sys, dirfd.get(), name);
    if (c.gone) continue;  // removed while listing
    info.problem = std::move(c.problem);
    if (c.have_stat && S_ISREG(c.st.st_mode)) {
      info.file_bytes = static_cast<std::uint64_t>(c.st.st_size);
      info.attached = detail::count_flock_holders(locks, c.st.st_dev, c.st.st_ino);
      info.stale = info.attached == 0;
    }
    if (c.fd.valid() && info.problem.empty()) {
      if (const auto header = candidate_header(sys, c, info.path.string(), info.problem)) {
        info.complete = header->state == static_cast<std::uint32_t>(detail::RegionState::kReady);
        try {
          info.geometry = RegionGeometry::compute(*detail::header_layout(*header),
                                                  static_cast<std::size_t>(header->page_size));
        } catch (const Error& e) {
          info.problem = std::string("corrupt header: ") + e.what();
        }
        try {
          info.owners =
              detail::held_roles(sys, c.fd.get(), c.st, *header, locks, info.path.string());
        } catch (const Error& e) {
          info.problem = "cannot read its owner table: " + errno_name(e.sys_errno());
        }
        if (inspect && info.problem.empty()) inspect(out.size(), c.fd.get(), c.st, *header);
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace detail

CleanResult clean_regions(const std::filesystem::path& shm_dir,
                          const std::optional<std::string>& engine_id, const Syscalls* syscalls) {
  const Syscalls& sys = table(syscalls);
  if (engine_id) detail::validate_engine_id(*engine_id);
  const std::string dir = shm_dir.string();
  const detail::UniqueFd dirfd(sys, detail::open_shm_dir(sys, dir));
  CleanResult result;
  for (const std::string& name : region_names(sys, dirfd.get(), dir, engine_id)) {
    const std::filesystem::path path = shm_dir / name;
    Candidate c = open_candidate(sys, dirfd.get(), name);
    if (c.gone) continue;
    const auto skip = [&](std::string reason) {
      log().info("clean: leaving {} alone: {}", path.string(), reason);
      result.skipped.push_back({path, std::move(reason)});
    };
    if (!c.problem.empty()) {  // not a regular file, or one we cannot open: not provably ours
      skip(std::move(c.problem));
      continue;
    }
    // Note [What is ours to remove]: the same rule as the reclaim in attach.cpp.
    if (std::string why = detail::why_not_ours(sys, c.fd.get(), c.st, path.string());
        !why.empty()) {
      skip(std::move(why));
      continue;
    }
    // clean may lock: winning the exclusive lock means no one is attached, and it unlinks.
    if (sys.flock(sys.context, c.fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK)
        throw_system_error("flock", errno, "(LOCK_EX|LOCK_NB) of " + path.string());
      result.kept.push_back(path);  // in use
      continue;
    }
    if (!detail::path_names_inode(sys, dirfd.get(), name, c.st)) {
      continue;  // replaced by a newer region (or removed) since we opened it: not ours to judge
    }
    if (sys.unlinkat(sys.context, dirfd.get(), name.c_str(), 0) != 0) {
      if (errno == ENOENT) continue;
      throw_system_error("unlinkat", errno, "of the stale region " + path.string());
    }
    log().info("clean: removed stale region {}", path.string());
    result.removed.push_back(path);
  }
  return result;
}

}  // namespace kvoffload
