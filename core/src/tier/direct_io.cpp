#include "tier/direct_io.hpp"

#include "kvoffload/log.hpp"
#include "util/retry_eintr.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>

namespace kvoffload {

// ---- FileTierIo: the real system calls ----------------------------------------------------------

int FileTierIo::open(const char* path, int flags, mode_t mode) {
  return ::open(path, flags, mode);
}
int FileTierIo::close(int fd) {
  return ::close(fd);
}
ssize_t FileTierIo::pread(int fd, void* buf, std::size_t count, off_t offset) {
  return ::pread(fd, buf, count, offset);
}
ssize_t FileTierIo::pwrite(int fd, const void* buf, std::size_t count, off_t offset) {
  return ::pwrite(fd, buf, count, offset);
}
int FileTierIo::fdatasync(int fd) {
  return ::fdatasync(fd);
}
int FileTierIo::fsync(int fd) {
  return ::fsync(fd);
}
int FileTierIo::fstat(int fd, struct stat* st) {
  return ::fstat(fd, st);
}
int FileTierIo::fcntl_setfl(int fd, int flags) {
  return ::fcntl(fd, F_SETFL, flags);
}
int FileTierIo::fcntl_getfl(int fd) {
  return ::fcntl(fd, F_GETFL);
}
int FileTierIo::rename(const char* from, const char* to) {
  return ::rename(from, to);
}
int FileTierIo::unlink(const char* path) {
  return ::unlink(path);
}
int FileTierIo::mkdir(const char* path, mode_t mode) {
  return ::mkdir(path, mode);
}
int FileTierIo::flock(int fd, int operation) {
  return ::flock(fd, operation);
}
int FileTierIo::fstatvfs(int fd, struct statvfs* st) {
  return ::fstatvfs(fd, st);
}

std::shared_ptr<FileTierIo> FileTierIo::system() {
  static const auto instance = std::make_shared<FileTierIo>();
  return instance;
}

// ---- DirectIo
// -------------------------------------------------------------------------------------

namespace detail {

void DirectIo::disable(std::string_view where, const std::filesystem::path& path) {
  direct_.store(false);
  std::call_once(fallback_logged_, [&] {
    log().warn("file tier '{}': O_DIRECT refused ({} of {}: EINVAL); using buffered I/O", name_,
               where, path.string());
  });
}

int DirectIo::open_record(const std::filesystem::path& path, int flags, bool& used_direct) {
  used_direct = false;
  if (direct_.load()) {
    int fd = io_.open(path.c_str(), flags | O_DIRECT, 0600);
    if (fd >= 0) {
      used_direct = true;
      return fd;
    }
    if (errno != EINVAL) return -1;
    // Some filesystems create the file before refusing the flag; ours is a unique temp name.
    if ((flags & O_CREAT) != 0) io_.unlink(path.c_str());
    disable("open", path);
  }
  return io_.open(path.c_str(), flags, 0600);
}

bool DirectIo::drop_direct(int fd, const std::filesystem::path& path, std::string_view where) {
  disable(where, path);
  const int fl = io_.fcntl_getfl(fd);
  return fl >= 0 && io_.fcntl_setfl(fd, fl & ~O_DIRECT) == 0;
}

std::optional<ItemOutcome> DirectIo::write_all(int fd, const std::byte* buf, std::size_t n,
                                               bool& used_direct,
                                               const std::filesystem::path& path) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t r =
        retry_eintr([&] { return io_.pwrite(fd, buf + off, n - off, static_cast<off_t>(off)); });
    if (r < 0) {
      const int e = errno;
      if (e == EINVAL && used_direct) {
        used_direct = false;
        if (drop_direct(fd, path, "write")) continue;
        return ItemOutcome::failed("fcntl(F_SETFL) clearing O_DIRECT", errno);
      }
      return ItemOutcome::failed("pwrite " + path.string(), e);
    }
    if (r == 0) return ItemOutcome::failed("pwrite " + path.string() + " (wrote 0 bytes)", EIO);
    off += static_cast<std::size_t>(r);
  }
  return std::nullopt;
}

std::optional<ItemOutcome> DirectIo::read_all(int fd, std::byte* buf, std::size_t n,
                                              bool& used_direct,
                                              const std::filesystem::path& path) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t r =
        retry_eintr([&] { return io_.pread(fd, buf + off, n - off, static_cast<off_t>(off)); });
    if (r < 0) {
      const int e = errno;
      if (e == EINVAL && used_direct) {
        used_direct = false;
        if (drop_direct(fd, path, "read")) continue;
        return ItemOutcome::failed("fcntl(F_SETFL) clearing O_DIRECT", errno);
      }
      return ItemOutcome::failed("pread " + path.string(), e);
    }
    if (r == 0) return ItemOutcome::miss("record ends early (short file)", true);
    off += static_cast<std::size_t>(r);
  }
  return std::nullopt;
}

}  // namespace detail
}  // namespace kvoffload
