// RemoteTier (see remote_tier.hpp and Note [Remote values]).
//
// Note [Remote tier threads]: every node has `connections_per_node` worker threads, each owning
// one connection, fed from the node's queue. A batch becomes one ValueOp per (chunk row, copy);
// the ops are routed to nodes (standalone: the one node; cluster: CRC16 slot -> master from the
// CLUSTER SLOTS map; memcached: libmemcached's ketama hash) and cut into tasks of at most
// max_inflight_bytes / connections_per_node wire bytes, so the bytes one node has in flight stay
// within max_inflight_bytes, and of at most an equal share of the batch per connection (Note
// [Task size]). A worker pipelines its task (all requests, then all replies) against
// the batch's deadline. A row completes when its last copy does; only then, and only when every
// copy verified, are the bytes copied into the caller's row, so a miss never tears a region slot.
#include "kvoffload/remote_tier.hpp"

#include "kvoffload/error.hpp"
#include "kvoffload/log.hpp"
#include "remote_ops.hpp"
#include "util/rate_limited_log.hpp"

#include <libmemcached/memcached.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

namespace kvoffload {

using namespace detail;

namespace {

constexpr std::uint32_t kNoNode = 0xFFFFFFFFU;
constexpr std::uint8_t kMaxRedirects = 5;

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
  CircuitBreaker breaker;
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

}  // namespace

struct RemoteTier::Impl {
  RemoteTierOptions o;
  std::uint64_t fingerprint = 0;
  std::uint32_t copies = 1;
  std::uint64_t slot = 0;
  std::uint64_t stride = 0;  // rank r's slot starts at r * stride in a row
  std::uint64_t window = 0;  // wire bytes per task
  RemoteClock::duration absent_ttl{};

  // Before the nodes: destroyed after their workers (and every value they hold) are gone.
  std::unique_ptr<ValuePool> pool;

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
      tasks_sent{0};

  explicit Impl(const RemoteTierOptions& options) : o(options), warn(options.warn_interval) {
    fingerprint = o.geometry.fingerprint();
    copies = o.geometry.copies();
    slot = o.geometry.slot_bytes;
    stride = o.geometry.stride();
    absent_ttl = std::max(o.negative_ttl, o.lookup_timeout);
    // Enough recycled buffers for every node's in-flight window.
    pool = std::make_unique<ValuePool>(
        remote_value_bytes(slot), 2 * o.max_inflight_bytes / remote_value_bytes(slot) + 2 * copies);
    // A task is at most the node's in-flight cap split over its connections, and at most 4 MiB,
    // so one large batch is spread over every connection instead of filling one pipeline.
    window = std::max<std::uint64_t>(
        std::min<std::uint64_t>(o.max_inflight_bytes / o.connections_per_node, 4ULL << 20),
        remote_value_bytes(slot) + 256);
  }

  [[nodiscard]] std::uint32_t copy_id(std::uint32_t c) const {
    return o.geometry.replicated ? kReplicatedCopy : c;
  }

  // ---- nodes ----------------------------------------------------------------------------------

  Node* node_at(std::uint32_t index) const {
    std::shared_lock lock(nodes_mutex);
    return index < nodes.size() ? nodes[index].get() : nullptr;
  }

