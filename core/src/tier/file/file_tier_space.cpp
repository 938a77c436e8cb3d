// The file tier's space: the capacity in force (Note [Full disk]), eviction after ENOSPC, and
// unlinking records and temp files under the name locks (Note [File tier name locks]).
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "tier/file/file_tier_impl.hpp"
#include "util/log.hpp"

namespace kvoffload {

void FileTier::Impl::close_fd(int fd, const std::filesystem::path& path) {
  if (sys.close(sys.context, fd) != 0) {
    const int e = errno;
    warnings.warn("close " + errno_name(e), "file tier '{}': {}", options.name,
                  errno_text("close " + path.string(), e));
  }
}

int FileTier::Impl::unlink_path(const std::filesystem::path& path) {
  return sys.unlinkat(sys.context, AT_FDCWD, path.c_str(), 0);
}

void FileTier::Impl::unlink_quietly(const std::filesystem::path& path) {
  if (unlink_path(path) != 0 && errno != ENOENT) {
    const int e = errno;
    warnings.warn("unlink " + errno_name(e), "file tier '{}': {}", options.name,
                  errno_text("unlink " + path.string(), e));
  }
}

int FileTier::Impl::reclaim(const BlockKey& key) {
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

std::optional<std::uint64_t> FileTier::Impl::free_bytes() {
  struct statvfs vfs {};
  if (sys.fstatvfs(sys.context, lock_fd.get(), &vfs) != 0) {
    const int e = errno;
    warnings.warn("fstatvfs " + errno_name(e), "file tier '{}': {}; keeping the capacity in force",
                  options.name, errno_text("fstatvfs " + root.string(), e));
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(vfs.f_bavail) * static_cast<std::uint64_t>(vfs.f_frsize);
}

// Note [Full disk]: capacity = min(configured, held + free). Caller holds mutex.
std::optional<FileTier::Impl::CapacityChange> FileTier::Impl::set_capacity_locked(
    std::uint64_t free) {
  const std::uint64_t before = index.capacity();
  const std::uint64_t cap = index.set_free_bytes(free);
  counters.capacity_bytes = cap;
  if (cap == before || cap >= index.configured()) return std::nullopt;
  return CapacityChange{cap, free, index.ready_bytes()};
}
void FileTier::Impl::log_capacity(const std::optional<CapacityChange>& c) {
  if (!c) return;
  warnings.warn("capacity",
                "file tier '{}': capacity {} bytes, below the configured {}: the "
                "filesystem of {} has {} bytes free besides the {} bytes of records held",
                options.name, c->capacity, index.configured(), root.string(), c->free, c->held);
}

std::size_t FileTier::Impl::make_room(const BlockKey& keep, std::uint64_t need) {
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

}  // namespace kvoffload
