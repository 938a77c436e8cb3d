// memcached connections through libmemcached: one memcached_st per worker, holding one server
// (the tier routes keys to servers with libmemcached's own ketama hashing, see remote_routing.cpp).
// libmemcached's timeouts are per poll; before each call the poll timeout is set to what is left
// of the batch's deadline, so a frozen server costs at most about one deadline.
// Credentials (memcached://user:password@) are SASL PLAIN, which libmemcached speaks over the
// binary protocol only: a tier with credentials uses it for every request.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <libmemcached/memcached.h>

#include <kvoffload/error.hpp>

#include "tier/remote/memcached_message.hpp"
#include "tier/remote/remote_ops.hpp"

namespace kvoffload::detail {
namespace {

long memcached_remaining_ms(RemoteClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - RemoteClock::now()).count();
  return left <= 0 ? 0 : left;
}

// Results that mean the connection can no longer be trusted (as opposed to an answer).
bool auth_result(memcached_return_t rc) {
  return rc == MEMCACHED_AUTH_FAILURE || rc == MEMCACHED_AUTH_PROBLEM ||
         rc == MEMCACHED_AUTH_CONTINUE;
}

bool transport_failure(memcached_return_t rc) {
  switch (rc) {
    case MEMCACHED_SUCCESS:
    case MEMCACHED_NOTFOUND:
    case MEMCACHED_NOTSTORED:
    case MEMCACHED_DATA_EXISTS:
    case MEMCACHED_END:
    case MEMCACHED_STORED:
    case MEMCACHED_E2BIG:
    case MEMCACHED_MEMORY_ALLOCATION_FAILURE:
    case MEMCACHED_SERVER_MEMORY_ALLOCATION_FAILURE:
    case MEMCACHED_SERVER_ERROR:
      return false;
    default:
      return true;
  }
}

class MemcachedConnection final : public StoreConnection {
 public:
  explicit MemcachedConnection(memcached_st* mc) : mc_(mc) {}
  ~MemcachedConnection() override { memcached_free(mc_); }

  bool run(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
           std::string& error) override {
    if (ops.empty()) return true;
    switch (ops.front()->kind) {
      case OpKind::kExists:
        return exists(ops, deadline, error);
      case OpKind::kGet:
        return get(ops, deadline, error);
      case OpKind::kPut:
        return put(ops, deadline, error);
    }
    return true;
  }

  bool set_deadline(RemoteClock::time_point deadline, std::string& error) {
    const long ms = memcached_remaining_ms(deadline);
    if (ms == 0) {
      error = "deadline passed";
      return false;
    }
    memcached_behavior_set(mc_, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, static_cast<uint64_t>(ms));
    return true;
  }

  bool check(memcached_return_t rc, std::string& error) {
    if (!transport_failure(rc)) return true;
    error = std::string(auth_result(rc) ? "authentication failed: " : "") +
            "memcached: " + memcached_message(mc_);
    return false;
  }

 private:
  bool exists(std::span<ValueOp* const> ops, RemoteClock::time_point deadline, std::string& error) {
    for (ValueOp* op : ops) {
      if (!set_deadline(deadline, error)) return false;
      const auto key = op->key.view();
      const memcached_return_t rc = memcached_exist(mc_, key.data(), key.size());
      if (!check(rc, error)) return false;
      if (rc == MEMCACHED_SUCCESS) {
        op->status = OpStatus::kOk;
      } else if (rc == MEMCACHED_NOTFOUND) {
        op->status = OpStatus::kAbsent;
      } else {
        op->status = OpStatus::kError;
        op->detail = std::string("memcached: ") + memcached_strerror(mc_, rc);
      }
    }
    return true;
  }