  // The index of the node at `ep`, created (with its workers) when new.
  std::uint32_t node_for(const RemoteEndpoint& ep) {
    {
      std::shared_lock lock(nodes_mutex);
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i]->endpoint == ep) return static_cast<std::uint32_t>(i);
      }
    }
    std::unique_lock lock(nodes_mutex);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i]->endpoint == ep) return static_cast<std::uint32_t>(i);
    }
    auto node = std::make_unique<Node>(ep, o);
    Node* raw = node.get();
    nodes.push_back(std::move(node));
    for (unsigned w = 0; w < o.connections_per_node; ++w) {
      raw->workers.emplace_back([this, raw] { worker(*raw); });
    }
    return static_cast<std::uint32_t>(nodes.size() - 1);
  }

  std::uint32_t route(const StoreKey& key) {
    switch (o.url.kind) {
      case RemoteKind::kRedis:
        return 0;
      case RemoteKind::kMemcached: {
        std::lock_guard lock(router_mutex);
        return memcached_generate_hash(router, key.text.data(), key.size);
      }
      case RemoteKind::kRedisCluster: {
        const std::uint16_t s = cluster_slot(key.view());
        std::shared_lock lock(map_mutex);
        return slot_map.empty() ? kNoNode : slot_map[s];
      }
    }
    return kNoNode;
  }

  void node_failed(Node& node, const std::string& error) {
    node.generation.fetch_add(1);
    if (node.breaker.on_failure(RemoteClock::now())) {
      ++breaker_opens;
      warn.warn("breaker " + node.name,
                "remote tier {}: node {} failed ({}); its chunks miss for {} ms, then it is probed",
                o.name, node.name, error, o.breaker_backoff.count());
    } else {
      warn.warn("node " + node.name, "remote tier {}: node {}: {}", o.name, node.name, error);
    }
    if (o.url.kind == RemoteKind::kRedisCluster) request_refresh();
  }

  // ---- batches --------------------------------------------------------------------------------

  std::shared_ptr<BatchCtx> make_ctx(OpKind kind, std::size_t rows,
                                     std::chrono::milliseconds timeout) {
    auto ctx = std::make_shared<BatchCtx>();
    ctx->kind = kind;
    ctx->num_rows = rows;
    ctx->rows = std::make_unique<Row[]>(rows);
    ctx->rows_left = rows;
    ctx->ops.resize(rows * copies);
    ctx->deadline = RemoteClock::now() + timeout;
    return ctx;
  }

  void init_row(BatchCtx& ctx, std::size_t r, const BlockKey& key) {
    ctx.rows[r].key = key;
    ctx.rows[r].remaining = copies;
    for (std::uint32_t c = 0; c < copies; ++c) {
      ValueOp& op = ctx.ops[r * copies + c];
      op.kind = ctx.kind;
      op.row = static_cast<std::uint32_t>(r);
      op.copy = copy_id(c);
      op.chunk = key;
      op.fingerprint = fingerprint;
      op.expected_payload = slot;
      op.key = make_store_key(fingerprint, key, op.copy);
    }
  }

  void begin(const std::shared_ptr<BatchCtx>& ctx) {
    {
      std::lock_guard lock(outstanding_mutex);
      ++outstanding;
    }
    in_flight += ctx->num_rows;
  }

  // Fails an op that never reached a server (or lost its connection) and finishes it.
  void fail_op(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i, std::string why) {
    ValueOp& op = ctx->ops[i];
    op.status = OpStatus::kError;
    op.detail = std::move(why);
    finish_op(ctx, i);
  }

  void submit(const std::shared_ptr<BatchCtx>& ctx, std::span<const std::uint32_t> indices) {
    std::size_t n_nodes = 0;
    {
      std::shared_lock lock(nodes_mutex);
      n_nodes = nodes.size();
    }
    std::vector<std::vector<std::uint32_t>> per_node(n_nodes);
    for (const std::uint32_t i : indices) {
      ValueOp& op = ctx->ops[i];
      if (op.status != OpStatus::kPending) continue;  // failed at validation
      const std::uint32_t n = route(op.key);
      if (n != kNoNode && n >= per_node.size()) per_node.resize(n + 1);  // a node added since
      if (n == kNoNode) {
        fail_op(ctx, i,
                "no node serves hash slot " + std::to_string(cluster_slot(op.key.view())) +
                    " (no cluster slot map yet)");
        continue;
      }
      op.node = n;
      per_node[n].push_back(i);
    }
    for (std::uint32_t n = 0; n < per_node.size(); ++n) {
      if (!per_node[n].empty()) enqueue(ctx, n, per_node[n]);
    }
  }

  void enqueue(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t n,
               std::span<const std::uint32_t> indices) {
    Node& node = *node_at(n);
    if (node.breaker.rejecting(RemoteClock::now())) {
      for (const std::uint32_t i : indices) fail_op(ctx, i, "node " + node.name + ": circuit open");
      return;
    }
    // Note [Task size]: a task is at most the window, and at most an equal share of this batch
    // per connection, so one batch keeps every connection of the node busy (32 values of 256 KiB
    // on 4 connections: 4 tasks of 2 MiB, not 2 of 4 MiB and two idle connections). Below
    // kMinShare a batch is not split further: tiny requests (EXISTS) gain nothing from it.
    constexpr std::uint64_t kMinShare = 64 * 1024;
    std::uint64_t total = 0;
    for (const std::uint32_t i : indices) total += ctx->ops[i].wire_bytes();
    const std::uint64_t share = (total + o.connections_per_node - 1) / o.connections_per_node;
    const std::uint64_t limit = std::min(window, std::max(share, kMinShare));
    std::vector<Task> tasks;
    Task t{ctx, {}, 0};
    for (const std::uint32_t i : indices) {
      const std::uint64_t b = ctx->ops[i].wire_bytes();
      if (!t.ops.empty() && t.bytes + b > limit) {
        tasks.push_back(std::move(t));
        t = Task{ctx, {}, 0};
      }
      t.ops.push_back(i);
      t.bytes += b;
    }
    tasks.push_back(std::move(t));
    std::vector<std::uint32_t> refused;
    {
      std::lock_guard lock(node.mutex);
      for (auto& task : tasks) {
        // Puts beyond the queue cap fail now: a slow node must not pin region slots without bound.
        if (ctx->kind == OpKind::kPut && node.queued_bytes + task.bytes > o.max_queued_bytes) {
          refused.insert(refused.end(), task.ops.begin(), task.ops.end());
          continue;
        }
        node.queued_bytes += task.bytes;
        node.queue.push_back(std::move(task));
        ++tasks_sent;
      }
    }
    node.cv.notify_all();
    for (const std::uint32_t i : refused) {
      fail_op(ctx, i,
              "node " + node.name + ": send queue full (" + std::to_string(o.max_queued_bytes) +
                  " bytes)");
    }
  }

  void redirect(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i) {
    ValueOp& op = ctx->ops[i];
    if (++op.redirects > kMaxRedirects) {
      op.status = OpStatus::kError;
      op.detail = "too many cluster redirects";
      finish_op(ctx, i);
      return;
    }
    ++redirects;
    const bool ask = op.status == OpStatus::kAsk;
    const std::uint32_t target = node_for(op.redirect_to);
    if (!ask) {
      std::unique_lock lock(map_mutex);
      if (!slot_map.empty()) slot_map[op.redirect_slot] = target;
    }
    if (!ask) request_refresh();
    op.asking = ask;
    op.status = OpStatus::kPending;
    op.value = HeldValue{};
    op.node = target;
    const std::uint32_t one[] = {i};
    enqueue(ctx, target, one);
  }

  void finish_op(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i) {
    Row& row = ctx->rows[ctx->ops[i].row];
    if (row.remaining.fetch_sub(1) == 1) finish_row(*ctx, ctx->ops[i].row);
  }

  void finish_row(BatchCtx& ctx, std::uint32_t r) {
    Row& row = ctx.rows[r];
    const std::span<ValueOp> ops(ctx.ops.data() + static_cast<std::size_t>(r) * copies, copies);
    const ValueOp* error = nullptr;
    const ValueOp* bad = nullptr;
    bool absent = false;
    for (const ValueOp& op : ops) {
      if (op.status == OpStatus::kError && error == nullptr) error = &op;
      if (op.status == OpStatus::kCorrupt) {
        ++corrupt;
        if (bad == nullptr) bad = &op;
      }
      if (op.status == OpStatus::kAbsent) absent = true;
    }
    const bool ok = error == nullptr && bad == nullptr && !absent;
    switch (ctx.kind) {
      case OpKind::kPut:
        if (ok) {
          ++stored;
          remember(row.key, Known::kPresent, false);
          ctx.promise->set(r, TierItemStatus::kOk);
        } else {
          ++put_errors;
          const ValueOp& e = error != nullptr ? *error : ops.front();
          ctx.promise->set(r, TierItemStatus::kFailed, 0,
                           std::string(e.key.view()) + ": " + e.detail);
        }
        break;
      case OpKind::kGet:
        if (ok) {
          for (std::uint32_t c = 0; c < copies; ++c) {
            std::memcpy(row.into.data() + c * stride,
                        ops[c].value.bytes.data() + kRemoteHeaderBytes, slot);
          }
          ++loaded;
          ctx.promise->set(r, TierItemStatus::kOk);
        } else if (error != nullptr) {
          ++get_errors;
          forget(row.key);
          ctx.promise->set(r, TierItemStatus::kFailed, 0,
                           std::string(error->key.view()) + ": " + error->detail);
        } else {
          ++get_misses;
          remember(row.key, Known::kAbsent, true);
          ctx.promise->set(r, TierItemStatus::kMiss, 0,
                           bad != nullptr ? std::string(bad->key.view()) + ": " + bad->detail
                                          : std::string("absent from the remote store"));
        }
        for (ValueOp& op : ops) op.value = HeldValue{};  // release the replies now
        break;
      case OpKind::kExists:
        if (ok) {
          ++lookup_present;
          resolve(row.key, Known::kPresent, false);
        } else if (error != nullptr) {
          ++lookup_errors;
          resolve(row.key, Known::kAbsent, true);
        } else {
          resolve(row.key, Known::kAbsent, false);
        }
        break;
    }
    --in_flight;
    if (ctx.rows_left.fetch_sub(1) == 1) {
      std::lock_guard lock(outstanding_mutex);
      if (--outstanding == 0) outstanding_cv.notify_all();
    }
  }

  // ---- presence -------------------------------------------------------------------------------

  void make_room() {  // presence_mutex held
    if (presence.size() < o.presence_capacity) return;
    std::erase_if(presence, [](const auto& kv) { return kv.second.state != Known::kPending; });
  }

  void remember(const BlockKey& key, Known state, bool counted) {
    std::lock_guard lock(presence_mutex);
    auto it = presence.find(key);
    if (it == presence.end()) {
      make_room();
      if (presence.size() >= o.presence_capacity) return;
      it = presence.emplace(key, PresenceEntry{}).first;
    }
    it->second = PresenceEntry{state, counted, false, RemoteClock::now()};
  }

  void forget(const BlockKey& key) {
    std::lock_guard lock(presence_mutex);
    presence.erase(key);
  }

  // An existence check finished: only a pending entry takes the answer (a put may have landed).
  void resolve(const BlockKey& key, Known state, bool counted) {
    std::lock_guard lock(presence_mutex);
    const auto it = presence.find(key);
    if (it == presence.end() || it->second.state != Known::kPending) return;
    if (state == Known::kAbsent && !it->second.counted && !counted) ++lookup_absent;
    // An answer that lands after the budget already gave "absent" counts as delivered.
    it->second = PresenceEntry{state, true, it->second.delivered, RemoteClock::now()};
  }

  // What lookup() answers for a remembered key, or nullopt when its answer expired and a new
  // check must start. presence_mutex held.
  std::optional<TierPresence> answer_locked(PresenceEntry& e, RemoteClock::time_point now) {
    if (e.state == Known::kPresent) return TierPresence::kPresent;
    // A resolved absent answer reaches the caller at least once, then lives negative_ttl (at
    // least lookup_timeout, so a caller polling a batch sees every key settle).
    if (e.state == Known::kAbsent && (!e.delivered || now - e.at < absent_ttl)) {
      e.delivered = true;
      return TierPresence::kAbsent;
    }
    if (e.state == Known::kPending) {
      if (now - e.at < o.lookup_timeout) return TierPresence::kPending;
      // The budget ran out: a miss now, never a stall; the answer may still land later.
      if (!e.counted) {
        e.counted = true;
        ++lookup_absent;
        ++lookup_timeouts;
      }
      e.delivered = true;
      return TierPresence::kAbsent;
    }
    return std::nullopt;
  }

  // ---- workers --------------------------------------------------------------------------------

  // A worker's connection and the node generation it was opened in.
  struct WorkerConnection {
    std::unique_ptr<StoreConnection> conn;
    std::uint64_t generation = 0;
  };

  void worker(Node& node) {
    WorkerConnection conn;
    std::vector<ValueOp*> ptrs;
    while (true) {
      Task task;
      {
        std::unique_lock lock(node.mutex);
        node.cv.wait(lock, [&] { return node.stopping || !node.queue.empty(); });
        if (node.queue.empty()) return;
        task = std::move(node.queue.front());
        node.queue.pop_front();
      }
      process(node, task, conn, ptrs);
      std::lock_guard lock(node.mutex);
      node.queued_bytes -= task.bytes;
    }
  }

  void process(Node& node, Task& task, WorkerConnection& wc, std::vector<ValueOp*>& ptrs) {
    std::unique_ptr<StoreConnection>& conn = wc.conn;
    const auto& ctx = task.ctx;
    const auto now = RemoteClock::now();
    if (now >= ctx->deadline) {
      for (const std::uint32_t i : task.ops) fail_op(ctx, i, "deadline passed before sending");
      return;
    }
    if (!node.breaker.allow(now)) {
      for (const std::uint32_t i : task.ops)
        fail_op(ctx, i, "node " + node.name + ": circuit open");
      return;
    }
    if (conn && wc.generation != node.generation.load()) conn.reset();  // opened before a failure
    if (!conn) {
      try {
        wc.generation = node.generation.load();
        const auto deadline = std::min(ctx->deadline, now + o.connect_timeout);
        conn = o.url.kind == RemoteKind::kMemcached
                   ? connect_memcached(node.endpoint, deadline)
                   : connect_redis(node.endpoint, o.url.db, deadline, pool.get());
      } catch (const std::exception& e) {
        node_failed(node, e.what());
        for (const std::uint32_t i : task.ops) fail_op(ctx, i, e.what());
        return;
      }
    }
    ptrs.clear();
    for (const std::uint32_t i : task.ops) {
      ValueOp& op = ctx->ops[i];
      if (op.kind == OpKind::kPut && !op.hashed) {
        // Hashed here, on the node's thread, so the scheduler never pays for the checksum.
        op.header = make_header(fingerprint, op.chunk, op.copy, op.payload);
        op.hashed = true;
      }
      ptrs.push_back(&op);
    }
    std::string error;
    const bool ok = conn->run(ptrs, ctx->deadline, error);
    if (!ok) {
      conn.reset();
      node_failed(node, error);
    } else {
      node.breaker.on_success();
    }
    for (const std::uint32_t i : task.ops) {
      ValueOp& op = ctx->ops[i];
      switch (op.status) {
        case OpStatus::kPending:
          op.status = OpStatus::kError;
          op.detail = "node " + node.name + ": " + error;
          finish_op(ctx, i);
          break;
        case OpStatus::kMoved:
        case OpStatus::kAsk:
          redirect(ctx, i);
          break;
        default:
          finish_op(ctx, i);
          break;
      }
    }
  }

  // ---- cluster map ----------------------------------------------------------------------------

  void request_refresh() {
    {
      std::lock_guard lock(refresh_mutex);
      refresh_requested = true;
    }
    refresh_cv.notify_all();
  }

  // Loads CLUSTER SLOTS from the first node that answers. True on success.
  bool refresh_map() {
    std::vector<RemoteEndpoint> candidates;
    {
      std::shared_lock lock(nodes_mutex);
      const auto now = RemoteClock::now();
      for (const auto& n : nodes) {
        if (!n->breaker.rejecting(now)) candidates.push_back(n->endpoint);
      }
      for (const auto& n : nodes) {
        if (n->breaker.rejecting(now)) candidates.push_back(n->endpoint);  // last resort
      }
    }
    for (const auto& seed : o.url.nodes) {
      if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end()) {
        candidates.push_back(seed);
      }
    }
    std::string errors;
    for (const auto& ep : candidates) {
      try {
        const std::vector<SlotRange> ranges =
            cluster_slots(ep, o.connect_timeout + o.lookup_timeout);
        if (ranges.empty()) {
          errors += " " + ep.to_string() + ": no slots assigned;";
          continue;
        }
        std::vector<std::uint32_t> map(kClusterSlots, kNoNode);
        for (const auto& range : ranges) {
          const std::uint32_t n = node_for(range.master);
          for (std::uint32_t s = range.first; s <= range.last; ++s) map[s] = n;
        }
        {
          std::unique_lock lock(map_mutex);
          slot_map = std::move(map);
        }
        ++map_refreshes;
        return true;
      } catch (const std::exception& e) {
        errors += std::string(" ") + e.what() + ";";
      }
    }
    warn.warn("slot map", "remote tier {}: no cluster node gave a slot map:{}", o.name, errors);
    return false;
  }

  void refresh_loop() {
    auto last = RemoteClock::now();
    bool have_map = true;
    {
      std::shared_lock lock(map_mutex);
      have_map = !slot_map.empty();
    }
    while (true) {
      {
        std::unique_lock lock(refresh_mutex);
        // Without a map, retry at the breaker's pace; with one, only when asked.
        const auto wake = [&] { return stopping || refresh_requested; };
        if (have_map) {
          refresh_cv.wait(lock, wake);
        } else {
          refresh_cv.wait_for(lock, o.breaker_backoff, wake);
        }
        if (stopping) return;
        refresh_requested = false;
      }
      // At most one refresh per 50 ms: a burst of MOVED replies during resharding is one reload.
      const auto since = RemoteClock::now() - last;
      if (since < std::chrono::milliseconds(50)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50) - since);
      }
      last = RemoteClock::now();
      if (refresh_map()) have_map = true;
    }
  }

  // ---- open / close ---------------------------------------------------------------------------

  void start() {
    if (o.url.kind == RemoteKind::kMemcached) {
      router = memcached_create(nullptr);
      if (router == nullptr) throw Error(ErrorCode::kSystem, "memcached_create: out of memory");
      memcached_behavior_set(router, MEMCACHED_BEHAVIOR_DISTRIBUTION,
                             MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA);
      for (const auto& ep : o.url.nodes) {
        if (memcached_server_add(router, ep.host.c_str(), ep.port) != MEMCACHED_SUCCESS) {
          throw_invalid("memcached server " + ep.to_string() + ": " +
                        memcached_last_error_message(router));
        }
      }
    }
    if (o.url.kind == RemoteKind::kRedisCluster) {
      for (const auto& ep : o.url.nodes) (void)node_for(ep);
      if (!refresh_map()) {
        log().warn("remote tier {}: the cluster at {} is unreachable; chunks miss until it answers",
                   o.name, o.url.to_string());
      }
      refresher = std::thread([this] { refresh_loop(); });
      return;
    }
    for (const auto& ep : o.url.nodes) (void)node_for(ep);
    // Probe each node once: an unreachable store warns and degrades (its circuit opens).
    for (std::uint32_t n = 0; n < o.url.nodes.size(); ++n) {
      Node& node = *node_at(n);
      try {
        const auto deadline = RemoteClock::now() + o.connect_timeout;
        (void)(o.url.kind == RemoteKind::kMemcached
                   ? connect_memcached(node.endpoint, deadline)
                   : connect_redis(node.endpoint, o.url.db, deadline));
      } catch (const std::exception& e) {
        log().warn(
            "remote tier {}: {} is unreachable at start ({}); its chunks miss until it answers",
            o.name, node.name, e.what());
        for (unsigned f = 0; f < o.breaker_failures; ++f) {
          if (node.breaker.on_failure(RemoteClock::now())) ++breaker_opens;
        }
      }
    }
  }

  void drain() {
    std::unique_lock lock(outstanding_mutex);
    outstanding_cv.wait(lock, [&] { return outstanding == 0; });
  }

  void stop() noexcept {
    {
      std::lock_guard lock(refresh_mutex);
      stopping = true;
    }
    refresh_cv.notify_all();
    if (refresher.joinable()) refresher.join();
    std::vector<Node*> all;
    {
      std::shared_lock lock(nodes_mutex);
      for (auto& n : nodes) all.push_back(n.get());
    }
    for (Node* n : all) {
      {
        std::lock_guard lock(n->mutex);
        n->stopping = true;
      }
      n->cv.notify_all();
    }
    for (Node* n : all) {
      for (auto& w : n->workers) {
        if (w.joinable()) w.join();
      }
    }
    if (router != nullptr) {
      memcached_free(router);
      router = nullptr;
    }
  }
};

