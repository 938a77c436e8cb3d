// RESP connections over hiredis 0.14. hiredis parses replies (redisReader) and opens the socket;
// the I/O itself is ours, with poll() against one deadline for the whole pipeline, because
// hiredis's blocking calls only know per-syscall socket timeouts (a server that trickles bytes,
// or a SIGSTOPped one behind an accepting kernel, would otherwise hold a caller indefinitely).
// Puts are written with sendmsg over an iovec (prefix | header | slot bytes | CRLF): the slot
// bytes go from the region to the socket without a copy. The replies of the data path (+OK, :n,
// $-1, $len value, -error) are parsed by us too, so a GET value is received straight into a
// recycled buffer (ValuePool) instead of hiredis's 16 KiB reads, growing reader buffer and
// per-reply allocation; hiredis's reader still parses everything else (setup, probes, CLUSTER
// SLOTS), on connections or phases where the data path is not reading.
//
// This file: connecting, and writing requests (the pipeline and single commands). The replies are
// read in remote_redis_replies.cpp, probes and CLUSTER SLOTS in remote_redis_probe.cpp.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <vector>

#include <kvoffload/error.hpp>

#include "tier/remote/remote_redis_connection.hpp"

namespace kvoffload::detail {

bool RedisConnection::run(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
                          std::string& error) {
  if (!write_requests(ops, deadline, error)) return false;
  for (ValueOp* op : ops) {
    if (op->asking) {
      // The ASKING reply (+OK) itself is not interesting, but an error there is the op's.
      if (!read_value_reply(*op, deadline, error)) return false;
      if (op->status == OpStatus::kError) {
        if (!skip_reply(deadline, error)) return false;
        continue;
      }
      op->status = OpStatus::kPending;
    }
    if (!read_value_reply(*op, deadline, error)) return false;
  }
  return true;
}

ReplyPtr RedisConnection::command(std::initializer_list<std::string_view> argv,
                                  RemoteClock::time_point deadline, std::string& error) {
  std::string text = "*" + std::to_string(argv.size()) + "\r\n";
  for (const auto a : argv) {
    text += "$" + std::to_string(a.size()) + "\r\n";
    text.append(a);
    text += "\r\n";
  }
  iovec iov{text.data(), text.size()};
  if (!write_all(&iov, 1, deadline, error)) return nullptr;
  return read_reply(deadline, error);
}

bool RedisConnection::write_requests(std::span<ValueOp* const> ops,
                                     RemoteClock::time_point deadline, std::string& error) {
  static constexpr char kCrlf[] = "\r\n";
  prefixes_.resize(ops.size());
  iov_.clear();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    ValueOp& op = *ops[i];
    std::array<char, 160>& p = prefixes_[i];
    int n = 0;
    const auto key = op.key.view();
    auto put = [&](std::string_view s) {
      std::memcpy(p.data() + n, s.data(), s.size());
      n += static_cast<int>(s.size());
    };
    auto put_num = [&](std::uint64_t v) {
      const auto r = std::to_chars(p.data() + n, p.data() + p.size(), v);
      n = static_cast<int>(r.ptr - p.data());
    };
    if (op.asking) put("*1\r\n$6\r\nASKING\r\n");
    switch (op.kind) {
      case OpKind::kExists:
        put("*2\r\n$6\r\nEXISTS\r\n$");
        break;
      case OpKind::kGet:
        put("*2\r\n$3\r\nGET\r\n$");
        break;
      case OpKind::kPut:
        put("*3\r\n$3\r\nSET\r\n$");
        break;
    }
    put_num(key.size());
    put("\r\n");
    put(key);
    put("\r\n");
    if (op.kind == OpKind::kPut) {
      put("$");
      put_num(kRemoteHeaderBytes + op.payload.size());
      put("\r\n");
      iov_.push_back({p.data(), static_cast<std::size_t>(n)});
      iov_.push_back({&op.header, kRemoteHeaderBytes});
      if (!op.payload.empty()) {
        iov_.push_back({const_cast<std::byte*>(op.payload.data()), op.payload.size()});
      }
      iov_.push_back({const_cast<char*>(kCrlf), 2});
    } else {
      iov_.push_back({p.data(), static_cast<std::size_t>(n)});
    }
  }
  return write_all(iov_.data(), iov_.size(), deadline, error);
}

