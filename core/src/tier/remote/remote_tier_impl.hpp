#pragma once
// The state of one RemoteTier (RemoteTier::Impl) and the list of its parts; each part's code
// lives in its own file (Note [Remote tier threads] in remote_tier.cpp tells how they meet):
//   remote_tier.cpp      open/close, the public calls, the stats
//   remote_routing.cpp   nodes, key -> node routing, the cluster slot map and its refresher
//   remote_batches.cpp   a batch's ops and rows: the one submit path, tasks, redirects, completion
//   remote_presence.cpp  the presence cache that lookup() and known() answer from
//   remote_workers.cpp   the per-connection worker threads that run tasks against a node

#include <atomic>
#include <condition_variable>
#include <deque>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include <libmemcached/memcached.h>

#include <kvoffload/remote_tier.hpp>

#include "tier/remote/remote_ops.hpp"
#include "util/rate_limited_log.hpp"

namespace kvoffload {

// Hidden explicitly: a class nested in an exported one (RemoteTier is KVOFFLOAD_API) takes its
// visibility, and with its members defined in several files they would be exported.
struct __attribute__((visibility("hidden"))) RemoteTier::Impl {
  using ValueOp = detail::ValueOp;
  using OpKind = detail::OpKind;
  using OpStatus = detail::OpStatus;
  using RemoteClock = detail::RemoteClock;
  using StoreKey = detail::StoreKey;

  static constexpr std::uint32_t kNoNode = 0xFFFFFFFFU;
  static constexpr std::uint8_t kMaxRedirects = 5;

  struct Row {
    BlockKey key{};
    std::span<std::byte> into;
    std::atomic<std::uint32_t> remaining{0};
  };

  struct BatchCtx {
    OpKind kind = OpKind::kExists;
    std::vector<ValueOp> ops;  // row-major: row r's copies are ops[r*copies .. r*copies+copies)
    std::unique_ptr<Row[]> rows;
    std::size_t num_rows = 0;
    std::atomic<std::size_t> rows_left{0};
    std::optional<TierBatchPromise> promise;  // put/get; lookups have none
    RemoteClock::time_point deadline{};
  };

  struct Task {
    std::shared_ptr<BatchCtx> ctx;
    std::vector<std::uint32_t> ops;
    std::uint64_t bytes = 0;
  };

  struct Node {
    Node(RemoteEndpoint ep, const RemoteTierOptions& o)
        : endpoint(std::move(ep)),
          name(endpoint.to_string()),
          breaker(o.breaker_failures, o.breaker_backoff, o.breaker_backoff_max) {}
    RemoteEndpoint endpoint;
    std::string name;
    detail::CircuitBreaker breaker;
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Task> queue;
    std::uint64_t queued_bytes = 0;
    bool stopping = false;
    std::vector<std::thread> workers;
    // Bumped on every failure of the node: a worker whose connection is older reconnects before
    // its next task. Without it, after a restart of the node only the worker that saw the failure
    // reconnected; the others' first request went down a socket the dead server had reset.
    std::atomic<std::uint64_t> generation{0};
  };

  enum class Known : std::uint8_t { kPending, kPresent, kAbsent };
  struct PresenceEntry {
    Known state = Known::kPending;
    bool counted = false;    // its absent answer was counted already
    bool delivered = false;  // an absent answer was given to a caller (so it may expire)
    RemoteClock::time_point at{};
  };

  // One row of a put or a get as the shared submit path sees it.
  struct RowIo {
    BlockKey key{};
    std::span<const std::byte> payload;  // put: the row to store
    std::span<std::byte> into;           // get: where the verified row lands
  };

  // A worker's connection and the node generation it was opened in.
  struct WorkerConnection {
    std::unique_ptr<detail::StoreConnection> conn;
    std::uint64_t generation = 0;
  };

  RemoteTierOptions o;
  std::uint64_t fingerprint = 0;
  std::uint32_t copies = 1;
  std::uint64_t slot = 0;
  std::uint64_t stride = 0;  // rank r's slot starts at r * stride in a row
  std::uint64_t window = 0;  // wire bytes per task
  RemoteClock::duration absent_ttl{};

  // Before the nodes: destroyed after their workers (and every value they hold) are gone.
  std::unique_ptr<detail::ValuePool> pool;

  mutable std::shared_mutex nodes_mutex;
  std::vector<std::unique_ptr<Node>> nodes;

