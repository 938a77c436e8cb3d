// A RESP connection's replies: hiredis's reader for setup and probes, and the data path's own
// reader (one reply per op: +OK, :n, $-1, $len value received straight into a recycled buffer,
// -error with MOVED/ASK redirects), all against the caller's deadline.
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

#include <kvoffload/error.hpp>

#include "tier/remote/remote_redis_connection.hpp"

namespace kvoffload::detail {
namespace {

// Parses "MOVED 3999 127.0.0.1:6381" / "ASK ...": slot and endpoint.
bool parse_redirect(std::string_view text, std::uint16_t& slot, RemoteEndpoint& to) {
  const auto sp1 = text.find(' ');
  const auto sp2 = text.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos) return false;
  const std::string_view slot_text = text.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view ep = text.substr(sp2 + 1);
  unsigned s = 0;
  if (std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), s).ec != std::errc{} ||
      s >= kClusterSlots) {
    return false;
  }
  const auto colon = ep.rfind(':');
  if (colon == std::string_view::npos) return false;
  unsigned port = 0;
  const std::string_view port_text = ep.substr(colon + 1);
  if (std::from_chars(port_text.data(), port_text.data() + port_text.size(), port).ec !=
          std::errc{} ||
      port == 0 || port > 65535) {
    return false;
  }
  std::string_view host = ep.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  slot = static_cast<std::uint16_t>(s);
  to.host = std::string(host);
  to.port = static_cast<std::uint16_t>(port);
  return true;
}

}  // namespace

ReplyPtr RedisConnection::read_reply(RemoteClock::time_point deadline, std::string& error) {
  while (true) {
    void* reply = nullptr;
    if (redisReaderGetReply(c_->reader, &reply) != REDIS_OK) {
      error = std::string("protocol error: ") + c_->reader->errstr;
      return nullptr;
    }
    if (reply != nullptr) return ReplyPtr(static_cast<redisReply*>(reply));
    const ssize_t n = recv_some(buffer_.data(), buffer_.size(), deadline, error);
    if (n <= 0) return nullptr;
    if (redisReaderFeed(c_->reader, buffer_.data(), static_cast<std::size_t>(n)) != REDIS_OK) {
      error = "protocol error: reader refused input";
      return nullptr;
    }
  }
}

// Receives more bytes into in_ (compacting first); false at the deadline or on EOF/error.
bool RedisConnection::fill(RemoteClock::time_point deadline, std::string& error) {
  if (rpos_ == wpos_) rpos_ = wpos_ = 0;
  if (wpos_ == in_.size()) {
    if (rpos_ == 0) {
      error = "protocol error: a reply line longer than " + std::to_string(in_.size()) + " bytes";
      return false;
    }
    std::memmove(in_.data(), in_.data() + rpos_, wpos_ - rpos_);
    wpos_ -= rpos_;
    rpos_ = 0;
  }
  const ssize_t n = recv_some(in_.data() + wpos_, in_.size() - wpos_, deadline, error);
  if (n <= 0) return false;
  wpos_ += static_cast<std::size_t>(n);
  return true;
}

// Receives what the socket holds; waits (poll) only when it holds nothing, so a value that
// streams in costs one syscall per receive, not two.
ssize_t RedisConnection::recv_some(char* dst, std::size_t len, RemoteClock::time_point deadline,
                                   std::string& error) {
  while (true) {
    if (RemoteClock::now() >= deadline) {
      error = "deadline passed waiting for a reply";
      return -1;
    }
    if (tls_) return tls_->read_some(dst, len, deadline, error);
    const ssize_t n = ::recv(c_->fd, dst, len, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
      error = "the server closed the connection";
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      error = errno_text("recv", errno);
      return -1;
    }
    if (!wait_socket(POLLIN, deadline, error)) return -1;
  }
}

// Waits until the socket is ready for `events` or the deadline passes (rounded up to 1 ms; the
// caller's loop reports a passed deadline). False only when poll itself fails.
bool RedisConnection::wait_socket(short events, RemoteClock::time_point deadline,
                                  std::string& error) {
  pollfd pfd{c_->fd, events, 0};
  if (::poll(&pfd, 1, std::max(1, remaining_ms(deadline))) < 0 && errno != EINTR) {
    error = errno_text("poll", errno);
    return false;
  }
  return true;
}

// One "\r\n"-terminated line (without it).
bool RedisConnection::read_line(std::string_view& line, RemoteClock::time_point deadline,
                                std::string& error) {
  while (true) {
    const std::string_view have(in_.data() + rpos_, wpos_ - rpos_);
    const auto end = have.find("\r\n");
    if (end != std::string_view::npos) {
      line = have.substr(0, end);
      rpos_ += end + 2;
      return true;
    }
    if (!fill(deadline, error)) return false;
  }
}

