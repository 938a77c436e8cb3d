#pragma once
// Internals of the remote tier shared by its connections: one network operation per value
// (ValueOp), the connection interface, the per-node circuit breaker and a rate-limited warning.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

#include <kvoffload/remote_tier.hpp>

#include "tier/remote/remote_value.hpp"
#include "util/log.hpp"

namespace kvoffload::detail {

using RemoteClock = std::chrono::steady_clock;

enum class OpKind : std::uint8_t { kExists, kGet, kPut };

enum class OpStatus : std::uint8_t {
  kPending = 0,  // not answered yet
  kOk,           // exists: present; get: verified (value held); put: stored
  kAbsent,       // exists/get: no such key
  kCorrupt,      // get: a value that did not verify (detail says why)
  kError,        // an error reply, a timeout, a transport failure, an open circuit
  kMoved,        // cluster: MOVED slot endpoint (redirect_slot, redirect_to)
  kAsk,          // cluster: ASK slot endpoint
};

// Releases a value buffer: fn(ctx, p), e.g. back to a ValuePool, or free().
struct ValueDeleter {
  void (*fn)(void* ctx, void* p) = nullptr;
  void* ctx = nullptr;
  void operator()(void* p) const noexcept {
    if (fn != nullptr) fn(ctx, p);
  }
};

// A value read back, owned by whatever allocated it (the tier's pool, or the client library).
struct HeldValue {
  std::span<const std::byte> bytes;
  std::unique_ptr<void, ValueDeleter> owner;
};

// Buffers for values read back. Every value of a tier has the same size (header + slot), so
// buffers are recycled: a get allocates nothing once the pool is warm. Thread-safe.
class ValuePool {
 public:
  ValuePool(std::size_t value_bytes, std::size_t keep) : bytes_(value_bytes), keep_(keep) {}
  ValuePool(const ValuePool&) = delete;
  ValuePool& operator=(const ValuePool&) = delete;
  ~ValuePool() {
    for (void* p : free_) std::free(p);
  }
  // A buffer of `bytes` (the pool's size is recycled; any other size is a plain malloc).
  HeldValue acquire(std::size_t bytes) {
    void* p = nullptr;
    const bool recycled = bytes == bytes_ && keep_ > 0;
    if (recycled) {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        p = free_.back();
        free_.pop_back();
      }
    }
    if (p == nullptr) p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    HeldValue v;
    v.bytes = {static_cast<const std::byte*>(p), bytes};
    v.owner = std::unique_ptr<void, ValueDeleter>(
        p, recycled ? ValueDeleter{&ValuePool::give_back, this}
                    : ValueDeleter{[](void*, void* q) { std::free(q); }, nullptr});
    return v;
  }

 private:
  static void give_back(void* ctx, void* p) {
    auto* pool = static_cast<ValuePool*>(ctx);
    {
      std::lock_guard lock(pool->mutex_);
      if (pool->free_.size() < pool->keep_) {
        pool->free_.push_back(p);
        return;
      }
    }
    std::free(p);
  }
  std::mutex mutex_;
  std::vector<void*> free_;
  std::size_t bytes_;
  std::size_t keep_;
};

struct ValueOp {
  StoreKey key;
  OpKind kind = OpKind::kExists;
  std::uint32_t row = 0;               // index of the chunk row in its batch
  std::uint32_t copy = 0;              // copy index, or kReplicatedCopy
  std::uint32_t node = 0;              // node it is queued on
  std::span<const std::byte> payload;  // put: the slot bytes
  RemoteValueHeader header;            // put: built by the node's worker (hashed once)
  bool hashed = false;
  std::uint64_t expected_payload = 0;  // get: slot bytes
  // get: this copy's slot in the caller's row when the tier verifies in the destination
  // (RemoteTierOptions::verify_in_destination, Note [Gets into the destination]); empty: the
  // value is received into a buffer of its own and copied once the row verified.
  std::span<std::byte> into;
  std::uint64_t fingerprint = 0;
  BlockKey chunk{};
  // Results.
  OpStatus status = OpStatus::kPending;
  bool asking = false;  // send ASKING first (an ASK redirect)
  std::uint8_t redirects = 0;
  std::uint16_t redirect_slot = 0;
  RemoteEndpoint redirect_to;
  std::string detail;     // why an error or corrupt value (allocates only on failure)
  HeldValue value;        // get: the verified value until the row completes
  bool in_place = false;  // get: the verified payload is in `into` already (nothing held)

  // Bytes this op puts on the wire or expects back (for the in-flight cap).
  [[nodiscard]] std::uint64_t wire_bytes() const noexcept {
    switch (kind) {
      case OpKind::kPut:
        return kRemoteHeaderBytes + payload.size() + key.size + 64;
      case OpKind::kGet:
        return kRemoteHeaderBytes + expected_payload + key.size + 64;
      case OpKind::kExists:
        return key.size + 64;
    }
    return 0;
  }
};

// Applies a GET reply's bytes to the op: verifies and holds, or marks corrupt.
inline void accept_value(ValueOp& op, HeldValue value) {
  const ValueCheck check =
      verify_value(value.bytes, op.fingerprint, op.chunk, op.copy, op.expected_payload);
  if (check == ValueCheck::kOk) {
    op.status = OpStatus::kOk;
    op.value = std::move(value);
  } else {
    op.status = OpStatus::kCorrupt;
    op.detail =
        std::string(to_string(check)) + " (" + std::to_string(value.bytes.size()) + " bytes)";
  }
}

