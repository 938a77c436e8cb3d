// RESP connections over hiredis 0.14. hiredis parses replies (redisReader) and opens the socket;
// the I/O itself is ours, with poll() against one deadline for the whole pipeline, because
// hiredis's blocking calls only know per-syscall socket timeouts (a server that trickles bytes,
// or a SIGSTOPped one behind an accepting kernel, would otherwise hold a caller indefinitely).
// Puts are written with sendmsg over an iovec (prefix | header | slot bytes | CRLF): the slot
// bytes go from the region to the socket without a copy.
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
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - RemoteClock::now());
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
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  slot = static_cast<std::uint16_t>(s);
  to.host = std::string(host);
  to.port = static_cast<std::uint16_t>(port);
  return true;
}

class RedisConnection final : public StoreConnection {
 public:
  explicit RedisConnection(redisContext* c) : c_(c), buffer_(256 * 1024) {}
  ~RedisConnection() override { redisFree(c_); }

  bool run(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
           std::string& error) override {
    if (!write_requests(ops, deadline, error)) return false;
    for (ValueOp* op : ops) {
      if (op->asking) {
        ReplyPtr ok = read_reply(deadline, error);
        if (!ok) return false;  // the ASKING reply (+OK) itself is not interesting
      }
      ReplyPtr r = read_reply(deadline, error);
      if (!r) return false;
      apply(*op, std::move(r));
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
        case OpKind::kExists: put("*2\r\n$6\r\nEXISTS\r\n$"); break;
        case OpKind::kGet: put("*2\r\n$3\r\nGET\r\n$"); break;
        case OpKind::kPut: put("*3\r\n$3\r\nSET\r\n$"); break;
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
      pollfd pfd{c_->fd, POLLOUT, 0};
      const int ms = remaining_ms(deadline);
      const int pr = ms == 0 ? 0 : ::poll(&pfd, 1, ms);
      if (pr < 0 && errno == EINTR) continue;
      if (pr == 0) {
        error = "deadline passed while sending";
        return false;
      }
      if (pr < 0) {
        error = std::string("poll: ") + std::strerror(errno);
        return false;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = std::min<std::size_t>(count, IOV_MAX);
      const ssize_t n = ::sendmsg(c_->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        error = std::string("send: ") + std::strerror(errno);
        return false;
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
      pollfd pfd{c_->fd, POLLIN, 0};
      const int ms = remaining_ms(deadline);
      const int pr = ms == 0 ? 0 : ::poll(&pfd, 1, ms);
      if (pr < 0 && errno == EINTR) continue;
      if (pr == 0) {
        error = "deadline passed waiting for a reply";
        return nullptr;
      }
      if (pr < 0) {
        error = std::string("poll: ") + std::strerror(errno);
        return nullptr;
      }
      const ssize_t n = ::recv(c_->fd, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        error = std::string("recv: ") + std::strerror(errno);
        return nullptr;
      }
      if (n == 0) {
        error = "the server closed the connection";
        return nullptr;
      }
      if (redisReaderFeed(c_->reader, buffer_.data(), static_cast<std::size_t>(n)) != REDIS_OK) {
        error = "protocol error: reader refused input";
        return nullptr;
      }
    }
  }

  static void apply(ValueOp& op, ReplyPtr r) {
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string_view text(r->str, r->len);
      if (text.starts_with("MOVED ") && parse_redirect(text, op.redirect_slot, op.redirect_to)) {
        op.status = OpStatus::kMoved;
      } else if (text.starts_with("ASK ") && parse_redirect(text, op.redirect_slot, op.redirect_to)) {
        op.status = OpStatus::kAsk;
      } else {
        op.status = OpStatus::kError;
        op.detail = "server error: " + std::string(text);
      }
      return;
    }
    switch (op.kind) {
      case OpKind::kExists:
        if (r->type == REDIS_REPLY_INTEGER) {
          op.status = r->integer > 0 ? OpStatus::kOk : OpStatus::kAbsent;
          return;
        }
        break;
      case OpKind::kGet:
        if (r->type == REDIS_REPLY_NIL) {
          op.status = OpStatus::kAbsent;
          return;
        }
        if (r->type == REDIS_REPLY_STRING) {
          redisReply* raw = r.release();
          HeldValue v;
          v.bytes = {reinterpret_cast<const std::byte*>(raw->str), raw->len};
          v.owner = std::unique_ptr<void, void (*)(void*)>(raw, freeReplyObject);
          accept_value(op, std::move(v));
          return;
        }
        break;
      case OpKind::kPut:
        if (r->type == REDIS_REPLY_STATUS) {
          op.status = OpStatus::kOk;
          return;
        }
        break;
    }
    op.status = OpStatus::kError;
    op.detail = "unexpected reply type " + std::to_string(r->type);
  }

  redisContext* c_;
  std::vector<char> buffer_;
  std::vector<std::array<char, 160>> prefixes_;
  std::vector<iovec> iov_;
};

std::unique_ptr<RedisConnection> open_redis(const RemoteEndpoint& ep, unsigned db,
                                            RemoteClock::time_point deadline) {
  const int ms = std::max(1, remaining_ms(deadline));
  const timeval tv{ms / 1000, (ms % 1000) * 1000};
  redisContext* c = redisConnectWithTimeout(ep.host.c_str(), ep.port, tv);
  if (c == nullptr) throw Error(ErrorCode::kSystem, "connect " + ep.to_string() + ": out of memory");
  if (c->err != 0) {
    const std::string why = c->errstr;
    redisFree(c);
    throw Error(ErrorCode::kNotAvailable, "connect " + ep.to_string() + ": " + why);
  }
  auto conn = std::make_unique<RedisConnection>(c);
  if (db != 0) {
    std::string error;
    ReplyPtr r = conn->command({"SELECT", std::to_string(db)}, deadline, error);
    if (!r || r->type == REDIS_REPLY_ERROR) {
      throw Error(ErrorCode::kNotAvailable, "SELECT " + std::to_string(db) + " on " + ep.to_string() +
                                                ": " + (r ? std::string(r->str, r->len) : error));
    }
  }
  return conn;
}

std::string reply_text(const redisReply* r) {
  return r != nullptr && r->str != nullptr ? std::string(r->str, r->len) : std::string();
}

}  // namespace

std::unique_ptr<StoreConnection> connect_redis(const RemoteEndpoint& endpoint, unsigned db,
                                               RemoteClock::time_point deadline) {
  return open_redis(endpoint, db, deadline);
}

RedisProbe probe_redis(const RemoteEndpoint& endpoint, unsigned db, std::chrono::milliseconds timeout) {
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

std::vector<SlotRange> cluster_slots(const RemoteEndpoint& endpoint, std::chrono::milliseconds timeout) {
  const auto deadline = RemoteClock::now() + timeout;
  auto conn = open_redis(endpoint, 0, deadline);
  std::string error;
  ReplyPtr r = conn->command({"CLUSTER", "SLOTS"}, deadline, error);
  if (!r) throw Error(ErrorCode::kNotAvailable, "CLUSTER SLOTS on " + endpoint.to_string() + ": " + error);
  if (r->type == REDIS_REPLY_ERROR) {
    throw Error(ErrorCode::kMismatch,
                "CLUSTER SLOTS on " + endpoint.to_string() + ": " + reply_text(r.get()) +
                    " (is it a cluster node? use redis:// for a standalone server)");
  }
  std::vector<SlotRange> out;
  if (r->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->elements < 2) {
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
