#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include <kvoffload/error.hpp>
#include <kvoffload/platform.hpp>

#include "region/populate.hpp"
#include "sys/sys.hpp"
#include "sys/syscalls.hpp"

namespace kvoffload::platform {
namespace {

const Syscalls& table(const Syscalls* sys) {
  return sys != nullptr ? *sys : real_syscalls();
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// Value of `key` in a memory.stat file, or 0.
std::uint64_t stat_value(const std::string& text, std::string_view key) {
  std::istringstream in(text);
  std::string k;
  std::uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

struct CgroupLevel {
  std::uint64_t limit = 0;
  std::uint64_t available = 0;
};

// Limits along this process's memory cgroup path, from the leaf up to the mount root. v1 reports
// "no limit" as a huge page-rounded value; anything at or above 2^62 is treated as unlimited.
std::vector<CgroupLevel> cgroup_levels(const Syscalls& sys) {
  std::string self;
  if (sys.read_file(sys.context, "/proc/self/cgroup", &self) != 0) return {};
  std::string v1_path;
  std::string v2_path;
  std::istringstream in(self);
  for (std::string line; std::getline(in, line);) {
    const auto c1 = line.find(':');
    const auto c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string path = line.substr(c2 + 1);
    if (line.compare(0, c1, "0") == 0 && controllers.empty()) {
      v2_path = path;
    } else {
      std::istringstream cs(controllers);
      for (std::string c; std::getline(cs, c, ',');) {
        if (c == "memory") v1_path = path;
      }
    }
  }
  struct Flavour {
    std::string root, rel, limit, usage, inactive;
  };
  std::vector<Flavour> flavours;
  if (!v1_path.empty()) {
    flavours.push_back({"/sys/fs/cgroup/memory", v1_path, "memory.limit_in_bytes",
                        "memory.usage_in_bytes", "total_inactive_file"});
  }
  if (!v2_path.empty()) {
    flavours.push_back(
        {"/sys/fs/cgroup", v2_path, "memory.max", "memory.current", "inactive_file"});
  }
  std::vector<CgroupLevel> levels;
  for (const Flavour& f : flavours) {
    std::string rel = f.rel;
    for (;;) {
      const std::string dir = f.root + (rel == "/" ? "" : rel);
      std::string text;
      if (sys.read_file(sys.context, (dir + "/" + f.limit).c_str(), &text) == 0) {
        const auto limit = parse_u64(text);
        if (limit && *limit < (1ULL << 62)) {
          CgroupLevel level{.limit = *limit, .available = *limit};
          std::string usage_text;
          std::string stat_text;
          if (sys.read_file(sys.context, (dir + "/" + f.usage).c_str(), &usage_text) == 0) {
            if (auto usage = parse_u64(usage_text)) {
              std::uint64_t inactive = 0;
              if (sys.read_file(sys.context, (dir + "/memory.stat").c_str(), &stat_text) == 0) {
                inactive = stat_value(stat_text, f.inactive);
              }
              const std::uint64_t used = *usage > inactive ? *usage - inactive : 0;
              level.available = used < *limit ? *limit - used : 0;
            }
          }
          levels.push_back(level);
        }
      }
      if (rel.empty() || rel == "/") break;
      const auto slash = rel.find_last_of('/');
      rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
    }
  }
  return levels;
}

}  // namespace

std::size_t page_size() {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<std::size_t>(page) : 4096;
}

FsSpace filesystem_space(const std::filesystem::path& dir, const Syscalls* syscalls) {
  const Syscalls& sys = table(syscalls);
  const int fd = detail::retry_eintr([&] {
    return sys.openat(sys.context, AT_FDCWD, dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  });
  if (fd < 0) throw_system_error("open", errno, dir.string());
  const detail::UniqueFd owned(sys, fd);
  struct statvfs st {};
  if (sys.fstatvfs(sys.context, fd, &st) != 0) {
    throw_system_error("fstatvfs", errno, "of " + dir.string());
  }
  return {.free_bytes = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize,
          .total_bytes = static_cast<std::uint64_t>(st.f_blocks) * st.f_frsize};
}

std::optional<std::uint64_t> memory_cgroup_limit(const Syscalls* syscalls) {
  std::optional<std::uint64_t> best;
  for (const auto& level : cgroup_levels(table(syscalls))) {
    best = best ? std::min(*best, level.limit) : level.limit;
  }
  return best;
}

std::optional<std::uint64_t> memory_cgroup_available(const Syscalls* syscalls) {
  std::optional<std::uint64_t> best;
  for (const auto& level : cgroup_levels(table(syscalls))) {
    best = best ? std::min(*best, level.available) : level.available;
  }
  return best;
}

bool madv_populate_write_supported() {
  const std::size_t page = page_size();
  void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = ::madvise(p, page, MADV_POPULATE_WRITE) == 0;
  ::munmap(p, page);
  return ok;
}

std::vector<int> numa_nodes() {
  std::ifstream in("/sys/devices/system/node/online");
  std::string text;
  std::vector<int> nodes;
  if (in && std::getline(in, text)) {
    std::istringstream parts(text);
    for (std::string part; std::getline(parts, part, ',');) {
      int lo = 0;
      int hi = 0;
      const auto dash = part.find('-');
      const std::string a = part.substr(0, dash);
      const std::string b = dash == std::string::npos ? a : part.substr(dash + 1);
      if (std::from_chars(a.data(), a.data() + a.size(), lo).ec != std::errc() ||
          std::from_chars(b.data(), b.data() + b.size(), hi).ec != std::errc()) {
        continue;
      }
      for (int n = lo; n <= hi; ++n) nodes.push_back(n);
    }
  }
  if (nodes.empty()) nodes.push_back(0);
  return nodes;
}

}  // namespace kvoffload::platform
