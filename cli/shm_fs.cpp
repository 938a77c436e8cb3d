#include "shm_fs.hpp"

#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <kvoffload/error.hpp>

#include "util/log.hpp"

namespace kvoffload::cli {

FsType filesystem_type(const std::filesystem::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) {
    throw_system_error("statfs", errno, "of " + dir.string());
  }
  // From <linux/magic.h>; the ones a shm dir is likely to be on.
  struct Known {
    std::uint32_t magic;
    const char* name;
    bool memory;
  };
  static constexpr Known kKnown[] = {
      {0x01021994, "tmpfs", true},    {0x958458f6, "hugetlbfs", true},
      {0x858458f6, "ramfs", true},    {0x0000EF53, "ext2/3/4", false},
      {0x58465342, "xfs", false},     {0x9123683E, "btrfs", false},
      {0x794c7630, "overlay", false}, {0x00006969, "nfs", false},
      {0x2fc12fc1, "zfs", false},     {0x65735546, "fuse", false},
      {0x00009fa0, "proc", false},    {0x62656572, "sysfs", false},
      {0xF2F52010, "f2fs", false},    {0x4d44, "vfat", false},
  };
  const auto magic = static_cast<std::uint32_t>(st.f_type);
  for (const Known& k : kKnown) {
    if (k.magic == magic) return {.name = k.name, .memory_backed = k.memory};
  }
  char hex[16];
  (void)std::snprintf(hex, sizeof hex, "0x%x", magic);
  return {.name = hex, .memory_backed = false};
}

std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

void warn_if_disk_shm_dir(const std::filesystem::path& shm_dir) {
  FsType fs;
  try {
    fs = filesystem_type(shm_dir);
  } catch (const Error&) {
    return;
  }
  if (fs.memory_backed) return;
  log().warn(
      "shm dir {} is on a {} filesystem, not in memory (tmpfs, hugetlbfs): the region works, but "
      "its pages are written back to that disk and the host pool is no faster than it. Use "
      "/dev/shm or another tmpfs for --shm-dir ('kvoffload probe' shows the filesystem)",
      shm_dir.string(), fs.name);
}

}  // namespace kvoffload::cli
