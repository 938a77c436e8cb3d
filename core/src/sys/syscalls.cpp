#include "sys/syscalls.hpp"

#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvoffload {
namespace {

int real_openat(void*, int dirfd, const char* path, int flags, mode_t mode) {
  return ::openat(dirfd, path, flags, mode);
}
int real_close(void*, int fd) {
  return ::close(fd);
}
int real_fstat(void*, int fd, struct stat* st) {
  return ::fstat(fd, st);
}
int real_fstatat(void*, int dirfd, const char* path, struct stat* st, int flags) {
  return ::fstatat(dirfd, path, st, flags);
}
int real_fstatvfs(void*, int fd, struct statvfs* st) {
  return ::fstatvfs(fd, st);
}
int real_fchmod(void*, int fd, mode_t mode) {
  return ::fchmod(fd, mode);
}
int real_fallocate(void*, int fd, int mode, off_t offset, off_t len) {
  return ::fallocate(fd, mode, offset, len);
}
int real_ftruncate(void*, int fd, off_t length) {
  return ::ftruncate(fd, length);
}
ssize_t real_pread(void*, int fd, void* buf, std::size_t count, off_t offset) {
  return ::pread(fd, buf, count, offset);
}
ssize_t real_pwrite(void*, int fd, const void* buf, std::size_t count, off_t offset) {
  return ::pwrite(fd, buf, count, offset);
}
int real_linkat(void*, int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                int flags) {
  return ::linkat(olddirfd, oldpath, newdirfd, newpath, flags);
}
int real_unlinkat(void*, int dirfd, const char* path, int flags) {
  return ::unlinkat(dirfd, path, flags);
}
void* real_mmap(void*, void* addr, std::size_t len, int prot, int flags, int fd, off_t offset) {
  return ::mmap(addr, len, prot, flags, fd, offset);
}
int real_munmap(void*, void* addr, std::size_t len) {
  return ::munmap(addr, len);
}
int real_madvise(void*, void* addr, std::size_t len, int advice) {
  return ::madvise(addr, len, advice);
}
int real_flock(void*, int fd, int operation) {
  return ::flock(fd, operation);
}
int real_fcntl_lock(void*, int fd, int cmd, struct flock* lock) {
  return ::fcntl(fd, cmd, lock);
}

int real_read_file(void*, const char* path, std::string* out) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  out->clear();
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      errno = err;
      return -1;
    }
    if (n == 0) break;
    out->append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return 0;
}

int real_list_dir(void*, int dirfd, std::vector<std::string>* names) {
  // fdopendir takes ownership of its descriptor, so list through a duplicate.
  const int dup_fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup_fd < 0) return -1;
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(dup_fd);
    errno = err;
    return -1;
  }
  names->clear();
  errno = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0) {
      names->emplace_back(entry->d_name);
    }
  }
  const int err = errno;
  ::closedir(dir);
  errno = err;
  return err == 0 ? 0 : -1;
}

int real_fsync(void*, int fd) {
  return ::fsync(fd);
}
int real_fdatasync(void*, int fd) {
  return ::fdatasync(fd);
}
int real_fcntl_int(void*, int fd, int cmd, int arg) {
  return ::fcntl(fd, cmd, arg);
}
int real_renameat(void*, int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  return ::renameat(olddirfd, oldpath, newdirfd, newpath);
}
int real_mkdirat(void*, int dirfd, const char* path, mode_t mode) {
  return ::mkdirat(dirfd, path, mode);
}
ssize_t real_preadv(void*, int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  return ::preadv(fd, iov, iovcnt, offset);
}
ssize_t real_pwritev(void*, int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  return ::pwritev(fd, iov, iovcnt, offset);
}
int real_fsetxattr(void*, int fd, const char* name, const void* value, std::size_t size,
                   int flags) {
  return ::fsetxattr(fd, name, value, size, flags);
}
ssize_t real_fgetxattr(void*, int fd, const char* name, void* value, std::size_t size) {
  return ::fgetxattr(fd, name, value, size);
}

constexpr Syscalls kReal{
    .context = nullptr,
    .openat = real_openat,
    .close = real_close,
    .fstat = real_fstat,
    .fstatat = real_fstatat,
    .fstatvfs = real_fstatvfs,
    .fchmod = real_fchmod,
    .fallocate = real_fallocate,
    .ftruncate = real_ftruncate,
    .pread = real_pread,
    .pwrite = real_pwrite,
    .linkat = real_linkat,
    .unlinkat = real_unlinkat,
    .mmap = real_mmap,
    .munmap = real_munmap,
    .madvise = real_madvise,
    .flock = real_flock,
    .fcntl_lock = real_fcntl_lock,
    .read_file = real_read_file,
    .list_dir = real_list_dir,
    .fsync = real_fsync,
    .fdatasync = real_fdatasync,
    .fcntl_int = real_fcntl_int,
    .renameat = real_renameat,
    .mkdirat = real_mkdirat,
    .preadv = real_preadv,
    .pwritev = real_pwritev,
    .fsetxattr = real_fsetxattr,
    .fgetxattr = real_fgetxattr,
};

}  // namespace

const Syscalls& real_syscalls() noexcept {
  return kReal;
}

}  // namespace kvoffload