// Exactly len bytes into dst: what is buffered first, the rest straight from the socket.
bool RedisConnection::read_exact(char* dst, std::size_t len, RemoteClock::time_point deadline,
                                 std::string& error) {
  const std::size_t buffered = std::min(len, wpos_ - rpos_);
  std::memcpy(dst, in_.data() + rpos_, buffered);
  rpos_ += buffered;
  std::size_t got = buffered;
  while (got < len) {
    const ssize_t n = recv_some(dst + got, len - got, deadline, error);
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

bool RedisConnection::parse_int(std::string_view text, long long& v) {
  return !text.empty() &&
         std::from_chars(text.data(), text.data() + text.size(), v).ec == std::errc{} &&
         std::from_chars(text.data(), text.data() + text.size(), v).ptr ==
             text.data() + text.size();
}

// Reads one reply and applies it to `op`. False on a transport or protocol failure.
bool RedisConnection::read_value_reply(ValueOp& op, RemoteClock::time_point deadline,
                                       std::string& error) {
  std::string_view line;
  if (!read_line(line, deadline, error)) return false;
  if (line.empty()) {
    error = "protocol error: an empty reply line";
    return false;
  }
  const char type = line.front();
  const std::string_view rest = line.substr(1);
  if (type == '-') {
    if (is_auth_refusal(rest)) {
      // Every later command on this connection is refused too: the connection fails (and is
      // reopened, with AUTH, by the worker).
      error = "authentication failed: the server answered " + std::string(rest);
      return false;
    }
    apply_error(op, rest);
    return true;
  }
  if (type == '+') {  // SET / ASKING
    if (op.kind == OpKind::kPut || op.asking) {
      op.status = OpStatus::kOk;
    } else {
      op.status = OpStatus::kError;
      op.detail = "unexpected status reply +" + std::string(rest);
    }
    return true;
  }
  long long n = 0;
  if ((type != ':' && type != '$') || !parse_int(rest, n)) {
    error = "protocol error: unexpected reply '" + std::string(line.substr(0, 32)) + "'";
    return false;
  }
  if (type == ':') {
    if (op.kind == OpKind::kExists) {
      op.status = n > 0 ? OpStatus::kOk : OpStatus::kAbsent;
    } else {
      op.status = OpStatus::kError;
      op.detail = "unexpected integer reply :" + std::to_string(n);
    }
    return true;
  }
  if (n < 0) {  // $-1: nil
    op.status = op.kind == OpKind::kGet ? OpStatus::kAbsent : OpStatus::kError;
    if (op.kind != OpKind::kGet) op.detail = "unexpected nil reply";
    return true;
  }
  if (n > (1LL << 30)) {
    error = "protocol error: a bulk string of " + std::to_string(n) + " bytes";
    return false;
  }
  const auto len = static_cast<std::size_t>(n);
  if (op.kind == OpKind::kGet && !op.into.empty() && len == kRemoteHeaderBytes + op.into.size()) {
    return read_value_in_place(op, len, deadline, error);
  }
  HeldValue v = pool_ != nullptr ? pool_->acquire(len) : plain_.acquire(len);
  if (!read_exact(static_cast<char*>(v.owner.get()), len, deadline, error) ||
      !read_crlf(deadline, error)) {
    return false;
  }
  if (op.kind == OpKind::kGet) {
    accept_value(op, std::move(v));
  } else {
    op.status = OpStatus::kError;
    op.detail = "unexpected bulk reply";
  }
  return true;
  // The analyzer does not follow the pool's deleter (a function pointer in the unique_ptr's
  // deleter) and reports the buffer as leaked when a read fails; `v` frees it on every path.
}  // NOLINT(clang-analyzer-unix.Malloc)

// The CRLF that ends a bulk string.
bool RedisConnection::read_crlf(RemoteClock::time_point deadline, std::string& error) {
  char crlf[2];
  if (!read_exact(crlf, 2, deadline, error)) return false;
  if (crlf[0] != '\r' || crlf[1] != '\n') {
    error = "protocol error: a bulk string without its CRLF";
    return false;
  }
  return true;
}

// Note [Gets into the destination]: a GET's value of the expected size, its header first (into
// 64 bytes here), verified before a payload byte moves; then the payload straight from the
// socket into the op's slot, verified there. A header that does not verify leaves the slot
// untouched: the payload is received into a buffer and dropped.
bool RedisConnection::read_value_in_place(ValueOp& op, std::size_t len,
                                          RemoteClock::time_point deadline, std::string& error) {
  std::array<std::byte, kRemoteHeaderBytes> head{};
  if (!read_exact(reinterpret_cast<char*>(head.data()), head.size(), deadline, error)) {
    return false;
  }
  RemoteValueHeader h;
  const ValueCheck check =
      verify_header(head, len, op.fingerprint, op.chunk, op.copy, op.expected_payload, h);
  if (check != ValueCheck::kOk) {
    HeldValue rest = pool_ != nullptr ? pool_->acquire(len) : plain_.acquire(len);
    if (!read_exact(static_cast<char*>(rest.owner.get()), len - head.size(), deadline, error) ||
        !read_crlf(deadline, error)) {
      return false;
    }
    op.status = OpStatus::kCorrupt;
    op.detail = std::string(to_string(check)) + " (" + std::to_string(len) + " bytes)";
    return true;
  }  // NOLINT(clang-analyzer-unix.Malloc): `rest` frees its buffer (see read_value_reply)
  if (!read_exact(reinterpret_cast<char*>(op.into.data()), op.into.size(), deadline, error) ||
      !read_crlf(deadline, error)) {
    return false;
  }
  if (payload_matches(h, op.into)) {
    op.status = OpStatus::kOk;
    op.in_place = true;
  } else {
    op.status = OpStatus::kCorrupt;
    op.detail = std::string(to_string(ValueCheck::kPayloadChecksum)) + " (" + std::to_string(len) +
                " bytes, received into the destination)";
  }
  return true;
}

// Skips the reply that follows a failed ASKING.
bool RedisConnection::skip_reply(RemoteClock::time_point deadline, std::string& error) {
  ValueOp scratch;
  scratch.kind = OpKind::kExists;
  return read_value_reply(scratch, deadline, error);
}

void RedisConnection::apply_error(ValueOp& op, std::string_view text) {
  if (text.starts_with("MOVED ") && parse_redirect(text, op.redirect_slot, op.redirect_to)) {
    op.status = OpStatus::kMoved;
  } else if (text.starts_with("ASK ") && parse_redirect(text, op.redirect_slot, op.redirect_to)) {
    op.status = OpStatus::kAsk;
  } else {
    op.status = OpStatus::kError;
    op.detail = "server error: " + std::string(text);
  }
}

}  // namespace kvoffload::detail
