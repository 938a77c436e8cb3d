#pragma once
// What the shm dir sits on, for `probe` and for the warning of `run` and `region create`: a
// region works on any filesystem, but only on one in memory (tmpfs, hugetlbfs) is the host pool
// as fast as memory; on a disk filesystem its pages are written back to that disk.

#include <cstdint>
#include <filesystem>
#include <string>

namespace kvoffload::cli {

struct FsType {
  std::string name;  // "tmpfs", "hugetlbfs", "ext2/3/4", "xfs", "overlay", ... or "0x<hex>"
  bool memory_backed = false;  // tmpfs, hugetlbfs, ramfs
};

// statfs's f_type of `dir`; throws Error(kSystem) naming the path.
FsType filesystem_type(const std::filesystem::path& dir);

// Warns (log level warn, on stderr) when `shm_dir` is not on a memory filesystem. Silent when the
// directory cannot be examined (the region's own error says why).
void warn_if_disk_shm_dir(const std::filesystem::path& shm_dir);

// This machine's physical memory (sysconf(_SC_PHYS_PAGES) x page size); 0 when unknown.
std::uint64_t physical_memory_bytes();

}  // namespace kvoffload::cli
