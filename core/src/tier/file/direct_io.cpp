#include "tier/file/direct_io.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <string>

#include "util/log.hpp"
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

std::optional<ItemOutcome> DirectIo::transfer(int fd, std::span<const struct iovec> pieces,
                                              bool& used_direct, const std::filesystem::path& path,
                                              off_t at, bool write) {
  std::array<struct iovec, kMaxPieces> left{};
  if (pieces.size() > left.size()) {
    return ItemOutcome::failed("record I/O of " + std::to_string(pieces.size()) + " pieces", E2BIG);
  }
  std::size_t n = 0;
  for (const struct iovec& p : pieces) {
    if (p.iov_len != 0) left[n++] = p;
  }
  std::size_t first = 0;  // left[first, n) is still to move
  const char* call = write ? "pwrite" : "pread";
  while (first < n) {
    const auto count = static_cast<int>(n - first);
    const ssize_t r = retry_eintr([&] {
      return write ? sys_.pwritev(sys_.context, fd, &left[first], count, at)
                   : sys_.preadv(sys_.context, fd, &left[first], count, at);
    });
    if (r < 0) {
      const int e = errno;
      if (e == EINVAL && used_direct) {
        used_direct = false;
        if (drop_direct(fd, path, write ? "write" : "read")) continue;
        return ItemOutcome::failed("fcntl(F_SETFL) clearing O_DIRECT", errno);
      }
      return ItemOutcome::failed(std::string(call) + " " + path.string(), e);
    }
    if (r == 0) {
      if (write) return ItemOutcome::failed("pwrite " + path.string() + " (wrote 0 bytes)", EIO);
      return ItemOutcome::miss("record ends early (short file)", true);
    }
    at += static_cast<off_t>(r);
    auto done = static_cast<std::size_t>(r);
    while (first < n && done >= left[first].iov_len) done -= left[first++].iov_len;
    if (first < n) {
      left[first].iov_base = static_cast<char*>(left[first].iov_base) + done;
      left[first].iov_len -= done;
    }
  }
  return std::nullopt;
}

std::optional<ItemOutcome> DirectIo::write_all(int fd, std::span<const struct iovec> pieces,
                                               bool& used_direct, const std::filesystem::path& path,
                                               off_t at) {
  return transfer(fd, pieces, used_direct, path, at, true);
}

std::optional<ItemOutcome> DirectIo::read_all(int fd, std::span<const struct iovec> pieces,
                                              bool& used_direct, const std::filesystem::path& path,
                                              off_t at) {
  return transfer(fd, pieces, used_direct, path, at, false);
}

}  // namespace detail
}  // namespace kvoffload