  // Cluster: slot -> node index.
  mutable std::shared_mutex map_mutex;
  std::vector<std::uint32_t> slot_map;
  std::mutex refresh_mutex;
  std::condition_variable refresh_cv;
  bool refresh_requested = false;
  bool stopping = false;
  std::thread refresher;

  // memcached: a client holding every server, used only for libmemcached's key -> server hash.
  std::mutex router_mutex;
  memcached_st* router = nullptr;

  mutable std::mutex presence_mutex;
  std::unordered_map<BlockKey, PresenceEntry, BlockKeyHash> presence;

  std::mutex outstanding_mutex;
  std::condition_variable outstanding_cv;
  std::size_t outstanding = 0;  // batches not finished

  std::atomic<bool> closed{false};
  detail::RateLimitedLog warn;  // Note [Rate-limited warnings]

  std::atomic<std::uint64_t> stored{0}, put_errors{0}, loaded{0}, get_misses{0}, corrupt{0},
      get_errors{0}, lookups{0}, lookup_present{0}, lookup_absent{0}, lookup_timeouts{0},
      lookup_errors{0}, redirects{0}, map_refreshes{0}, breaker_opens{0}, in_flight{0},
      tasks_sent{0}, auth_failures{0};
  mutable std::mutex auth_mutex;
  std::string first_auth_failure;  // auth_mutex; the first refusal of the credentials

  // Counts a refusal of the credentials (a connect that threw kPermission, a NOAUTH reply).
  void auth_failed(const std::string& why);
  // Whether a connect's exception or a connection's error text is such a refusal.
  static bool is_auth_failure(const std::exception& e) noexcept;
  static bool is_auth_failure(const std::string& error) noexcept;

  explicit Impl(const RemoteTierOptions& options);

  [[nodiscard]] std::uint32_t copy_id(std::uint32_t c) const {
    return o.geometry.replicated ? detail::kReplicatedCopy : c;
  }

  // ---- open / close (remote_tier.cpp) ----
  void start();
  void drain();
  void stop() noexcept;

  // ---- routing and the cluster map (remote_routing.cpp) ----
  Node* node_at(std::uint32_t index) const;
  // The index of the node at `ep`, created (with its workers) when new.
  std::uint32_t node_for(const RemoteEndpoint& ep);
  std::uint32_t route(const StoreKey& key);
  void node_failed(Node& node, const std::string& error);
  void request_refresh();
  // Loads CLUSTER SLOTS from the first node that answers. True on success.
  bool refresh_map();
  void refresh_loop();

  // ---- batches (remote_batches.cpp) ----
  std::shared_ptr<BatchCtx> make_ctx(OpKind kind, std::size_t rows,
                                     std::chrono::milliseconds timeout);
  void init_row(BatchCtx& ctx, std::size_t r, const BlockKey& key);
  void begin(const std::shared_ptr<BatchCtx>& ctx);
  // The one submit path of put() and get().
  TierBatch submit_rows(OpKind kind, std::span<const RowIo> items);
  // An existence check of every key in `keys` (lookup()).
  void submit_exists(std::span<const BlockKey> keys);
  // Fails an op that never reached a server (or lost its connection) and finishes it.
  void fail_op(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i, std::string why);
  void submit(const std::shared_ptr<BatchCtx>& ctx, std::span<const std::uint32_t> indices);
  void enqueue(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t n,
               std::span<const std::uint32_t> indices);
  void redirect(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i);
  void finish_op(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i);
  void finish_row(BatchCtx& ctx, std::uint32_t r);

  // ---- presence (remote_presence.cpp) ----
  void make_room();  // presence_mutex held
  void remember(const BlockKey& key, Known state, bool counted);
  void forget(const BlockKey& key);
  // An existence check finished: only a pending entry takes the answer (a put may have landed).
  void resolve(const BlockKey& key, Known state, bool counted);
  // What lookup() answers for a remembered key, or nullopt when its answer expired and a new
  // check must start. presence_mutex held.
  std::optional<TierPresence> answer_locked(PresenceEntry& e, RemoteClock::time_point now);
  // lookup()'s answers from memory into `out`; returns the keys that need an existence check
  // (entered as pending).
  std::vector<BlockKey> answer_or_claim(std::span<const BlockKey> keys,
                                        std::span<TierPresence> out);

  // ---- workers (remote_workers.cpp) ----
  void worker(Node& node);
  void process(Node& node, Task& task, WorkerConnection& wc, std::vector<ValueOp*>& ptrs);
};

}  // namespace kvoffload
