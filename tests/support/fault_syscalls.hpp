#pragma once
// A fault-injecting Syscalls table for tests (STYLE.md "Test seams"). It passes every call to the
// real system call unless a fault plan says otherwise:
//   FaultSyscalls sys;
//   sys.fail(Op::kFallocate, 1, ENOSPC);           // the 1st fallocate fails with ENOSPC
//   sys.fail(Op::kClose, 2, EIO, /*after_real=*/true);  // the 2nd close closes, then reports EIO
//   sys.fail_call(7, EIO);                          // the 7th call of any kind fails
//   sys.before(Op::kLinkat, 1, [] { raise(SIGKILL); });  // die at a chosen point
//   opts.syscalls = sys.get();
// The plan lives in the object, not in globals, so tests with different plans can run in parallel.
// The object must outlive everything that uses its table; it is neither copyable nor movable.

#include <sys/mman.h>

#include <cerrno>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvoffload/syscalls.hpp"

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
  }
  return "?";
}

class FaultSyscalls {
 public:
  FaultSyscalls() {
    table_.context = this;
    table_.openat = [](void* c, int d, const char* p, int f, mode_t m) {
      return self(c)->run<int>(Op::kOpenat, -1, [&] { return real().openat(nullptr, d, p, f, m); });
    };
    table_.close = [](void* c, int fd) {
      return self(c)->run<int>(Op::kClose, -1, [&] { return real().close(nullptr, fd); });
    };
    table_.fstat = [](void* c, int fd, struct stat* st) {
      return self(c)->run<int>(Op::kFstat, -1, [&] { return real().fstat(nullptr, fd, st); });
    };
    table_.fstatat = [](void* c, int d, const char* p, struct stat* st, int f) {
      return self(c)->run<int>(Op::kFstatat, -1,
                               [&] { return real().fstatat(nullptr, d, p, st, f); });
    };
    table_.fstatvfs = [](void* c, int fd, struct statvfs* st) {
      return self(c)->run<int>(Op::kFstatvfs, -1, [&] { return real().fstatvfs(nullptr, fd, st); });
    };
    table_.fchmod = [](void* c, int fd, mode_t m) {
      return self(c)->run<int>(Op::kFchmod, -1, [&] { return real().fchmod(nullptr, fd, m); });
    };
    table_.fallocate = [](void* c, int fd, int m, off_t o, off_t l) {
      return self(c)->run<int>(Op::kFallocate, -1,
                               [&] { return real().fallocate(nullptr, fd, m, o, l); });
    };
    table_.ftruncate = [](void* c, int fd, off_t l) {
      return self(c)->run<int>(Op::kFtruncate, -1,
                               [&] { return real().ftruncate(nullptr, fd, l); });
    };
    table_.pread = [](void* c, int fd, void* b, std::size_t n, off_t o) {
      return self(c)->run<ssize_t>(Op::kPread, -1,
                                   [&] { return real().pread(nullptr, fd, b, n, o); });
    };
    table_.pwrite = [](void* c, int fd, const void* b, std::size_t n, off_t o) {
      return self(c)->run<ssize_t>(Op::kPwrite, -1,
                                   [&] { return real().pwrite(nullptr, fd, b, n, o); });
    };
    table_.linkat = [](void* c, int od, const char* op, int nd, const char* np, int f) {
      return self(c)->run<int>(Op::kLinkat, -1,
                               [&] { return real().linkat(nullptr, od, op, nd, np, f); });
    };
    table_.unlinkat = [](void* c, int d, const char* p, int f) {
      return self(c)->run<int>(Op::kUnlinkat, -1,
                               [&] { return real().unlinkat(nullptr, d, p, f); });
    };
    table_.mmap = [](void* c, void* a, std::size_t l, int p, int f, int fd, off_t o) {
      return self(c)->run<void*>(Op::kMmap, MAP_FAILED,
                                 [&] { return real().mmap(nullptr, a, l, p, f, fd, o); });
    };
    table_.munmap = [](void* c, void* a, std::size_t l) {
      return self(c)->run<int>(Op::kMunmap, -1, [&] { return real().munmap(nullptr, a, l); });
    };
    table_.madvise = [](void* c, void* a, std::size_t l, int adv) {
      return self(c)->run<int>(Op::kMadvise, -1,
                               [&] { return real().madvise(nullptr, a, l, adv); });
    };
    table_.flock = [](void* c, int fd, int op) {
      return self(c)->run<int>(Op::kFlock, -1, [&] { return real().flock(nullptr, fd, op); });
    };
    table_.fcntl_lock = [](void* c, int fd, int cmd, struct flock* l) {
      return self(c)->run<int>(Op::kFcntlLock, -1,
                               [&] { return real().fcntl_lock(nullptr, fd, cmd, l); });
    };
    table_.read_file = [](void* c, const char* p, std::string* out) {
      return self(c)->run<int>(Op::kReadFile, -1,
                               [&] { return real().read_file(nullptr, p, out); });
    };
    table_.list_dir = [](void* c, int d, std::vector<std::string>* names) {
      return self(c)->run<int>(Op::kListDir, -1,
                               [&] { return real().list_dir(nullptr, d, names); });
    };
    table_.fsync = [](void* c, int fd) {
      return self(c)->run<int>(Op::kFsync, -1, [&] { return real().fsync(nullptr, fd); });
    };
    table_.fdatasync = [](void* c, int fd) {
      return self(c)->run<int>(Op::kFdatasync, -1, [&] { return real().fdatasync(nullptr, fd); });
    };
    table_.fcntl_int = [](void* c, int fd, int cmd, int arg) {
      return self(c)->run<int>(Op::kFcntlInt, -1,
                               [&] { return real().fcntl_int(nullptr, fd, cmd, arg); });
    };
    table_.renameat = [](void* c, int od, const char* op, int nd, const char* np) {
      return self(c)->run<int>(Op::kRenameat, -1,
                               [&] { return real().renameat(nullptr, od, op, nd, np); });
    };
    table_.mkdirat = [](void* c, int d, const char* p, mode_t m) {
      return self(c)->run<int>(Op::kMkdirat, -1, [&] { return real().mkdirat(nullptr, d, p, m); });
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

 private:
  struct OpFault {
    int err = 0;
    bool after_real = false;
  };

  static FaultSyscalls* self(void* ctx) { return static_cast<FaultSyscalls*>(ctx); }
  static const Syscalls& real() { return real_syscalls(); }

  template <typename R, typename F>
  R run(Op op, R fail_value, F&& call) {
    int err = 0;
    bool after_real = false;
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
      if (err != 0) ++fired_;
      for (int key : {n, 0}) {
        if (auto it = before_.find({op, key}); it != before_.end() && !before_hook)
          before_hook = it->second;
        if (auto it = after_.find({op, key}); it != after_.end() && !after_hook)
          after_hook = it->second;
      }
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
  std::map<std::pair<Op, int>, std::function<void()>> before_;
  std::map<std::pair<Op, int>, std::function<void()>> after_;
  std::map<Op, int> counts_;
  std::vector<Op> calls_;
  int fired_ = 0;
};

}  // namespace kvoffload::test