bool RedisConnection::write_all(iovec* iov, std::size_t count, RemoteClock::time_point deadline,
                                std::string& error) {
  if (tls_) return tls_->write_all(iov, count, deadline, error);
  while (count > 0) {
    // Send first and wait (poll) only for a full socket buffer: one syscall per send, not two.
    if (RemoteClock::now() >= deadline) {
      error = "deadline passed while sending";
      return false;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min<std::size_t>(count, IOV_MAX);
    const ssize_t n = ::sendmsg(c_->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        error = errno_text("send", errno);
        return false;
      }
      if (!wait_socket(POLLOUT, deadline, error)) return false;
      continue;
    }
    std::size_t left = static_cast<std::size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

bool is_auth_refusal(std::string_view reply) noexcept {
  if (reply.starts_with("NOAUTH") || reply.starts_with("WRONGPASS") ||
      reply.starts_with("NOPERM")) {
    return true;
  }
  // "ERR AUTH <password> called without any password configured for the default user" (Redis
  // 6+), "ERR Client sent AUTH, but no password is set" and "ERR invalid password" (Redis < 6).
  return reply.starts_with("ERR") && (reply.find("AUTH") != std::string_view::npos ||
                                      reply.find("invalid password") != std::string_view::npos);
}

std::string auth_failure_text(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                              std::string_view answer) {
  std::string who;
  if (url.authenticates()) {
    who = " as " +
          (url.user.empty() ? std::string("the default user") : "user '" + url.user + "'") +
          " with the password from " + url.password_source();
  } else {
    who = " without a password";
  }
  std::string hint;
  if (answer.starts_with("NOAUTH")) {
    hint =
        "; the server wants a password: redis://:PASSWORD@host:port (or user:PASSWORD@ for an "
        "ACL user), or password_file= / password_env=";
  } else if (answer.starts_with("WRONGPASS") || answer.find("invalid password") != answer.npos) {
    hint = "; check the user name and the password";
  } else if (answer.starts_with("NOPERM")) {
    hint =
        "; the ACL user may not run the commands the tier needs (GET, SET, EXISTS, PING, "
        "SELECT, CLUSTER SLOTS, INFO, ROLE) on keys kvo1:*";
  } else if (answer.find("without any password configured") != answer.npos ||
             answer.find("no password is set") != answer.npos) {
    hint = "; the server has no password: drop the credentials from the URL";
  }
  return "authentication failed at " + endpoint.to_string() + who + ": the server answered " +
         std::string(answer) + hint;
}

void throw_io_error(const RemoteEndpoint& ep, const std::string& what, const std::string& error) {
  // A TLS session whose server refused the client certificate after the handshake (TLS 1.3).
  if (error.starts_with("authentication failed")) {
    throw Error(ErrorCode::kPermission, error + " (" + what + " " + ep.to_string() + ")");
  }
  throw Error(ErrorCode::kNotAvailable, what + " " + ep.to_string() + ": " + error);
}

void throw_reply_error(const RemoteEndpoint& ep, const RemoteUrl& url, const std::string& what,
                       std::string_view reply, ErrorCode code) {
  if (is_auth_refusal(reply))
    throw Error(ErrorCode::kPermission, auth_failure_text(ep, url, reply));
  throw Error(code, what + " on " + ep.to_string() + ": " + std::string(reply));
}

std::unique_ptr<RedisConnection> open_redis(const RemoteEndpoint& ep, const RemoteUrl& url,
                                            RemoteClock::time_point deadline, ValuePool* pool) {
  const int ms = std::max(1, remaining_ms(deadline));
  const timeval tv{ms / 1000, (ms % 1000) * 1000};
  redisContext* c = redisConnectWithTimeout(ep.host.c_str(), ep.port, tv);
  if (c == nullptr)
    throw Error(ErrorCode::kSystem, "connect " + ep.to_string() + ": out of memory");
  if (c->err != 0) {
    const std::string why = c->errstr;
    redisFree(c);
    throw Error(ErrorCode::kNotAvailable, "connect " + ep.to_string() + ": " + why);
  }
  auto conn = std::make_unique<RedisConnection>(c, pool);
  if (url.tls.enabled) conn->start_tls(url.tls, ep, deadline);
  std::string error;
  auto reply_text = [](const ReplyPtr& r) { return std::string(r->str, r->len); };
  if (url.authenticates()) {
    ReplyPtr r = url.user.empty()
                     ? conn->command({"AUTH", url.password.reveal()}, deadline, error)
                     : conn->command({"AUTH", url.user, url.password.reveal()}, deadline, error);
    if (!r) throw Error(ErrorCode::kNotAvailable, "AUTH on " + ep.to_string() + ": " + error);
    if (r->type == REDIS_REPLY_ERROR) {
      // Whatever the refusal says, it refuses these credentials.
      throw Error(ErrorCode::kPermission, auth_failure_text(ep, url, reply_text(r)));
    }
  }
  if (url.db != 0) {
    ReplyPtr r = conn->command({"SELECT", std::to_string(url.db)}, deadline, error);
    if (!r) {
      throw Error(ErrorCode::kNotAvailable,
                  "SELECT " + std::to_string(url.db) + " on " + ep.to_string() + ": " + error);
    }
    if (r->type == REDIS_REPLY_ERROR) {
      throw_reply_error(ep, url, "SELECT " + std::to_string(url.db), reply_text(r),
                        ErrorCode::kNotAvailable);
    }
  }
  return conn;
}

std::unique_ptr<StoreConnection> connect_redis(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                                               RemoteClock::time_point deadline, ValuePool* pool) {
  return open_redis(endpoint, url, deadline, pool);
}

void verify_redis(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                  RemoteClock::time_point deadline) {
  auto conn = open_redis(endpoint, url, deadline);
  std::string error;
  ReplyPtr r = conn->command({"PING"}, deadline, error);
  if (!r) throw_io_error(endpoint, "PING", error);
  // Only a refusal of the credentials matters here; what else a server answers to PING is for
  // `remote check` to judge.
  if (r->type == REDIS_REPLY_ERROR && is_auth_refusal(std::string_view(r->str, r->len))) {
    throw Error(ErrorCode::kPermission,
                auth_failure_text(endpoint, url, std::string_view(r->str, r->len)));
  }
}

}  // namespace kvoffload::detail
