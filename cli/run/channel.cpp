#include "channel.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <kvoffload/error.hpp>

namespace kvoffload::run {

Channel::~Channel() {
  close();
}

void Channel::close() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Channel::send(const nlohmann::json& message) {
  std::string line = message.dump();
  line += '\n';
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_system_error("send", errno, "to a run process (it exited)");
    }
    done += static_cast<std::size_t>(n);
  }
}

std::optional<nlohmann::json> Channel::receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
      const std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      try {
        return nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorCode::kInternal,
                    "malformed message from a run process: " + std::string(e.what()));
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0) {
      if (errno == EINTR) return std::nullopt;  // let the caller look at its stop flag
      throw_system_error("poll", errno, "on a run channel");
    }
    if (ready == 0) return std::nullopt;
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_system_error("recv", errno, "from a run process");
    }
    if (n == 0)
      throw Error(ErrorCode::kSystem, "a run process closed its channel (it exited)", EPIPE,
                  "recv");
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace kvoffload::run
