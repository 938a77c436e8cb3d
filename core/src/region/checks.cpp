// The region's checks: the engine id and file names, the owner and mode of a file found at the
// path, the shm dir, the caller's options, the capacity check before creating, and a found header
// against this process's geometry. Each refusal names the value found and what is allowed.

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include <kvoffload/error.hpp>
#include <kvoffload/platform.hpp>
#include <kvoffload/region.hpp>

#include "region/header.hpp"
#include "region/region_internal.hpp"
#include "sys/sys.hpp"
#include "sys/syscalls.hpp"

namespace kvoffload {

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

void validate_options(const RegionOptions& options) {
  detail::validate_engine_id(options.engine_id);
  if (options.populate_threads == 0) throw_invalid("populate_threads is 0; it must be at least 1");
  if (options.bringup_piece_bytes == 0) {
    throw_invalid("bringup_piece_bytes is 0; it must be at least 1 (default " +
                  std::to_string(kDefaultBringupPieceBytes) + ")");
  }
  if (options.bringup_first_piece_bytes == 0) {
    throw_invalid("bringup_first_piece_bytes is 0; it must be at least 1 (default " +
                  std::to_string(kDefaultBringupFirstPieceBytes) + ")");
  }
  if (options.bringup != BringupMode::kBlocking && options.bringup != BringupMode::kBackground) {
    throw_invalid("bringup mode " + std::to_string(static_cast<int>(options.bringup)) +
                  " is unknown");
  }
  if (options.join_timeout.count() < 0) {
    throw_invalid("join_timeout is " + std::to_string(options.join_timeout.count()) +
                  " ms; it must be >= 0");
  }
}

namespace {

std::string describe_layout(const RegionLayout& l) {
  return "{num_chunks=" + std::to_string(l.num_chunks) +
         ", slot_bytes=" + std::to_string(l.slot_bytes) +
         ", world_size=" + std::to_string(l.world_size) +
         ", replicated=" + (l.replicated ? "true" : "false") +
         ", slot_align=" + std::to_string(l.slot_align) + "}";
}

}  // namespace

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

// Validates a header against our geometry; throws kMismatch naming both values.
void check_header(const Attempt& a, const detail::RegionHeader& h) {
  const auto layout = detail::header_layout(h);
  if (!layout) {
    throw Error(ErrorCode::kMismatch, a.path + " is not a kvoffload region of format version " +
                                          std::to_string(detail::kRegionVersion) +
                                          " (bad magic or version " + std::to_string(h.version) +
                                          "); refused");
  }
  if (h.checksum != detail::header_checksum(h)) {
    throw Error(ErrorCode::kMismatch,
                "region " + a.path +
                    " has a corrupt header (its checksum does not match its fields: changed "
                    "after creation); refused");
  }
  if (layout->slot_align != a.geometry.slot_align()) {
    throw Error(
        ErrorCode::kMismatch,
        "region " + a.path + " was created with slot_align=" + std::to_string(layout->slot_align) +
            " but this process asks for slot_align=" + std::to_string(a.geometry.slot_align()) +
            "; every rank must use the same slot alignment");
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

}  // namespace detail

}  // namespace kvoffload
