// The rank processes of `kvoffload run`: spawn, receive, stop (see ranks.hpp).
#include "ranks.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include <kvoffload/error.hpp>

namespace kvoffload::run {

using Clock = std::chrono::steady_clock;

std::vector<RankProcess> spawn_ranks(std::uint32_t world_size) {
  std::vector<RankProcess> ranks;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (std::uint32_t r = 0; r < world_size; ++r) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      throw_system_error("socketpair", errno, "for rank " + std::to_string(r));
    }
    const std::string fd_text = std::to_string(fds[1]);
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      throw_system_error("fork", err, "for rank " + std::to_string(r));
    }
    if (pid == 0) {
      ::fcntl(fds[1], F_SETFD, 0);  // the one descriptor the rank inherits
      ::execl(self.c_str(), "kvoffload", "run-worker", "--fd", fd_text.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    RankProcess& rank = ranks.emplace_back();
    rank.pid = pid;
    rank.channel = std::make_unique<Channel>(fds[0]);
  }
  return ranks;
}

void stop_ranks(std::vector<RankProcess>& ranks, bool graceful, nlohmann::json* byes) {
  for (auto& r : ranks) {
    if (graceful && r.channel) {
      try {
        r.channel->send({{"op", "exit"}});
        auto bye = r.channel->receive(std::chrono::seconds(30));
        if (bye && byes != nullptr) byes->push_back(*bye);
      } catch (const std::exception&) {
        // already gone; waitpid below collects it
      }
    }
    if (r.channel) r.channel->close();  // EOF ends a rank that did not get "exit"
  }
  for (auto& r : ranks) {
    if (r.pid <= 0 || r.wait_status) continue;
    int status = 0;
    for (int i = 0; i < 300; ++i) {  // up to 30 s, then SIGKILL
      const pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      if (done == r.pid) {
        r.wait_status = status;
        break;
      }
      if (done < 0) break;
      if (i == 299) {
        ::kill(r.pid, SIGKILL);
        if (::waitpid(r.pid, &status, 0) == r.pid) r.wait_status = status;
      }
      ::usleep(100'000);
    }
  }
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) +
           (abbrev != nullptr ? " (SIG" + std::string(abbrev) + ")" : std::string()) +
           (WCOREDUMP(status) ? ", core dumped" : "");
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended with wait status " + std::to_string(status);
}

std::string describe_lost_ranks(const std::vector<RankProcess>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankProcess& r = ranks[i];
    if (!r.lost) continue;
    out += (out.empty() ? "" : "; ") + std::string("rank ") + std::to_string(i) + " (PID " +
           std::to_string(r.pid) + ") " +
           (r.wait_status ? describe_wait_status(*r.wait_status)
                          : std::string("closed its channel and could not be reaped"));
  }
  return out;
}

void send_to(RankProcess& rank, std::uint32_t index, const nlohmann::json& message) {
  try {
    rank.channel->send(message);
  } catch (const Error& e) {
    rank.lost = true;
    throw Error(e.code(), "rank " + std::to_string(index) + ": " + e.what(), e.sys_errno(),
                e.call());
  }
}

nlohmann::json receive_from(RankProcess& rank, std::uint32_t index, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    std::optional<nlohmann::json> m;
    try {
      m = rank.channel->receive(std::chrono::milliseconds(200));
    } catch (const Error& e) {
      rank.lost = true;
      throw Error(e.code(), "rank " + std::to_string(index) + ": " + e.what(), e.sys_errno(),
                  e.call());
    }
    if (m) {
      if (m->value("op", "") == "error") {
        throw Error(ErrorCode::kState, "rank " + std::to_string(index) + " failed to start: " +
                                           m->value("message", std::string("unknown error")));
      }
      return *m;
    }
  }
  throw Error(ErrorCode::kTimeout, "rank " + std::to_string(index) + " did not answer within " +
                                       std::to_string(timeout.count()) + " s");
}

}  // namespace kvoffload::run
