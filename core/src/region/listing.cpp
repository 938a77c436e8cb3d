// `region list` and `region clean` (DESIGN §2 point 6 and its notes).
#include <sys/file.h>

#include <algorithm>
#include <cerrno>

#include "kvoffload/error.hpp"
#include "kvoffload/geometry.hpp"
#include "kvoffload/log.hpp"
#include "kvoffload/region.hpp"
#include "kvoffload/syscalls.hpp"
#include "region/header.hpp"
#include "region/proc_locks.hpp"
#include "region/region_internal.hpp"
#include "region/sys.hpp"

namespace kvoffload {
namespace {

const Syscalls& table(const Syscalls* sys) { return sys != nullptr ? *sys : real_syscalls(); }

// Region file names in the directory, sorted, optionally only `engine_id`'s.
std::vector<std::string> region_names(const Syscalls& sys, int dirfd, const std::string& dir,
                                      const std::optional<std::string>& engine_id) {
  std::vector<std::string> names;
  if (sys.list_dir(sys.context, dirfd, &names) != 0) throw_system_error("readdir", errno, "of " + dir);
  std::erase_if(names, [&](const std::string& n) {
    const std::string id = detail::engine_id_from_file_name(n);
    return id.empty() || (engine_id && id != *engine_id);
  });
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::vector<RegionInfo> list_regions(const std::filesystem::path& shm_dir, const Syscalls* syscalls) {
  const Syscalls& sys = table(syscalls);
  const std::string dir = shm_dir.string();
  const detail::UniqueFd dirfd(sys, detail::open_shm_dir(sys, dir));
  std::string locks;
  if (sys.read_file(sys.context, "/proc/locks", &locks) != 0) {
    throw_system_error("read", errno, "of /proc/locks (counting the holders of regions)");
  }
  std::vector<RegionInfo> out;
  for (const std::string& name : region_names(sys, dirfd.get(), dir, std::nullopt)) {
    RegionInfo info;
    info.path = shm_dir / name;
    info.engine_id = detail::engine_id_from_file_name(name);
    // Opened read-only and never locked: a probing lock here could beat the last process out to
    // its exclusive lock and leave a stale file behind.
    const int raw = detail::retry_eintr([&] {
      return sys.openat(sys.context, dirfd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    });
    if (raw < 0) {
      if (errno == ENOENT) continue;  // removed while listing
      // Not readable by us (another user's file, a symlink): listed with what we know.
      struct stat st {};
      if (sys.fstatat(sys.context, dirfd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        info.file_bytes = static_cast<std::uint64_t>(st.st_size);
        info.attached = detail::count_flock_holders(locks, st.st_dev, st.st_ino);
        info.stale = info.attached == 0;
      }
      out.push_back(std::move(info));
      continue;
    }
    const detail::UniqueFd fd(sys, raw);
    struct stat st {};
    if (sys.fstat(sys.context, fd.get(), &st) != 0) throw_system_error("fstat", errno, info.path.string());
    info.file_bytes = static_cast<std::uint64_t>(st.st_size);
    info.attached = detail::count_flock_holders(locks, st.st_dev, st.st_ino);
    info.stale = info.attached == 0;
    detail::RegionHeader header{};
    if (detail::read_header(sys, fd.get(), header, info.path.string())) {
      if (const auto layout = detail::header_layout(header)) {
        info.complete = header.state == static_cast<std::uint32_t>(detail::RegionState::kReady);
        try {
          info.geometry = RegionGeometry::compute(*layout, static_cast<std::size_t>(header.page_size));
        } catch (const Error&) {
          // A corrupt header: listed without geometry.
        }
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

CleanResult clean_regions(const std::filesystem::path& shm_dir, const std::optional<std::string>& engine_id,
                          const Syscalls* syscalls) {
  const Syscalls& sys = table(syscalls);
  if (engine_id) detail::validate_engine_id(*engine_id);
  const std::string dir = shm_dir.string();
  const detail::UniqueFd dirfd(sys, detail::open_shm_dir(sys, dir));
  CleanResult result;
  for (const std::string& name : region_names(sys, dirfd.get(), dir, engine_id)) {
    const std::filesystem::path path = shm_dir / name;
    const int raw = detail::retry_eintr([&] {
      return sys.openat(sys.context, dirfd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    });
    if (raw < 0) {
      if (errno == ENOENT) continue;
      log().info("clean: keeping {}: cannot open it ({})", path.string(), errno_name(errno));
      result.kept.push_back(path);
      continue;
    }
    const detail::UniqueFd fd(sys, raw);
    struct stat st {};
    if (sys.fstat(sys.context, fd.get(), &st) != 0) throw_system_error("fstat", errno, path.string());
    try {
      detail::check_owner_and_mode(st, path.string());  // before the stale test
    } catch (const Error& e) {
      log().info("clean: keeping {}: {}", path.string(), e.what());
      result.kept.push_back(path);
      continue;
    }
    // clean may lock: winning the exclusive lock means no one is attached, and it unlinks.
    if (sys.flock(sys.context, fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) throw_system_error("flock", errno, "(LOCK_EX|LOCK_NB) of " + path.string());
      result.kept.push_back(path);  // in use
      continue;
    }
    if (!detail::path_names_inode(sys, dirfd.get(), name, st)) {
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
