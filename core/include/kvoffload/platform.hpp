#pragma once
// What this machine offers the region layer: page size, free space of a directory, the memory
// cgroup limit, MADV_POPULATE_WRITE support and NUMA nodes. `kvoffload probe` prints these; the
// region's capacity check uses filesystem_space and memory_cgroup_available.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include <kvoffload/export.h>

namespace kvoffload {

struct Syscalls;

namespace platform {

// The system page size (sysconf(_SC_PAGESIZE)).
KVOFFLOAD_API std::size_t page_size();

struct FsSpace {
  std::uint64_t free_bytes = 0;   // available to an unprivileged writer (f_bavail · f_frsize)
  std::uint64_t total_bytes = 0;  // f_blocks · f_frsize
};

// Free and total bytes of the filesystem holding `dir`. Throws Error(kSystem) naming the path.
KVOFFLOAD_API FsSpace filesystem_space(const std::filesystem::path& dir,
                                       const Syscalls* syscalls = nullptr);

// The memory limit of this process's memory cgroup (v2 memory.max or v1 memory.limit_in_bytes,
// the lowest along the path to the root), or nullopt when unlimited or unknown. tmpfs pages are
// charged to the cgroup of the process that allocates them, so a container limit caps a region.
KVOFFLOAD_API std::optional<std::uint64_t> memory_cgroup_limit(const Syscalls* syscalls = nullptr);

// limit − usage, where usage leaves out inactive file cache (reclaimable; what `docker stats`
// shows), or nullopt when there is no limit.
KVOFFLOAD_API std::optional<std::uint64_t> memory_cgroup_available(
    const Syscalls* syscalls = nullptr);

// Whether madvise(MADV_POPULATE_WRITE) works here (Linux >= 5.14): one probe on an anonymous page.
KVOFFLOAD_API bool madv_populate_write_supported();

// Online NUMA nodes from /sys/devices/system/node/online; {0} when the machine reports none.
KVOFFLOAD_API std::vector<int> numa_nodes();

}  // namespace platform
}  // namespace kvoffload
