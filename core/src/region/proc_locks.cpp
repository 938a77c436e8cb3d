#include "region/proc_locks.hpp"

#include <sys/sysmacros.h>

#include <cerrno>
#include <charconv>
#include <string>

#include "kvoffload/error.hpp"

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

}  // namespace

std::uint32_t count_flock_holders(std::string_view text, dev_t dev, ino_t ino) {
  // A line: "1: FLOCK  ADVISORY  READ 8378 00:1a:3 0 EOF"; a waiter: "1: -> FLOCK ...".
  std::uint32_t holders = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);

    next_field(line);  // "N:"
    const std::string_view kind = next_field(line);
    if (kind != "FLOCK") continue;
    next_field(line);                              // ADVISORY / MANDATORY
    next_field(line);                              // READ / WRITE
    next_field(line);                              // pid
    const std::string_view id = next_field(line);  // MAJ:MIN:INODE (hex:hex:decimal)
    const auto c1 = id.find(':');
    const auto c2 = id.find(':', c1 == std::string_view::npos ? 0 : c1 + 1);
    if (c1 == std::string_view::npos || c2 == std::string_view::npos) continue;
    unsigned maj = 0;
    unsigned min = 0;
    unsigned long long inode = 0;
    if (!parse(id.substr(0, c1), maj, 16) || !parse(id.substr(c1 + 1, c2 - c1 - 1), min, 16) ||
        !parse(id.substr(c2 + 1), inode, 10)) {
      continue;
    }
    if (maj == major(dev) && min == minor(dev) && inode == static_cast<unsigned long long>(ino)) {
      ++holders;
    }
  }
  return holders;
}

std::uint32_t flock_holders(const Syscalls& sys, dev_t dev, ino_t ino) {
  std::string text;
  if (sys.read_file(sys.context, "/proc/locks", &text) != 0) {
    throw_system_error("read", errno, "of /proc/locks (counting the holders of a region)");
  }
  return count_flock_holders(text, dev, ino);
}

}  // namespace kvoffload::detail
