// /proc/PID/stat for the node pool's liveness test (proc_stat.hpp).
#include "pool/proc_stat.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/retry_eintr.hpp"

namespace kvoffload::pool::detail {

std::optional<ProcStat> read_proc_stat(pid_t pid) noexcept {
  if (pid <= 0) return std::nullopt;
  char path[64];
  (void)std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[1024];
  const ssize_t got =
      kvoffload::detail::retry_eintr([&] { return ::read(fd, buf, sizeof buf - 1); });
  ::close(fd);
  if (got <= 0) return std::nullopt;
  buf[got] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') return std::nullopt;
  ProcStat st;
  st.state = p[2];
  // Fields 3.. follow; start_time is field 22, i.e. the 20th after the state's.
  p += 3;
  for (int field = 4; field <= 22; ++field) {
    while (*p == ' ') ++p;
    if (*p == '\0') return std::nullopt;
    if (field == 22) {
      char* end = nullptr;
      st.start_time = std::strtoull(p, &end, 10);
      if (end == p) return std::nullopt;
      return st;
    }
    while (*p != ' ' && *p != '\0') ++p;
  }
  return std::nullopt;
}

bool process_alive(pid_t pid, std::uint64_t start_time) noexcept {
  const auto st = read_proc_stat(pid);
  return st && st->start_time == start_time && st->state != 'Z' && st->state != 'X' &&
         st->state != 'x';
}

}  // namespace kvoffload::pool::detail