// ---- RemoteTier
// -----------------------------------------------------------------------------------

std::unique_ptr<RemoteTier> RemoteTier::open(const RemoteTierOptions& options) {
  options.validate();
  auto impl = std::make_unique<Impl>(options);
  try {
    impl->start();
  } catch (...) {
    impl->stop();
    throw;
  }
  log().info("remote tier {}: {} ({} node(s)), fingerprint {:016x} ({})", options.name,
             options.url.to_string(), impl->nodes.size(), impl->fingerprint,
             options.geometry.describe());
  return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(impl)));
}

RemoteTier::RemoteTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteTier::~RemoteTier() {
  close();
}

const std::string& RemoteTier::name() const noexcept {
  return impl_->o.name;
}
const RemoteTierOptions& RemoteTier::options() const noexcept {
  return impl_->o;
}

std::string RemoteTier::store_key(const BlockKey& key, std::uint32_t copy) const {
  return std::string(make_store_key(impl_->fingerprint, key, impl_->copy_id(copy)).view());
}

namespace {
void require_open(const std::atomic<bool>& closed, const std::string& name) {
  if (closed.load()) throw Error(ErrorCode::kState, "remote tier " + name + " is closed");
}
}  // namespace

TierBatch RemoteTier::put(std::span<const TierPut> items) {
  Impl& m = *impl_;
  require_open(m.closed, m.o.name);
  if (items.empty()) return {};
  auto ctx = m.make_ctx(OpKind::kPut, items.size(), m.o.put_timeout);
  std::vector<BlockKey> keys(items.size());
  for (std::size_t r = 0; r < items.size(); ++r) keys[r] = items[r].key;
  ctx->promise.emplace(keys);
  TierBatch batch = ctx->promise->batch();
  m.begin(ctx);
  std::vector<std::uint32_t> indices;
  indices.reserve(ctx->ops.size());
  const std::uint64_t row_bytes =
      m.stride * m.copies;  // as TieredStore hands rows: copies x slot stride
  for (std::size_t r = 0; r < items.size(); ++r) {
    m.init_row(*ctx, r, items[r].key);
    const bool sized = items[r].bytes.size() == row_bytes;
    for (std::uint32_t c = 0; c < m.copies; ++c) {
      const auto i = static_cast<std::uint32_t>(r * m.copies + c);
      if (!sized) {
        m.fail_op(ctx, i,
                  "row of " + std::to_string(items[r].bytes.size()) + " bytes; expected " +
                      std::to_string(row_bytes));
        continue;
      }
      ctx->ops[i].payload = items[r].bytes.subspan(c * m.stride, m.slot);
      indices.push_back(i);
    }
  }
  m.submit(ctx, indices);
  return batch;
}

