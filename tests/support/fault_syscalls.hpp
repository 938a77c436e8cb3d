#pragma once
// The one fault-injecting Syscalls table of the tests (docs/DESIGN.md §11.2), for the region and
// the file tier alike (both make their system calls through core/src/sys/syscalls.hpp). It passes
// every call to the real system call unless a fault plan says otherwise:
//   FaultSyscalls sys;
//   sys.fail(Op::kFallocate, 1, ENOSPC);           // the 1st fallocate fails with ENOSPC
//   sys.fail(Op::kClose, 2, EIO, /*after_real=*/true);  // the 2nd close closes, then reports EIO
//   sys.fail_call(7, EIO);                          // the 7th call of any kind fails
//   sys.before(Op::kLinkat, 1, [] { raise(SIGKILL); });  // die at a chosen point
//   sys.set_rule([&](const FaultSyscalls::Call& c) {     // fail by operation, path and flags
//     return c.op == Op::kPread && c.path == bad ? EIO : 0;
//   });
//   sys.set_filesystem_bytes(5 * record);           // fstatvfs sees a disk of that size
//   opts.syscalls = sys.get();
// The plan lives in the object, not in globals, so tests with different plans can run in parallel.
// The object must outlive everything that uses its table; it is neither copyable nor movable.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sys/syscalls.hpp"

namespace kvoffload::test {

enum class Op {
  kOpenat,
  kClose,
  kFstat,
  kFstatat,
  kFstatvfs,
  kFchmod,
  kFallocate,
  kFtruncate,
  kPread,
  kPwrite,
  kLinkat,
  kUnlinkat,
  kMmap,
  kMunmap,
  kMadvise,
  kFlock,
  kFcntlLock,
  kReadFile,
  kListDir,
  kFsync,
  kFdatasync,
  kFcntlInt,
  kRenameat,
  kMkdirat,
  kFsetxattr,
  kFgetxattr,
};

inline std::string_view op_name(Op op) {
  switch (op) {
    case Op::kOpenat:
      return "open";
    case Op::kClose:
      return "close";
    case Op::kFstat:
      return "fstat";
    case Op::kFstatat:
      return "fstatat";
    case Op::kFstatvfs:
      return "fstatvfs";
    case Op::kFchmod:
      return "fchmod";
    case Op::kFallocate:
      return "fallocate";
    case Op::kFtruncate:
      return "ftruncate";
    case Op::kPread:
      return "pread";
    case Op::kPwrite:
      return "pwrite";
    case Op::kLinkat:
      return "linkat";
    case Op::kUnlinkat:
      return "unlinkat";
    case Op::kMmap:
      return "mmap";
    case Op::kMunmap:
      return "munmap";
    case Op::kMadvise:
      return "madvise";
    case Op::kFlock:
      return "flock";
    case Op::kFcntlLock:
      return "fcntl";
    case Op::kReadFile:
      return "read";
    case Op::kListDir:
      return "readdir";
    case Op::kFsync:
      return "fsync";
    case Op::kFdatasync:
      return "fdatasync";
    case Op::kFcntlInt:
      return "fcntl";
    case Op::kRenameat:
      return "rename";
    case Op::kMkdirat:
      return "mkdir";
    case Op::kFsetxattr:
      return "fsetxattr";
    case Op::kFgetxattr:
      return "fgetxattr";
  }
  return "?";
}

class FaultSyscalls {
 public:
  // What a rule sees of one call: the operation, the path it names and the open flags. For a call
  // on a descriptor, path and flags are those it was opened with through this table (flags as
  // F_SETFL changed them since); linkat and renameat name their new path; calls with neither have
  // an empty path and flags 0.
  struct Call {
    Op op = Op::kOpenat;
    std::string path;
    int flags = 0;
  };
  // Returns an errno to fail the call with (before the real call runs), or 0 to let it through.
  using Rule = std::function<int(const Call&)>;

