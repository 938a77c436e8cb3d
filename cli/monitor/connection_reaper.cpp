// Note [Exporter connections] (connection_reaper.hpp).
#include "monitor/connection_reaper.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <set>
#include <vector>

#include "util/log.hpp"

namespace kvoffload::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The local port of a TCP socket, or 0 when `fd` is something else.
std::uint16_t local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

bool has_peer(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
}

struct Connection {
  int fd;
  ino_t inode;
};

// The sockets of this process on local `port`: the connected ones (with a peer) or the listening
// ones (without).
std::vector<Connection> sockets_on(std::uint16_t port, bool connected) {
  std::vector<Connection> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  const int self = ::dirfd(dir);
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == self) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (local_port(static_cast<int>(fd)) != port || has_peer(static_cast<int>(fd)) != connected) {
      continue;
    }
    out.push_back({static_cast<int>(fd), st.st_ino});
  }
  ::closedir(dir);
  return out;
}

// Shuts `c` down if its descriptor still names the same socket (it may have been closed and
// reused since the listing; then it is left to the next sweep).
bool shut_down(const Connection& c) {
  struct stat st {};
  if (::fstat(c.fd, &st) != 0 || st.st_ino != c.inode) return false;
  return ::shutdown(c.fd, SHUT_RDWR) == 0;
}

}  // namespace

bool raise_listen_backlog(std::uint16_t port) {
  bool raised = false;
  for (const Connection& l : sockets_on(port, /*connected=*/false)) {
    raised = ::listen(l.fd, SOMAXCONN) == 0 || raised;
  }
  return raised;
}

ConnectionReaper::ConnectionReaper(std::uint16_t port, std::chrono::milliseconds limit)
    : port_(port), limit_(limit), thread_([this] { run(); }) {}

ConnectionReaper::~ConnectionReaper() {
  {
    const std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ConnectionReaper::close_all() noexcept {
  {
    const std::lock_guard lock(mu_);
    closing_ = true;
  }
  wake_.notify_all();
}

std::uint64_t ConnectionReaper::reaped() const noexcept {
  const std::lock_guard lock(mu_);
  return reaped_;
}

void ConnectionReaper::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    sweep();
    lock.lock();
    // Often enough that a limit of 1 s is kept to within a quarter of a second; at stop, faster.
    wake_.wait_for(lock, closing_ ? std::chrono::milliseconds(20) : std::chrono::milliseconds(250),
                   [&] { return stop_; });
  }
}

void ConnectionReaper::sweep() {
  const auto now = Clock::now();
  bool closing = false;
  {
    const std::lock_guard lock(mu_);
    closing = closing_;
  }
  std::set<ino_t> present;
  for (const Connection& c : sockets_on(port_, /*connected=*/true)) {
    present.insert(c.inode);
    Seen& seen = seen_.try_emplace(c.inode, Seen{.first = now}).first->second;
    if (closing) {
      (void)shut_down(c);
      continue;
    }
    if (!seen.shut && now - seen.first > limit_ && shut_down(c)) {
      seen.shut = true;
      log().info("exporter: closed a connection that stayed open past --request-timeout ({} ms)",
                 limit_.count());
      const std::lock_guard lock(mu_);
      ++reaped_;
    }
  }
  std::erase_if(seen_, [&](const auto& entry) { return !present.contains(entry.first); });
}

}  // namespace kvoffload::cli