TierBatch RemoteTier::get(std::span<const TierGet> items) {
  Impl& m = *impl_;
  require_open(m.closed, m.o.name);
  if (items.empty()) return {};
  auto ctx = m.make_ctx(OpKind::kGet, items.size(), m.o.get_timeout);
  std::vector<BlockKey> keys(items.size());
  for (std::size_t r = 0; r < items.size(); ++r) keys[r] = items[r].key;
  ctx->promise.emplace(keys);
  TierBatch batch = ctx->promise->batch();
  m.begin(ctx);
  std::vector<std::uint32_t> indices;
  indices.reserve(ctx->ops.size());
  const std::uint64_t row_bytes =
      m.stride * m.copies;  // as TieredStore hands rows: copies x slot stride
  for (std::size_t r = 0; r < items.size(); ++r) {
    m.init_row(*ctx, r, items[r].key);
    ctx->rows[r].into = items[r].into;
    for (std::uint32_t c = 0; c < m.copies; ++c) {
      const auto i = static_cast<std::uint32_t>(r * m.copies + c);
      if (items[r].into.size() != row_bytes) {
        m.fail_op(ctx, i,
                  "buffer of " + std::to_string(items[r].into.size()) + " bytes; expected " +
                      std::to_string(row_bytes));
        continue;
      }
      indices.push_back(i);
    }
  }
  m.submit(ctx, indices);
  return batch;
}