  FaultSyscalls() {
    table_.context = this;
    table_.openat = [](void* c, int d, const char* p, int f, mode_t m) {
      FaultSyscalls& s = *self(c);
      s.note_open_flags(f);
      const int fd =
          s.run<int>({Op::kOpenat, p, f}, -1, [&] { return real().openat(nullptr, d, p, f, m); });
      if (fd >= 0) s.track(fd, p, f);
      return fd;
    };
    table_.close = [](void* c, int fd) {
      FaultSyscalls& s = *self(c);
      const Call call = s.on_fd(Op::kClose, fd);
      s.untrack(fd);
      return s.run<int>(call, -1, [&] { return real().close(nullptr, fd); });
    };
    table_.fstat = [](void* c, int fd, struct stat* st) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFstat, fd), -1,
                               [&] { return real().fstat(nullptr, fd, st); });
    };
    table_.fstatat = [](void* c, int d, const char* p, struct stat* st, int f) {
      return self(c)->run<int>({Op::kFstatat, p}, -1,
                               [&] { return real().fstatat(nullptr, d, p, st, f); });
    };
    table_.fstatvfs = [](void* c, int fd, struct statvfs* st) {
      FaultSyscalls& s = *self(c);
      const Call call = s.on_fd(Op::kFstatvfs, fd);
      const int rc = s.run<int>(call, -1, [&] { return real().fstatvfs(nullptr, fd, st); });
      if (rc == 0) s.model_filesystem(call.path, st);
      return rc;
    };
    table_.fchmod = [](void* c, int fd, mode_t m) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFchmod, fd), -1,
                               [&] { return real().fchmod(nullptr, fd, m); });
    };
    table_.fallocate = [](void* c, int fd, int m, off_t o, off_t l) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFallocate, fd), -1,
                               [&] { return real().fallocate(nullptr, fd, m, o, l); });
    };
    table_.ftruncate = [](void* c, int fd, off_t l) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFtruncate, fd), -1,
                               [&] { return real().ftruncate(nullptr, fd, l); });
    };
    table_.pread = [](void* c, int fd, void* b, std::size_t n, off_t o) {
      return self(c)->run<ssize_t>(self(c)->on_fd(Op::kPread, fd), -1,
                                   [&] { return real().pread(nullptr, fd, b, n, o); });
    };
    table_.pwrite = [](void* c, int fd, const void* b, std::size_t n, off_t o) {
      return self(c)->run<ssize_t>(self(c)->on_fd(Op::kPwrite, fd), -1,
                                   [&] { return real().pwrite(nullptr, fd, b, n, o); });
    };
    table_.linkat = [](void* c, int od, const char* op, int nd, const char* np, int f) {
      return self(c)->run<int>({Op::kLinkat, np}, -1,
                               [&] { return real().linkat(nullptr, od, op, nd, np, f); });
    };
    table_.unlinkat = [](void* c, int d, const char* p, int f) {
      return self(c)->run<int>({Op::kUnlinkat, p}, -1,
                               [&] { return real().unlinkat(nullptr, d, p, f); });
    };
    table_.mmap = [](void* c, void* a, std::size_t l, int p, int f, int fd, off_t o) {
      return self(c)->run<void*>(self(c)->on_fd(Op::kMmap, fd), MAP_FAILED,
                                 [&] { return real().mmap(nullptr, a, l, p, f, fd, o); });
    };
    table_.munmap = [](void* c, void* a, std::size_t l) {
      return self(c)->run<int>({Op::kMunmap}, -1, [&] { return real().munmap(nullptr, a, l); });
    };
    table_.madvise = [](void* c, void* a, std::size_t l, int adv) {
      return self(c)->run<int>({Op::kMadvise}, -1,
                               [&] { return real().madvise(nullptr, a, l, adv); });
    };
    table_.flock = [](void* c, int fd, int op) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFlock, fd), -1,
                               [&] { return real().flock(nullptr, fd, op); });
    };
    table_.fcntl_lock = [](void* c, int fd, int cmd, struct flock* l) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFcntlLock, fd), -1,
                               [&] { return real().fcntl_lock(nullptr, fd, cmd, l); });
    };
    table_.read_file = [](void* c, const char* p, std::string* out) {
      return self(c)->run<int>({Op::kReadFile, p}, -1,
                               [&] { return real().read_file(nullptr, p, out); });
    };
    table_.list_dir = [](void* c, int d, std::vector<std::string>* names) {
      return self(c)->run<int>(self(c)->on_fd(Op::kListDir, d), -1,
                               [&] { return real().list_dir(nullptr, d, names); });
    };
    table_.fsync = [](void* c, int fd) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFsync, fd), -1,
                               [&] { return real().fsync(nullptr, fd); });
    };
    table_.fdatasync = [](void* c, int fd) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFdatasync, fd), -1,
                               [&] { return real().fdatasync(nullptr, fd); });
    };
    table_.fcntl_int = [](void* c, int fd, int cmd, int arg) {
      FaultSyscalls& s = *self(c);
      const int rc = s.run<int>(s.on_fd(Op::kFcntlInt, fd), -1,
                                [&] { return real().fcntl_int(nullptr, fd, cmd, arg); });
      if (rc == 0 && cmd == F_SETFL) s.set_direct_flag(fd, arg);
      return rc;
    };
    table_.renameat = [](void* c, int od, const char* op, int nd, const char* np) {
      return self(c)->run<int>({Op::kRenameat, np}, -1,
                               [&] { return real().renameat(nullptr, od, op, nd, np); });
    };
    table_.mkdirat = [](void* c, int d, const char* p, mode_t m) {
      return self(c)->run<int>({Op::kMkdirat, p}, -1,
                               [&] { return real().mkdirat(nullptr, d, p, m); });
    };
    // A vectored read or write is a read or write to a rule (a record's pieces in one call).
    table_.preadv = [](void* c, int fd, const struct iovec* v, int n, off_t o) {
      return self(c)->run<ssize_t>(self(c)->on_fd(Op::kPread, fd), -1,
                                   [&] { return real().preadv(nullptr, fd, v, n, o); });
    };
    table_.pwritev = [](void* c, int fd, const struct iovec* v, int n, off_t o) {
      return self(c)->run<ssize_t>(self(c)->on_fd(Op::kPwrite, fd), -1,
                                   [&] { return real().pwritev(nullptr, fd, v, n, o); });
    };
    table_.fsetxattr = [](void* c, int fd, const char* name, const void* v, std::size_t n, int f) {
      return self(c)->run<int>(self(c)->on_fd(Op::kFsetxattr, fd), -1,
                               [&] { return real().fsetxattr(nullptr, fd, name, v, n, f); });
    };
    table_.fgetxattr = [](void* c, int fd, const char* name, void* v, std::size_t n) {
      return self(c)->run<ssize_t>(self(c)->on_fd(Op::kFgetxattr, fd), -1,
                                   [&] { return real().fgetxattr(nullptr, fd, name, v, n); });
    };
  }
  FaultSyscalls(const FaultSyscalls&) = delete;
  FaultSyscalls& operator=(const FaultSyscalls&) = delete;

  [[nodiscard]] const Syscalls* get() const noexcept { return &table_; }

  // The nth (1-based, counted from now on including earlier calls) call of `op` fails with `err`.
  // after_real: the real call runs first (its effect happens), then the failure is reported.
  FaultSyscalls& fail(Op op, int nth, int err, bool after_real = false) {
    const std::lock_guard lock(mu_);
    op_faults_[{op, nth}] = {err, after_real};
    return *this;
  }
  // The nth call of any kind fails with `err` (before the real call).
  FaultSyscalls& fail_call(int nth, int err) {
    const std::lock_guard lock(mu_);
    call_faults_[nth] = err;
    return *this;
  }
  // Every call that no nth-call fault above fails is put to `rule` (nullptr: none), on the calling
  // thread and outside the table's lock, so a rule may block or count with its own state.
  FaultSyscalls& set_rule(Rule rule) {
    const std::lock_guard lock(mu_);
    rule_ = std::move(rule);
    return *this;
  }
  // Runs `hook` just before / just after the nth call of `op` (0: every call).
  FaultSyscalls& before(Op op, int nth, std::function<void()> hook) {
    const std::lock_guard lock(mu_);
    before_[{op, nth}] = std::move(hook);
    return *this;
  }
  FaultSyscalls& after(Op op, int nth, std::function<void()> hook) {
    const std::lock_guard lock(mu_);
    after_[{op, nth}] = std::move(hook);
    return *this;
  }
  // With a size set, fstatvfs reports the real statvfs except that the filesystem holds `bytes`
  // bytes and only the files under the directory of the descriptor asked about (the tier's lock
  // file: its root): f_bavail is what they leave, in 4 KiB blocks. Writes use it up, unlinks free
  // it, and a smaller size set later is the disk filling up from elsewhere. nullopt: the real one.
  FaultSyscalls& set_filesystem_bytes(std::optional<std::uint64_t> bytes) {
    const std::lock_guard lock(mu_);
    filesystem_bytes_ = bytes;
    return *this;
  }

  [[nodiscard]] std::vector<Op> calls() const {
    const std::lock_guard lock(mu_);
    return calls_;
  }
  [[nodiscard]] int count(Op op) const {
    const std::lock_guard lock(mu_);
    const auto it = counts_.find(op);
    return it == counts_.end() ? 0 : it->second;
  }
  [[nodiscard]] int faults_fired() const {
    const std::lock_guard lock(mu_);
    return fired_;
  }
  // The flags of every openat call in order, the failed ones included.
  [[nodiscard]] std::vector<int> open_flags_seen() const {
    const std::lock_guard lock(mu_);
    return open_flags_;
  }

 private:
  struct OpFault {
    int err = 0;
    bool after_real = false;
  };
  struct OpenFile {
    std::string path;
    int flags = 0;
  };

  static FaultSyscalls* self(void* ctx) { return static_cast<FaultSyscalls*>(ctx); }
  static const Syscalls& real() { return real_syscalls(); }

  Call on_fd(Op op, int fd) const {
    const std::lock_guard lock(mu_);
    const auto it = open_.find(fd);
    return it == open_.end() ? Call{op} : Call{op, it->second.path, it->second.flags};
  }
  void note_open_flags(int flags) {
    const std::lock_guard lock(mu_);
    open_flags_.push_back(flags);
  }
  void track(int fd, const char* path, int flags) {
    const std::lock_guard lock(mu_);
    open_[fd] = {path, flags};
  }
  void untrack(int fd) {
    const std::lock_guard lock(mu_);
    open_.erase(fd);
  }
  void set_direct_flag(int fd, int flags) {
    const std::lock_guard lock(mu_);
    if (auto it = open_.find(fd); it != open_.end())
      it->second.flags = (it->second.flags & ~O_DIRECT) | (flags & O_DIRECT);
  }
  void model_filesystem(const std::string& path, struct statvfs* st) const {
    std::optional<std::uint64_t> size;
    {
      const std::lock_guard lock(mu_);
      size = filesystem_bytes_;
    }
    if (!size) return;
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

  template <typename R, typename F>
  R run(const Call& call_info, R fail_value, F&& call) {
    const Op op = call_info.op;
    int err = 0;
    bool after_real = false;
    Rule rule;
    std::function<void()> before_hook;
    std::function<void()> after_hook;
    {
      const std::lock_guard lock(mu_);
      const int n = ++counts_[op];
      calls_.push_back(op);
      const int index = static_cast<int>(calls_.size());
      if (auto it = call_faults_.find(index); it != call_faults_.end()) err = it->second;
      if (auto it = op_faults_.find({op, n}); it != op_faults_.end()) {
        err = it->second.err;
        after_real = it->second.after_real;
      }
      if (err == 0) rule = rule_;
      for (int key : {n, 0}) {
        if (auto it = before_.find({op, key}); it != before_.end() && !before_hook)
          before_hook = it->second;
        if (auto it = after_.find({op, key}); it != after_.end() && !after_hook)
          after_hook = it->second;
      }
    }
    if (rule) err = rule(call_info);
    if (err != 0) {
      const std::lock_guard lock(mu_);
      ++fired_;
    }
    if (before_hook) before_hook();
    if (err != 0 && !after_real) {
      errno = err;
      return fail_value;
    }
    R result = call();
    const int saved = errno;
    if (after_hook) after_hook();
    if (err != 0) {
      errno = err;
      return fail_value;
    }
    errno = saved;
    return result;
  }

  Syscalls table_{};
  mutable std::mutex mu_;
  std::map<std::pair<Op, int>, OpFault> op_faults_;
  std::map<int, int> call_faults_;
  Rule rule_;
  std::map<std::pair<Op, int>, std::function<void()>> before_;
  std::map<std::pair<Op, int>, std::function<void()>> after_;
  std::map<Op, int> counts_;
  std::vector<Op> calls_;
  std::vector<int> open_flags_;
  std::map<int, OpenFile> open_;
  std::optional<std::uint64_t> filesystem_bytes_;
  int fired_ = 0;
};

}  // namespace kvoffload::test
