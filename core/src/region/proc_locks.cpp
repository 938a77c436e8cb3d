#include "region/proc_locks.hpp"

#include <sys/sysmacros.h>

#include <cerrno>
#include <charconv>
#include <limits>
#include <string>

#include <kvoffload/error.hpp>

namespace kvoffload::detail {
namespace {

// Splits off the next whitespace-separated field.
std::string_view next_field(std::string_view& line) {
  const auto start = line.find_first_not_of(" \t");
  if (start == std::string_view::npos) {
    line = {};
    return {};
  }
  line.remove_prefix(start);
  const auto end = line.find_first_of(" \t");
  const std::string_view field = line.substr(0, end);
  line.remove_prefix(end == std::string_view::npos ? line.size() : end);
  return field;
}

template <typename T>
bool parse(std::string_view s, T& out, int base) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// One granted lock of /proc/locks:
//   "1: FLOCK  ADVISORY  READ 8378 00:1a:3 0 EOF"
//   "2: OFDLCK ADVISORY  WRITE -1 00:1a:3 1024 1024"
// A blocked waiter ("1: -> FLOCK ...") has "->" where the kind is, so it never matches a kind.
struct LockLine {
  std::string_view kind;  // FLOCK, POSIX, OFDLCK, ...
  std::string_view mode;  // READ / WRITE
  bool on_file = false;   // the lock is on the (dev, ino) asked for
  std::uint64_t first = 0;
  std::uint64_t last = 0;  // inclusive; EOF: the largest value
};

LockLine parse_line(std::string_view line, dev_t dev, ino_t ino) {
  LockLine out;
  next_field(line);  // "N:"
  out.kind = next_field(line);
  next_field(line);  // ADVISORY / MANDATORY
  out.mode = next_field(line);
  next_field(line);                              // pid
  const std::string_view id = next_field(line);  // MAJ:MIN:INODE (hex:hex:decimal)
  const auto c1 = id.find(':');
  const auto c2 = id.find(':', c1 == std::string_view::npos ? 0 : c1 + 1);
  if (c1 == std::string_view::npos || c2 == std::string_view::npos) return out;
  unsigned maj = 0;
  unsigned min = 0;
  unsigned long long inode = 0;
  if (!parse(id.substr(0, c1), maj, 16) || !parse(id.substr(c1 + 1, c2 - c1 - 1), min, 16) ||
      !parse(id.substr(c2 + 1), inode, 10)) {
    return out;
  }
  out.on_file =
      maj == major(dev) && min == minor(dev) && inode == static_cast<unsigned long long>(ino);
  const std::string_view first = next_field(line);
  const std::string_view last = next_field(line);
  if (!parse(first, out.first, 10)) out.first = 0;
  if (last == "EOF" || !parse(last, out.last, 10))
    out.last = std::numeric_limits<std::uint64_t>::max();
  return out;
}

template <typename Fn>
void for_each_lock(std::string_view text, dev_t dev, ino_t ino, Fn&& fn) {
  while (!text.empty()) {
    const auto nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    const LockLine lock = parse_line(line, dev, ino);
    if (lock.on_file) fn(lock);
  }
}

}  // namespace

std::uint32_t count_flock_holders(std::string_view text, dev_t dev, ino_t ino) {
  std::uint32_t holders = 0;
  for_each_lock(text, dev, ino, [&](const LockLine& l) {
    if (l.kind == "FLOCK") ++holders;
  });
  return holders;
}

std::vector<LockedRange> ofd_write_locks(std::string_view text, dev_t dev, ino_t ino) {
  std::vector<LockedRange> ranges;
  for_each_lock(text, dev, ino, [&](const LockLine& l) {
    if (l.kind == "OFDLCK" && l.mode == "WRITE") ranges.push_back({l.first, l.last});
  });
  return ranges;
}

int read_proc_locks(const Syscalls& sys, std::string* text) {
  std::string previous;
  if (sys.read_file(sys.context, "/proc/locks", &previous) != 0) return errno;
  for (int attempt = 1; attempt < 8; ++attempt) {
    if (sys.read_file(sys.context, "/proc/locks", text) != 0) return errno;
    if (*text == previous) return 0;
    previous.swap(*text);
  }
  *text = std::move(previous);
  return 0;
}

std::uint32_t flock_holders(const Syscalls& sys, dev_t dev, ino_t ino) {
  std::string text;
  if (read_proc_locks(sys, &text) != 0) {
    throw_system_error("read", errno, "of /proc/locks (counting the holders of a region)");
  }
  return count_flock_holders(text, dev, ino);
}

}  // namespace kvoffload::detail