bool RemoteTier::contains(const BlockKey& key) const {
  std::lock_guard lock(impl_->presence_mutex);
  const auto it = impl_->presence.find(key);
  return it != impl_->presence.end() && it->second.state == Known::kPresent;
}

void RemoteTier::lookup(std::span<const BlockKey> keys, std::span<TierPresence> out) {
  Impl& m = *impl_;
  require_open(m.closed, m.o.name);
  if (out.size() < keys.size()) {
    throw_invalid("remote lookup: out holds " + std::to_string(out.size()) + " entries for " +
                  std::to_string(keys.size()) + " keys");
  }
  std::vector<BlockKey> ask;
  const auto now = RemoteClock::now();
  {
    std::lock_guard lock(m.presence_mutex);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = m.presence.find(keys[i]);
      if (it != m.presence.end()) {
        if (const auto answer = m.answer_locked(it->second, now)) {
          out[i] = *answer;
          continue;
        }
        it->second = PresenceEntry{Known::kPending, false, false, now};  // an expired answer
      } else {
        m.make_room();
        if (m.presence.size() >= m.o.presence_capacity) {
          out[i] = TierPresence::kAbsent;  // every remembered key is in flight: no room to ask
          continue;
        }
        m.presence.emplace(keys[i], PresenceEntry{Known::kPending, false, false, now});
      }
      ask.push_back(keys[i]);
      out[i] = TierPresence::kPending;
    }
  }
  if (ask.empty()) return;
  m.lookups += ask.size();
  // The budget is the caller's (the entry turns absent at lookup_timeout above); the check runs
  // to a get's deadline, so an answer that is late but comes is remembered, and only a node that
  // does not answer at all counts as failed (lookup_errors, its circuit breaker).
  auto ctx = m.make_ctx(OpKind::kExists, ask.size(), std::max(m.o.lookup_timeout, m.o.get_timeout));
  m.begin(ctx);
  std::vector<std::uint32_t> indices(ctx->ops.size());
  for (std::size_t r = 0; r < ask.size(); ++r) m.init_row(*ctx, r, ask[r]);
  for (std::uint32_t i = 0; i < indices.size(); ++i) indices[i] = i;
  m.submit(ctx, indices);
}

