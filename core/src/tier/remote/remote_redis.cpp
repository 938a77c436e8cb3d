// RESP connections over hiredis 0.14. hiredis parses replies (redisReader) and opens the socket;
// the I/O itself is ours, with poll() against one deadline for the whole pipeline, because
// hiredis's blocking calls only know per-syscall socket timeouts (a server that trickles bytes,
// or a SIGSTOPped one behind an accepting kernel, would otherwise hold a caller indefinitely).
// Puts are written with sendmsg over an iovec (prefix | header | slot bytes | CRLF): the slot
// bytes go from the region to the socket without a copy. The replies of the data path (+OK, :n,
// $-1, $len value, -error) are parsed here too, so a GET value is received straight into a
// recycled buffer (ValuePool) instead of hiredis's 16 KiB reads, growing reader buffer and
// per-reply allocation; hiredis's reader still parses everything else (setup, probes, CLUSTER
// SLOTS), on connections or phases where the data path is not reading.
#include "kvoffload/error.hpp"
#include "remote_ops.hpp"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <vector>

namespace kvoffload::detail {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept {
    if (r != nullptr) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

int remaining_ms(RemoteClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - RemoteClock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

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

class RedisConnection final : public StoreConnection {
 public:
  RedisConnection(redisContext* c, ValuePool* pool) : c_(c), pool_(pool), buffer_(256 * 1024) {}
  ~RedisConnection() override { redisFree(c_); }

  bool run(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
           std::string& error) override {
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

  // One command, for setup and probes.
  ReplyPtr command(std::initializer_list<std::string_view> argv, RemoteClock::time_point deadline,
                   std::string& error) {
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

 private:
  bool write_requests(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
                      std::string& error) {
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

  bool write_all(iovec* iov, std::size_t count, RemoteClock::time_point deadline,
                 std::string& error) {
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

  ReplyPtr read_reply(RemoteClock::time_point deadline, std::string& error) {
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

  // ---- the data path's reply reader ----------------------------------------------------------

  // Receives more bytes into in_ (compacting first); false at the deadline or on EOF/error.
  bool fill(RemoteClock::time_point deadline, std::string& error) {
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
  ssize_t recv_some(char* dst, std::size_t len, RemoteClock::time_point deadline,
                    std::string& error) {
    while (true) {
      if (RemoteClock::now() >= deadline) {
        error = "deadline passed waiting for a reply";
        return -1;
      }
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
  bool wait_socket(short events, RemoteClock::time_point deadline, std::string& error) {
    pollfd pfd{c_->fd, events, 0};
    if (::poll(&pfd, 1, std::max(1, remaining_ms(deadline))) < 0 && errno != EINTR) {
      error = errno_text("poll", errno);
      return false;
    }
    return true;
  }

  // One "\r\n"-terminated line (without it).
  bool read_line(std::string_view& line, RemoteClock::time_point deadline, std::string& error) {
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
  bool read_exact(char* dst, std::size_t len, RemoteClock::time_point deadline,
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

  static bool parse_int(std::string_view text, long long& v) {
    return !text.empty() &&
           std::from_chars(text.data(), text.data() + text.size(), v).ec == std::errc{} &&
           std::from_chars(text.data(), text.data() + text.size(), v).ptr ==
               text.data() + text.size();
  }

  // Reads one reply and applies it to `op`. False on a transport or protocol failure.
  bool read_value_reply(ValueOp& op, RemoteClock::time_point deadline, std::string& error) {
    std::string_view line;
    if (!read_line(line, deadline, error)) return false;
    if (line.empty()) {
      error = "protocol error: an empty reply line";
      return false;
    }
    const char type = line.front();
    const std::string_view rest = line.substr(1);
    if (type == '-') {
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
    HeldValue v = pool_ != nullptr ? pool_->acquire(len) : plain_.acquire(len);
    char crlf[2];
    if (!read_exact(static_cast<char*>(v.owner.get()), len, deadline, error) ||
        !read_exact(crlf, 2, deadline, error)) {
      return false;
    }
    if (crlf[0] != '\r' || crlf[1] != '\n') {
      error = "protocol error: a bulk string without its CRLF";
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

  // Skips the reply that follows a failed ASKING.
  bool skip_reply(RemoteClock::time_point deadline, std::string& error) {
    ValueOp scratch;
    scratch.kind = OpKind::kExists;
    return read_value_reply(scratch, deadline, error);
  }

  static void apply_error(ValueOp& op, std::string_view text) {
    if (text.starts_with("MOVED ") && parse_redirect(text, op.redirect_slot, op.redirect_to)) {
      op.status = OpStatus::kMoved;
    } else if (text.starts_with("ASK ") && parse_redirect(text, op.redirect_slot, op.redirect_to)) {
      op.status = OpStatus::kAsk;
    } else {
      op.status = OpStatus::kError;
      op.detail = "server error: " + std::string(text);
    }
  }

  redisContext* c_;
  ValuePool* pool_;
  ValuePool plain_{0, 0};     // without a tier's pool: keeps nothing, frees every buffer
  std::vector<char> buffer_;  // hiredis reader input (command())
  std::vector<char> in_ = std::vector<char>(256 * 1024);  // data path input
  std::size_t rpos_ = 0, wpos_ = 0;
  std::vector<std::array<char, 160>> prefixes_;
  std::vector<iovec> iov_;
};

std::unique_ptr<RedisConnection> open_redis(const RemoteEndpoint& ep, unsigned db,
                                            RemoteClock::time_point deadline,
                                            ValuePool* pool = nullptr) {
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
  if (db != 0) {
    std::string error;
    ReplyPtr r = conn->command({"SELECT", std::to_string(db)}, deadline, error);
    if (!r || r->type == REDIS_REPLY_ERROR) {
      throw Error(ErrorCode::kNotAvailable, "SELECT " + std::to_string(db) + " on " +
                                                ep.to_string() + ": " +
                                                (r ? std::string(r->str, r->len) : error));
    }
  }
  return conn;
}

std::string reply_text(const redisReply* r) {
  return r != nullptr && r->str != nullptr ? std::string(r->str, r->len) : std::string();
}

}  // namespace

std::unique_ptr<StoreConnection> connect_redis(const RemoteEndpoint& endpoint, unsigned db,
                                               RemoteClock::time_point deadline, ValuePool* pool) {
  return open_redis(endpoint, db, deadline, pool);
}

RedisProbe probe_redis(const RemoteEndpoint& endpoint, unsigned db,
                       std::chrono::milliseconds timeout) {
  const auto deadline = RemoteClock::now() + timeout;
  auto conn = open_redis(endpoint, db, deadline);
  RedisProbe p;
  std::string error;
  const auto t0 = RemoteClock::now();
  ReplyPtr pong = conn->command({"PING"}, deadline, error);
  if (!pong || pong->type == REDIS_REPLY_ERROR) {
    throw Error(ErrorCode::kNotAvailable,
                "PING " + endpoint.to_string() + ": " + (pong ? reply_text(pong.get()) : error));
  }
  p.rtt_ms = std::chrono::duration<double, std::milli>(RemoteClock::now() - t0).count();
  ReplyPtr info = conn->command({"INFO", "server"}, deadline, error);
  if (info && info->type == REDIS_REPLY_STRING) {
    const std::string text = reply_text(info.get());
    const auto at = text.find("redis_version:");
    if (at != std::string::npos) {
      const auto end = text.find_first_of("\r\n", at);
      p.version = text.substr(at + 14, end - at - 14);
    }
  }
  ReplyPtr cinfo = conn->command({"INFO", "cluster"}, deadline, error);
  if (cinfo && cinfo->type == REDIS_REPLY_STRING) {
    p.cluster_enabled = reply_text(cinfo.get()).find("cluster_enabled:1") != std::string::npos;
  }
  ReplyPtr role = conn->command({"ROLE"}, deadline, error);
  if (role && role->type == REDIS_REPLY_ARRAY && role->elements > 0) {
    p.role = reply_text(role->element[0]);
  }
  return p;
}

std::vector<SlotRange> cluster_slots(const RemoteEndpoint& endpoint,
                                     std::chrono::milliseconds timeout) {
  const auto deadline = RemoteClock::now() + timeout;
  auto conn = open_redis(endpoint, 0, deadline);
  std::string error;
  ReplyPtr r = conn->command({"CLUSTER", "SLOTS"}, deadline, error);
  if (!r)
    throw Error(ErrorCode::kNotAvailable,
                "CLUSTER SLOTS on " + endpoint.to_string() + ": " + error);
  if (r->type == REDIS_REPLY_ERROR) {
    throw Error(ErrorCode::kMismatch,
                "CLUSTER SLOTS on " + endpoint.to_string() + ": " + reply_text(r.get()) +
                    " (is it a cluster node? use redis:// for a standalone server)");
  }
  std::vector<SlotRange> out;
  if (r->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
        e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2) {
      continue;
    }
    SlotRange range;
    range.first = static_cast<std::uint32_t>(e->element[0]->integer);
    range.last = static_cast<std::uint32_t>(e->element[1]->integer);
    const redisReply* m = e->element[2];
    range.master.host = reply_text(m->element[0]);
    // An empty or "?" host means "the address you reached me on" (Redis 7).
    if (range.master.host.empty() || range.master.host == "?") range.master.host = endpoint.host;
    range.master.port = static_cast<std::uint16_t>(m->element[1]->integer);
    if (range.first <= range.last && range.last < kClusterSlots) out.push_back(range);
  }
  return out;
}

}  // namespace kvoffload::detail
