#pragma once
// Helpers for the tier tests: a disk-backed temporary directory and a fault-injecting FileTierIo.
// Directories, descriptor and mapping snapshots come from the shared kit (tests/support).

#include "kvoffload/file_tier.hpp"
#include "test_env.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kvoffload::test {

// Tier files live on a disk filesystem by default (O_DIRECT, real fsync), unlike the kit's
// TempDir, which defaults to /dev/shm.
class DiskTempDir : public TempDir {
 public:
  DiskTempDir() : TempDir(std::filesystem::temp_directory_path()) {}
  explicit DiskTempDir(const std::filesystem::path& base) : TempDir(base) {}
};

// FileTierIo that fails chosen calls: a predicate over (operation, path) decides, thread-safe.
class FaultIo : public FileTierIo {
 public:
  // Return an errno to fail the call with it, or 0 to let it through.
  using Rule = std::function<int(std::string_view op, const std::string& path)>;

  void set_rule(Rule rule) {
    std::lock_guard lock(mutex_);
    rule_ = std::move(rule);
  }
  [[nodiscard]] int count(std::string_view op) const {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const auto& o : ops_) n += o == op ? 1 : 0;
    return n;
  }
  [[nodiscard]] std::vector<int> direct_flags_seen() const {
    std::lock_guard lock(mutex_);
    return direct_opens_;
  }

  int open(const char* path, int flags, mode_t mode) override {
    {
      std::lock_guard lock(mutex_);
      direct_opens_.push_back((flags & O_DIRECT) != 0 ? 1 : 0);
    }
    if (int e = check("open", path, flags)) return fail(e);
    const int fd = FileTierIo::open(path, flags, mode);
    if (fd >= 0) {
      std::lock_guard lock(mutex_);
      paths_[fd] = path;
      flags_[fd] = flags;
    }
    return fd;
  }
  int close(int fd) override {
    {
      std::lock_guard lock(mutex_);
      paths_.erase(fd);
      flags_.erase(fd);
    }
    return FileTierIo::close(fd);
  }
  ssize_t pwrite(int fd, const void* buf, std::size_t n, off_t off) override {
    if (int e = check("pwrite", path_of(fd), flags_of(fd))) return fail(e);
    return FileTierIo::pwrite(fd, buf, n, off);
  }
  ssize_t pread(int fd, void* buf, std::size_t n, off_t off) override {
    if (int e = check("pread", path_of(fd), flags_of(fd))) return fail(e);
    return FileTierIo::pread(fd, buf, n, off);
  }
  int fcntl_setfl(int fd, int flags) override {
    const int rc = FileTierIo::fcntl_setfl(fd, flags);
    if (rc == 0) {
      std::lock_guard lock(mutex_);
      flags_[fd] = (flags_[fd] & ~O_DIRECT) | (flags & O_DIRECT);
    }
    return rc;
  }
  int rename(const char* from, const char* to) override {
    if (int e = check("rename", to, 0)) return fail(e);
    return FileTierIo::rename(from, to);
  }
  int flock(int fd, int op) override {
    if (int e = check("flock", path_of(fd), 0)) return fail(e);
    return FileTierIo::flock(fd, op);
  }
  // The real statvfs, except, when a size is set, that of a filesystem of `bytes` bytes holding
  // only the tier: f_bavail is what the files under the tier's root (the directory of the locked
  // file fstatvfs is asked about) leave of it, in 4 KiB blocks. Writes use it up, unlinks free
  // it, and a smaller size set later is the disk filling up from elsewhere.
  int fstatvfs(int fd, struct statvfs* st) override {
    const std::string path = path_of(fd);
    if (int e = check("fstatvfs", path, 0)) return fail(e);
    const int rc = FileTierIo::fstatvfs(fd, st);
    std::optional<std::uint64_t> size;
    {
      std::lock_guard lock(mutex_);
      size = filesystem_bytes_;
    }
    if (rc == 0 && size) {
      std::uint64_t used = 0;
      std::error_code ec;
      for (const auto& e : std::filesystem::recursive_directory_iterator(
               std::filesystem::path(path).parent_path(), ec)) {
        std::error_code fec;
        if (e.is_regular_file(fec)) used += (e.file_size(fec) + 4095) / 4096 * 4096;
      }
      st->f_frsize = 4096;
      st->f_bavail = used >= *size ? 0 : (*size - used) / 4096;
    }
    return rc;
  }
  void set_filesystem_bytes(std::optional<std::uint64_t> bytes) {
    std::lock_guard lock(mutex_);
    filesystem_bytes_ = bytes;
  }

  // The O_DIRECT flag of the call being checked, for rules that refuse O_DIRECT only.
  static thread_local int current_flags;

 private:
  int check(std::string_view op, const std::string& path, int flags) {
    Rule rule;
    {
      std::lock_guard lock(mutex_);
      ops_.emplace_back(op);
      rule = rule_;
    }
    current_flags = flags;
    return rule ? rule(op, path) : 0;
  }
  static int fail(int e) {
    errno = e;
    return -1;
  }
  std::string path_of(int fd) {
    std::lock_guard lock(mutex_);
    auto it = paths_.find(fd);
    return it == paths_.end() ? std::string() : it->second;
  }
  int flags_of(int fd) {
    std::lock_guard lock(mutex_);
    auto it = flags_.find(fd);
    return it == flags_.end() ? 0 : it->second;
  }

  mutable std::mutex mutex_;
  Rule rule_;
  std::vector<std::string> ops_;
  std::vector<int> direct_opens_;
  std::map<int, std::string> paths_;
  std::map<int, int> flags_;
  std::optional<std::uint64_t> filesystem_bytes_;
};

inline thread_local int FaultIo::current_flags = 0;

}  // namespace kvoffload::test
