#pragma once
// Helpers for the tier tests: a disk-backed temporary directory and a fault-injecting Syscalls
// table. Directories, descriptor and mapping snapshots come from the shared kit (tests/support).

#include "kvoffload/file_tier.hpp"
#include "kvoffload/syscalls.hpp"
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

// A Syscalls table (the seam the region uses too) that fails chosen calls of the file tier: a
// predicate over (operation, path) decides, thread-safe. fd-based calls are judged by the path
// the descriptor was opened with. Pass get() as FileTierOptions::syscalls; the object must
// outlive the tier.
class FaultIo {
 public:
  // Return an errno to fail the call with it, or 0 to let it through.
  using Rule = std::function<int(std::string_view op, const std::string& path)>;

  FaultIo() {
    table_ = real_syscalls();
    table_.context = this;
    table_.openat = [](void* c, int dirfd, const char* path, int flags, mode_t mode) {
      FaultIo& f = self(c);
      {
        std::lock_guard lock(f.mutex_);
        f.direct_opens_.push_back((flags & O_DIRECT) != 0 ? 1 : 0);
      }
      if (int e = f.check("open", path, flags)) return fail(e);
      const int fd = real().openat(nullptr, dirfd, path, flags, mode);
      if (fd >= 0) {
        std::lock_guard lock(f.mutex_);
        f.paths_[fd] = path;
        f.flags_[fd] = flags;
      }
      return fd;
    };
    table_.close = [](void* c, int fd) {
      FaultIo& f = self(c);
      {
        std::lock_guard lock(f.mutex_);
        f.paths_.erase(fd);
        f.flags_.erase(fd);
      }
      return real().close(nullptr, fd);
    };
    table_.pwrite = [](void* c, int fd, const void* buf, std::size_t n, off_t off) -> ssize_t {
      FaultIo& f = self(c);
      if (int e = f.check("pwrite", f.path_of(fd), f.flags_of(fd))) return fail(e);
      return real().pwrite(nullptr, fd, buf, n, off);
    };
    table_.pread = [](void* c, int fd, void* buf, std::size_t n, off_t off) -> ssize_t {
      FaultIo& f = self(c);
      if (int e = f.check("pread", f.path_of(fd), f.flags_of(fd))) return fail(e);
      return real().pread(nullptr, fd, buf, n, off);
    };
    table_.fcntl_int = [](void* c, int fd, int cmd, int arg) {
      FaultIo& f = self(c);
      const int rc = real().fcntl_int(nullptr, fd, cmd, arg);
      if (rc == 0 && cmd == F_SETFL) {
        std::lock_guard lock(f.mutex_);
        f.flags_[fd] = (f.flags_[fd] & ~O_DIRECT) | (arg & O_DIRECT);
      }
      return rc;
    };
    table_.renameat = [](void* c, int od, const char* from, int nd, const char* to) {
      if (int e = self(c).check("rename", to, 0)) return fail(e);
      return real().renameat(nullptr, od, from, nd, to);
    };
    table_.flock = [](void* c, int fd, int op) {
      FaultIo& f = self(c);
      if (int e = f.check("flock", f.path_of(fd), 0)) return fail(e);
      return real().flock(nullptr, fd, op);
    };
    // The real statvfs, except, when a size is set, that of a filesystem of `bytes` bytes
    // holding only the tier: f_bavail is what the files under the tier's root (the directory of
    // the locked file fstatvfs is asked about) leave of it, in 4 KiB blocks. Writes use it up,
    // unlinks free it, and a smaller size set later is the disk filling up from elsewhere.
    table_.fstatvfs = [](void* c, int fd, struct statvfs* st) {
      FaultIo& f = self(c);
      const std::string path = f.path_of(fd);
      if (int e = f.check("fstatvfs", path, 0)) return fail(e);
      const int rc = real().fstatvfs(nullptr, fd, st);
      std::optional<std::uint64_t> size;
      {
        std::lock_guard lock(f.mutex_);
        size = f.filesystem_bytes_;
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
    };
  }
  FaultIo(const FaultIo&) = delete;
  FaultIo& operator=(const FaultIo&) = delete;

  [[nodiscard]] const Syscalls* get() const noexcept { return &table_; }

  void set_rule(Rule rule) {
    std::lock_guard lock(mutex_);
    rule_ = std::move(rule);
  }
  void set_filesystem_bytes(std::optional<std::uint64_t> bytes) {
    std::lock_guard lock(mutex_);
    filesystem_bytes_ = bytes;
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

  // The O_DIRECT flag of the call being checked, for rules that refuse O_DIRECT only.
  static thread_local int current_flags;

 private:
  static FaultIo& self(void* ctx) { return *static_cast<FaultIo*>(ctx); }
  static const Syscalls& real() { return real_syscalls(); }
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

  Syscalls table_{};
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
