#pragma once
// One RESP connection over hiredis (why the I/O is ours: the top of remote_redis.cpp), the class
// and the names its parts share. Requests and connecting are in remote_redis.cpp, the reply
// reader in remote_redis_replies.cpp, probes and CLUSTER SLOTS in remote_redis_probe.cpp.

#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include <kvoffload/error.hpp>

#include "tier/remote/remote_ops.hpp"
#include "tier/remote/remote_tls.hpp"

namespace kvoffload::detail {

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept {
    if (r != nullptr) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

inline int remaining_ms(RemoteClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - RemoteClock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

class RedisConnection final : public StoreConnection {
 public:
  RedisConnection(redisContext* c, ValuePool* pool) : c_(c), pool_(pool), buffer_(256 * 1024) {}
  ~RedisConnection() override {
    tls_.reset();  // its close_notify goes out before the socket closes
    redisFree(c_);
  }

  // From now on every byte goes through TLS (rediss://): handshakes on the connected socket.
  void start_tls(const RemoteTls& tls, const RemoteEndpoint& endpoint,
                 RemoteClock::time_point deadline) {
    tls_ = std::make_unique<TlsStream>(c_->fd, tls, endpoint, deadline);
  }

  bool run(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
           std::string& error) override;

  // One command, for setup and probes.
  ReplyPtr command(std::initializer_list<std::string_view> argv, RemoteClock::time_point deadline,
                   std::string& error);

 private:
  // ---- requests (remote_redis.cpp) ----
  bool write_requests(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
                      std::string& error);
  bool write_all(iovec* iov, std::size_t count, RemoteClock::time_point deadline,
                 std::string& error);

  // ---- replies (remote_redis_replies.cpp) ----
  ReplyPtr read_reply(RemoteClock::time_point deadline, std::string& error);
  bool fill(RemoteClock::time_point deadline, std::string& error);
  ssize_t recv_some(char* dst, std::size_t len, RemoteClock::time_point deadline,
                    std::string& error);
  bool wait_socket(short events, RemoteClock::time_point deadline, std::string& error);
  bool read_line(std::string_view& line, RemoteClock::time_point deadline, std::string& error);
  bool read_exact(char* dst, std::size_t len, RemoteClock::time_point deadline, std::string& error);
  static bool parse_int(std::string_view text, long long& v);
  bool read_value_reply(ValueOp& op, RemoteClock::time_point deadline, std::string& error);
  bool read_value_in_place(ValueOp& op, std::size_t len, RemoteClock::time_point deadline,
                           std::string& error);
  bool read_crlf(RemoteClock::time_point deadline, std::string& error);
  bool skip_reply(RemoteClock::time_point deadline, std::string& error);
  static void apply_error(ValueOp& op, std::string_view text);

  redisContext* c_;
  std::unique_ptr<TlsStream> tls_;  // null: plain TCP
  ValuePool* pool_;
  ValuePool plain_{0, 0};     // without a tier's pool: keeps nothing, frees every buffer
  std::vector<char> buffer_;  // hiredis reader input (command())
  std::vector<char> in_ = std::vector<char>(256 * 1024);  // data path input
  std::size_t rpos_ = 0, wpos_ = 0;
  std::vector<std::array<char, 160>> prefixes_;
  std::vector<iovec> iov_;
};

// Connects, handshakes TLS (rediss), authenticates (AUTH [user] password) and SELECTs the URL's
// db before `deadline`. Throws Error: kNotAvailable when it cannot reach the server, kPermission
// when the server refuses the credentials or (TLS) its certificate does not verify.
std::unique_ptr<RedisConnection> open_redis(const RemoteEndpoint& ep, const RemoteUrl& url,
                                            RemoteClock::time_point deadline,
                                            ValuePool* pool = nullptr);
// A failed send or receive of `what` as the exception it means: kPermission when the TLS server
// refused the client certificate, else kNotAvailable.
[[noreturn]] void throw_io_error(const RemoteEndpoint& ep, const std::string& what,
                                 const std::string& error);
// An error reply as the exception it means: kPermission (auth_failure_text) for a refusal of the
// credentials, else `code` with "<what> on <ep>: <reply>".
[[noreturn]] void throw_reply_error(const RemoteEndpoint& ep, const RemoteUrl& url,
                                    const std::string& what, std::string_view reply,
                                    ErrorCode code);

}  // namespace kvoffload::detail
