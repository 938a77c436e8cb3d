#include "tier/file/direct_io.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>

#include <kvoffload/log.hpp>

#include "util/retry_eintr.hpp"

namespace kvoffload {

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
    int fd = sys_.openat(sys_.context, AT_FDCWD, path.c_str(), flags | O_DIRECT, 0600);
    if (fd >= 0) {
      used_direct = true;
      return fd;
    }
    if (errno != EINVAL) return -1;
    // Some filesystems create the file before refusing the flag; ours is a unique temp name.
    if ((flags & O_CREAT) != 0) (void)sys_.unlinkat(sys_.context, AT_FDCWD, path.c_str(), 0);
    disable("open", path);
  }
  return sys_.openat(sys_.context, AT_FDCWD, path.c_str(), flags, 0600);
}

bool DirectIo::drop_direct(int fd, const std::filesystem::path& path, std::string_view where) {
  disable(where, path);
  const int fl = sys_.fcntl_int(sys_.context, fd, F_GETFL, 0);
  return fl >= 0 && sys_.fcntl_int(sys_.context, fd, F_SETFL, fl & ~O_DIRECT) == 0;
}

std::optional<ItemOutcome> DirectIo::write_all(int fd, const std::byte* buf, std::size_t n,
                                               bool& used_direct, const std::filesystem::path& path,
                                               off_t at) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t r = retry_eintr([&] {
      return sys_.pwrite(sys_.context, fd, buf + off, n - off, at + static_cast<off_t>(off));
    });
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
                                              bool& used_direct, const std::filesystem::path& path,
                                              off_t at) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t r = retry_eintr([&] {
      return sys_.pread(sys_.context, fd, buf + off, n - off, at + static_cast<off_t>(off));
    });
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