  bool get(std::span<ValueOp* const> ops, RemoteClock::time_point deadline, std::string& error) {
    if (!set_deadline(deadline, error)) return false;
    keys_.clear();
    lengths_.clear();
    for (ValueOp* op : ops) {
      keys_.push_back(op->key.text.data());
      lengths_.push_back(op->key.size);
    }
    memcached_return_t rc = memcached_mget(mc_, keys_.data(), lengths_.data(), keys_.size());
    if (!check(rc, error)) return false;
    memcached_result_st result;
    memcached_result_create(mc_, &result);
    std::size_t cursor = 0;  // one server answers in request order, skipping missing keys
    while (true) {
      if (!set_deadline(deadline, error)) {
        memcached_result_free(&result);
        return false;
      }
      memcached_result_st* got = memcached_fetch_result(mc_, &result, &rc);
      if (got == nullptr) break;
      const std::string_view key(memcached_result_key_value(got), memcached_result_key_length(got));
      std::size_t i = cursor;
      while (i < ops.size() && ops[i]->key.view() != key) ++i;
      if (i == ops.size()) {
        for (i = 0; i < ops.size() && ops[i]->key.view() != key; ++i) {
        }
      }
      if (i == ops.size() || ops[i]->status != OpStatus::kPending) continue;
      cursor = i + 1;
      const std::size_t length = memcached_result_length(got);
      char* value = memcached_result_take_value(got);
      HeldValue v;
      v.bytes = {reinterpret_cast<const std::byte*>(value), length};
      v.owner = std::unique_ptr<void, ValueDeleter>(
          value, ValueDeleter{[](void*, void* p) { std::free(p); }, nullptr});
      accept_value(*ops[i], std::move(v));
    }
    memcached_result_free(&result);
    if (rc != MEMCACHED_END && rc != MEMCACHED_SUCCESS && rc != MEMCACHED_NOTFOUND &&
        !check(rc, error)) {
      return false;
    }
    for (ValueOp* op : ops) {
      if (op->status == OpStatus::kPending) op->status = OpStatus::kAbsent;
    }
    return true;
  }

  bool put(std::span<ValueOp* const> ops, RemoteClock::time_point deadline, std::string& error) {
    for (ValueOp* op : ops) {
      if (!set_deadline(deadline, error)) return false;
      // libmemcached takes one value buffer: header and slot bytes are joined in a buffer that
      // lives as long as the connection (grown once, never per value).
      const std::size_t size = kRemoteHeaderBytes + op->payload.size();
      if (scratch_.size() < size) scratch_.resize(size);
      std::memcpy(scratch_.data(), &op->header, kRemoteHeaderBytes);
      if (!op->payload.empty()) {
        std::memcpy(scratch_.data() + kRemoteHeaderBytes, op->payload.data(), op->payload.size());
      }
      const auto key = op->key.view();
      const memcached_return_t rc =
          memcached_set(mc_, key.data(), key.size(), scratch_.data(), size,
                        /*expiration=*/0, /*flags=*/0);
      if (!check(rc, error)) return false;
      if (rc == MEMCACHED_SUCCESS || rc == MEMCACHED_STORED) {
        op->status = OpStatus::kOk;
      } else {
        op->status = OpStatus::kError;
        op->detail = std::string("memcached set: ") + memcached_strerror(mc_, rc) +
                     (rc == MEMCACHED_E2BIG || rc == MEMCACHED_SERVER_ERROR
                          ? " (is the value larger than the server's item size? raise memcached -I)"
                          : "");
      }
    }
    return true;
  }

  memcached_st* mc_;
  std::vector<const char*> keys_;
  std::vector<std::size_t> lengths_;
  std::vector<char> scratch_;
};

memcached_st* make_client(const RemoteEndpoint& ep, const RemoteUrl& url, long timeout_ms) {
  memcached_st* mc = memcached_create(nullptr);
  if (mc == nullptr) throw Error(ErrorCode::kSystem, "memcached_create: out of memory");
  const auto t = static_cast<uint64_t>(std::max(1L, timeout_ms));
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_NO_BLOCK, 1);  // needed for the timeouts to apply
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, t);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, t);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_SND_TIMEOUT, t * 1000);  // microseconds
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_RCV_TIMEOUT, t * 1000);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 0);  // our breaker decides
  if (memcached_server_add(mc, ep.host.c_str(), ep.port) != MEMCACHED_SUCCESS) {
    const std::string why = memcached_message(mc);
    memcached_free(mc);
    throw Error(ErrorCode::kInvalidArgument, "memcached server " + ep.to_string() + ": " + why);
  }
  if (url.authenticates()) {
#if LIBMEMCACHED_WITH_SASL_SUPPORT
    memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, 1);
    if (memcached_set_sasl_auth_data(mc, url.user.c_str(), url.password.reveal().c_str()) !=
        MEMCACHED_SUCCESS) {
      memcached_free(mc);
      throw Error(ErrorCode::kSystem, "memcached SASL setup for " + ep.to_string() + " failed");
    }
#else
    memcached_free(mc);
    // A configuration this build cannot honour: refused (open() fails), never a silent
    // unauthenticated connection.
    throw Error(ErrorCode::kInvalidArgument,
                "memcached credentials need SASL, and this libmemcached was built without it "
                "(LIBMEMCACHED_WITH_SASL_SUPPORT is 0): drop user:password@ or use a libmemcached "
                "with SASL");
#endif
  }
  return mc;
}

// The SASL probe's own deadline: it runs after the connect's has passed, so a frozen server
// costs at most one connect deadline plus this.
constexpr long kSaslProbeMaxMs = 2000;