std::optional<TierPresence> RemoteTier::known(const BlockKey& key) {
  Impl& m = *impl_;
  require_open(m.closed, m.o.name);
  std::lock_guard lock(m.presence_mutex);
  const auto it = m.presence.find(key);
  if (it == m.presence.end()) return std::nullopt;
  return m.answer_locked(it->second, RemoteClock::now());
}

TierBatch RemoteTier::remove(std::span<const BlockKey> keys) {
  require_open(impl_->closed, impl_->o.name);
  TierBatchPromise promise(keys);
  {
    std::lock_guard lock(impl_->presence_mutex);
    for (const auto& k : keys) impl_->presence.erase(k);
  }
  for (std::size_t i = 0; i < keys.size(); ++i) promise.set(i, TierItemStatus::kOk);
  return promise.batch();
}

void RemoteTier::drain() {
  impl_->drain();
}

RemoteStats RemoteTier::remote_stats() const {
  const Impl& m = *impl_;
  RemoteStats s;
  s.stored = m.stored;
  s.put_errors = m.put_errors;
  s.loaded = m.loaded;
  s.get_misses = m.get_misses;
  s.corrupt = m.corrupt;
  s.get_errors = m.get_errors;
  s.lookups = m.lookups;
  s.lookup_present = m.lookup_present;
  s.lookup_absent = m.lookup_absent;
  s.lookup_timeouts = m.lookup_timeouts;
  s.lookup_errors = m.lookup_errors;
  s.redirects = m.redirects;
  s.map_refreshes = m.map_refreshes;
  s.tasks = m.tasks_sent;
  s.breaker_opens = m.breaker_opens;
  std::shared_lock lock(m.nodes_mutex);
  s.nodes = m.nodes.size();
  for (const auto& n : m.nodes) s.nodes_open += n->breaker.open() ? 1 : 0;
  return s;
}

TierStats RemoteTier::stats() const {
  const RemoteStats r = remote_stats();
  TierStats s;
  {
    std::lock_guard lock(impl_->presence_mutex);
    for (const auto& [k, e] : impl_->presence) s.entries += e.state == Known::kPresent ? 1 : 0;
  }
  s.bytes = s.entries * impl_->copies * remote_value_bytes(impl_->slot);
  s.puts_ok = r.stored;
  s.puts_failed = r.put_errors;
  s.gets_ok = r.loaded;
  s.gets_miss = r.get_misses;
  s.gets_failed = r.get_errors;
  s.corrupt = r.corrupt;
  s.in_flight = impl_->in_flight;
  return s;
}

bool RemoteTier::close() noexcept {
  if (impl_->closed.exchange(true)) return true;
  try {
    impl_->drain();
  } catch (const std::exception& e) {
    log().error("remote tier {}: draining at close: {}", impl_->o.name, e.what());
  }
  impl_->stop();
  return true;
}

}  // namespace kvoffload
