#pragma once
// A JSON-lines channel over a connected socket: how the `kvoffload run` scheduler talks to its
// rank processes (one message per request, so the cost of text is irrelevant next to the copies).

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace kvoffload::run {

class Channel {
 public:
  explicit Channel(int fd) noexcept : fd_(fd) {}
  Channel(Channel&& other) noexcept : fd_(other.fd_), buffer_(std::move(other.buffer_)) {
    other.fd_ = -1;
  }
  Channel& operator=(Channel&&) = delete;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel();

  [[nodiscard]] int fd() const noexcept { return fd_; }
  // Throws kSystem when the peer is gone.
  void send(const nlohmann::json& message);
  // The next message; nullopt on timeout. Throws kSystem on EOF (the peer exited) or an error,
  // kInternal on a malformed line.
  std::optional<nlohmann::json> receive(std::chrono::milliseconds timeout);
  void close() noexcept;

 private:
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace kvoffload::run