// Whether the server at `ep` wants SASL: a server started with -S speaks only the binary
// protocol and leaves the text protocol's VERSION unanswered (a client without credentials sees
// a timeout, which read as "unreachable"). Asked in the binary protocol, VERSION is answered
// before authentication and any key command is refused with AUTHENTICATION FAILURE (status
// 0x20); a server without SASL answers NOT FOUND. Only asked after a failed connect without
// credentials.
bool memcached_wants_sasl(const RemoteEndpoint& ep, long timeout_ms) {
  memcached_st* mc = memcached_create(nullptr);
  if (mc == nullptr) return false;
  const auto t = static_cast<uint64_t>(std::max(1L, timeout_ms));
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, 1);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_NO_BLOCK, 1);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, t);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, t);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 0);
  bool wants = false;
  if (memcached_server_add(mc, ep.host.c_str(), ep.port) == MEMCACHED_SUCCESS &&
      memcached_version(mc) == MEMCACHED_SUCCESS) {
    static constexpr char kKey[] = "kvo1:sasl-probe";
    wants = memcached_exist(mc, kKey, sizeof kKey - 1) == MEMCACHED_AUTH_FAILURE;
  }
  memcached_free(mc);
  return wants;
}

// The message for a server that wants SASL from a URL without credentials.
std::string memcached_auth_required_text(const RemoteEndpoint& ep) {
  return "authentication required at " + ep.to_string() +
         ": the server requires SASL (memcached -S) and the URL has no credentials; give "
         "memcached://USER:PASSWORD@host:port (or USER@ with password_file= / password_env=)";
}

// A failed VERSION (the connect, and with credentials the SASL exchange) as the exception it
// means.
[[noreturn]] void throw_connect_failure(memcached_st* mc, const RemoteEndpoint& ep,
                                        const RemoteUrl& url, memcached_return_t rc,
                                        long probe_timeout_ms) {
  const std::string why = memcached_message(mc);
  // VERSION reports a failed SASL exchange as a plain failure; the last error says what it was.
  const memcached_return_t last = memcached_last_error(mc);
  memcached_free(mc);
  // A refused or failed TCP connect is not a SASL server; anything else without credentials
  // (the text protocol's VERSION unanswered) may be one.
  if (!url.authenticates() && rc != MEMCACHED_CONNECTION_FAILURE &&
      last != MEMCACHED_CONNECTION_FAILURE && memcached_wants_sasl(ep, probe_timeout_ms)) {
    throw Error(ErrorCode::kPermission, memcached_auth_required_text(ep));
  }
  if (auth_result(rc) || auth_result(last)) {
    throw Error(ErrorCode::kPermission,
                "authentication failed at " + ep.to_string() + " as user '" + url.user +
                    "' with the password from " + url.password_source() + ": the server answered " +
                    memcached_strerror(nullptr, auth_result(rc) ? rc : last) +
                    "; check the user name and the password (SASL PLAIN)");
  }
  throw Error(ErrorCode::kNotAvailable, "connect " + ep.to_string() + ": " + why);
}

}  // namespace

std::unique_ptr<StoreConnection> connect_memcached(const RemoteEndpoint& endpoint,
                                                   const RemoteUrl& url,
                                                   RemoteClock::time_point deadline) {
  const long timeout_ms = std::max(1L, memcached_remaining_ms(deadline));
  memcached_st* mc = make_client(endpoint, url, timeout_ms);
  // libmemcached connects lazily; VERSION makes the connect (and its failure) happen now.
  const memcached_return_t rc = memcached_version(mc);
  if (rc != MEMCACHED_SUCCESS) {
    throw_connect_failure(mc, endpoint, url, rc, std::min(timeout_ms, kSaslProbeMaxMs));
  }
  return std::make_unique<MemcachedConnection>(mc);
}

MemcachedProbe probe_memcached(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                               std::chrono::milliseconds timeout) {
  memcached_st* mc = make_client(endpoint, url, static_cast<long>(timeout.count()));
  MemcachedProbe p;
  const auto t0 = RemoteClock::now();
  const memcached_return_t rc = memcached_version(mc);
  p.rtt_ms = std::chrono::duration<double, std::milli>(RemoteClock::now() - t0).count();
  if (rc != MEMCACHED_SUCCESS) {
    throw_connect_failure(mc, endpoint, url, rc,
                          std::min(static_cast<long>(timeout.count()), kSaslProbeMaxMs));
  }
  const memcached_instance_st* s = memcached_server_instance_by_position(mc, 0);
  if (s != nullptr) {
    p.version = std::to_string(memcached_server_major_version(s)) + "." +
                std::to_string(memcached_server_minor_version(s)) + "." +
                std::to_string(memcached_server_micro_version(s));
  }
  memcached_free(mc);
  return p;
}

}  // namespace kvoffload::detail
