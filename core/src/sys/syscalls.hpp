#pragma once
// The test seam of the platform layer (docs/DESIGN.md §3.8): every system call the region code
// makes on its create, join, populate, teardown, list and clean paths, and every call the file
// tier makes on its records, goes through one of these function pointers. The real table is
// real_syscalls(); tests copy it and replace entries with functions that fail the Nth call with a
// chosen errno, record the call order, or pause / kill the process at a chosen point. There is no
// global state: `context` is handed back to every call, so tests with different fault plans can run
// side by side.
//
// Conventions: each entry behaves like the libc call of the same name (returns -1 / MAP_FAILED and
// sets errno on failure). The real table retries nothing; callers handle EINTR where it applies.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <string>
#include <vector>

#include <kvoffload/export.h>

namespace kvoffload {

struct Syscalls {
  void* context = nullptr;  // passed back as the first argument of every entry

  int (*openat)(void* ctx, int dirfd, const char* path, int flags, mode_t mode) = nullptr;
  int (*close)(void* ctx, int fd) = nullptr;
  int (*fstat)(void* ctx, int fd, struct stat* st) = nullptr;
  int (*fstatat)(void* ctx, int dirfd, const char* path, struct stat* st, int flags) = nullptr;
  int (*fstatvfs)(void* ctx, int fd, struct statvfs* st) = nullptr;
  int (*fchmod)(void* ctx, int fd, mode_t mode) = nullptr;
  int (*fallocate)(void* ctx, int fd, int mode, off_t offset, off_t len) = nullptr;
  int (*ftruncate)(void* ctx, int fd, off_t length) = nullptr;
  ssize_t (*pread)(void* ctx, int fd, void* buf, std::size_t count, off_t offset) = nullptr;
  ssize_t (*pwrite)(void* ctx, int fd, const void* buf, std::size_t count, off_t offset) = nullptr;
  int (*linkat)(void* ctx, int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                int flags) = nullptr;
  int (*unlinkat)(void* ctx, int dirfd, const char* path, int flags) = nullptr;
  void* (*mmap)(void* ctx, void* addr, std::size_t len, int prot, int flags, int fd,
                off_t offset) = nullptr;
  int (*munmap)(void* ctx, void* addr, std::size_t len) = nullptr;
  int (*madvise)(void* ctx, void* addr, std::size_t len, int advice) = nullptr;
  int (*flock)(void* ctx, int fd, int operation) = nullptr;
  // fcntl with a struct flock argument (F_OFD_SETLK / F_OFD_GETLK).
  int (*fcntl_lock)(void* ctx, int fd, int cmd, struct flock* lock) = nullptr;
  // Reads a whole small file (/proc/locks, /proc/self/cgroup, cgroup controls) into *out.
  // Returns 0, or -1 with errno set.
  int (*read_file)(void* ctx, const char* path, std::string* out) = nullptr;
  // Lists the names in the directory `dirfd` refers to (not "." / ".."); dirfd stays open and
  // owned by the caller. Returns 0, or -1 with errno set.
  int (*list_dir)(void* ctx, int dirfd, std::vector<std::string>* names) = nullptr;
  // The file tier's record I/O (FileTierOptions::syscalls).
  int (*fsync)(void* ctx, int fd) = nullptr;
  int (*fdatasync)(void* ctx, int fd) = nullptr;
  // fcntl with an int argument (F_GETFL / F_SETFL).
  int (*fcntl_int)(void* ctx, int fd, int cmd, int arg) = nullptr;
  int (*renameat)(void* ctx, int olddirfd, const char* oldpath, int newdirfd,
                  const char* newpath) = nullptr;
  int (*mkdirat)(void* ctx, int dirfd, const char* path, mode_t mode) = nullptr;
  // A file-tier record's pieces (its payload blocks in the caller's memory, its tail in a bounce
  // buffer) in one call: one request to the device per record, not one per piece.
  ssize_t (*preadv)(void* ctx, int fd, const struct iovec* iov, int iovcnt, off_t offset) = nullptr;
  ssize_t (*pwritev)(void* ctx, int fd, const struct iovec* iov, int iovcnt,
                     off_t offset) = nullptr;
  // A file-tier record's header, kept in an extended attribute of its file (Note [File tier
  // record]): in the inode, so the record's data is exactly its payload's blocks.
  int (*fsetxattr)(void* ctx, int fd, const char* name, const void* value, std::size_t size,
                   int flags) = nullptr;
  ssize_t (*fgetxattr)(void* ctx, int fd, const char* name, void* value,
                       std::size_t size) = nullptr;
};

// The table of the real system calls. Never null entries.
KVOFFLOAD_API const Syscalls& real_syscalls() noexcept;

}  // namespace kvoffload