// One connection to one node, used by one worker thread at a time. Blocking with deadlines.
class StoreConnection {
 public:
  virtual ~StoreConnection() = default;
  StoreConnection() = default;
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  // Runs the ops (all of one kind) pipelined and sets each op's status. Returns false on a
  // transport failure or a deadline (`error` says which): the connection is then unusable and the
  // ops still kPending are failed by the caller.
  virtual bool run(std::span<ValueOp* const> ops, RemoteClock::time_point deadline,
                   std::string& error) = 0;
};

// Per-node circuit breaker. Closed: requests flow. `failures` consecutive failures open it for
// `backoff`; then one request (the probe) is let through: success closes it, failure opens it
// again for twice as long, up to `backoff_max`. Thread-safe.
class CircuitBreaker {
 public:
  CircuitBreaker(unsigned failures, std::chrono::milliseconds backoff,
                 std::chrono::milliseconds backoff_max)
      : threshold_(failures), backoff_min_(backoff), backoff_max_(backoff_max), backoff_(backoff) {}

  // True when a request may go to the node now (closed, or this caller is the probe).
  bool allow(RemoteClock::time_point now) {
    std::lock_guard lock(mutex_);
    if (state_ == State::kClosed) return true;
    if (state_ == State::kOpen && now >= retry_at_) {
      state_ = State::kProbing;
      return true;
    }
    return false;
  }
  // True when the node is open (or probing) and its retry time has not come: a fast miss.
  bool rejecting(RemoteClock::time_point now) const {
    std::lock_guard lock(mutex_);
    return state_ == State::kProbing || (state_ == State::kOpen && now < retry_at_);
  }
  void on_success() {
    std::lock_guard lock(mutex_);
    state_ = State::kClosed;
    failures_ = 0;
    backoff_ = backoff_min_;
  }
  // True when this failure opened the circuit.
  bool on_failure(RemoteClock::time_point now) {
    std::lock_guard lock(mutex_);
    if (state_ == State::kProbing) {
      backoff_ = std::min(backoff_ * 2, backoff_max_);
      state_ = State::kOpen;
      retry_at_ = now + backoff_;
      return false;
    }
    if (state_ == State::kOpen) return false;
    if (++failures_ < threshold_) return false;
    state_ = State::kOpen;
    retry_at_ = now + backoff_;
    return true;
  }
  [[nodiscard]] bool open() const {
    std::lock_guard lock(mutex_);
    return state_ != State::kClosed;
  }

 private:
  enum class State : std::uint8_t { kClosed, kOpen, kProbing };
  mutable std::mutex mutex_;
  State state_ = State::kClosed;
  unsigned failures_ = 0;
  unsigned threshold_;
  std::chrono::milliseconds backoff_min_, backoff_max_, backoff_;
  RemoteClock::time_point retry_at_{};
};

// Connections (remote_redis*.cpp, remote_memcached.cpp). Throw kvoffload::Error on failure:
// kPermission when the store refuses the credentials (or their absence) or, over TLS, its
// certificate does not verify; kNotAvailable when it cannot be reached. `url` gives the db, the
// credentials and TLS. `pool` (may be null: plain malloc) holds GET values; it must outlive the
// connection's values.
std::unique_ptr<StoreConnection> connect_redis(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                                               RemoteClock::time_point deadline,
                                               ValuePool* pool = nullptr);
std::unique_ptr<StoreConnection> connect_memcached(const RemoteEndpoint& endpoint,
                                                   const RemoteUrl& url,
                                                   RemoteClock::time_point deadline);
// connect_redis, then one PING: a server that wants a password the URL does not give answers
// NOAUTH only to a command, so connecting alone cannot tell.
void verify_redis(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                  RemoteClock::time_point deadline);

// A server's error reply that refuses the client's credentials: NOAUTH, WRONGPASS, NOPERM, and
// the ERR forms of AUTH refusals (a password sent to a server without one, Redis < 6's
// "invalid password").
bool is_auth_refusal(std::string_view reply) noexcept;
// The message of an authentication failure at `endpoint`: who tried (user, where the password
// came from), what the server answered, and what to do.
std::string auth_failure_text(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                              std::string_view answer);

// A parsed CLUSTER SLOTS range.
struct SlotRange {
  std::uint32_t first = 0, last = 0;
  RemoteEndpoint master;
};
// Redis helpers for the cluster map and `remote check` (each opens its own connection).
struct RedisProbe {
  double rtt_ms = 0;
  std::string version;
  bool cluster_enabled = false;
  std::string role;
};
RedisProbe probe_redis(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                       std::chrono::milliseconds timeout);
std::vector<SlotRange> cluster_slots(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                                     std::chrono::milliseconds timeout);
struct MemcachedProbe {
  double rtt_ms = 0;
  std::string version;
  std::uint64_t item_size_max = 0;  // 0: unknown
};
MemcachedProbe probe_memcached(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                               std::chrono::milliseconds timeout);

}  // namespace kvoffload::detail
