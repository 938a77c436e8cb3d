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
//
// The parts live in their own files (the list is in remote_tier_impl.hpp); this one opens and
// closes the tier and holds its public calls.
#include <algorithm>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "tier/remote/memcached_message.hpp"
#include "tier/remote/remote_tier_impl.hpp"
#include "util/log.hpp"

namespace kvoffload {

using namespace detail;

bool remote_tier_built() noexcept {
  return true;
}  // remote_tier_absent.cpp: false

RemoteTier::Impl::Impl(const RemoteTierOptions& options) : o(options), warn(options.warn_interval) {
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

// ---- open / close ---------------------------------------------------------------------------

void RemoteTier::Impl::start() {
  if (o.url.kind == RemoteKind::kMemcached) {
    router = memcached_create(nullptr);
    if (router == nullptr) throw Error(ErrorCode::kSystem, "memcached_create: out of memory");
    memcached_behavior_set(router, MEMCACHED_BEHAVIOR_DISTRIBUTION,
                           MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA);
    for (const auto& ep : o.url.nodes) {
      if (memcached_server_add(router, ep.host.c_str(), ep.port) != MEMCACHED_SUCCESS) {
        throw_invalid("memcached server " + ep.to_string() + ": " +
                      detail::memcached_message(router));
      }
    }
  }
  if (o.url.kind == RemoteKind::kRedisCluster) {
    for (const auto& ep : o.url.nodes) (void)node_for(ep);
    const bool mapped = refresh_map();
    if (auth_failures > 0) {
      // A cluster that refuses the credentials refuses them on every node: fail now, not with
      // a run of misses.
      std::lock_guard lock(auth_mutex);
      throw Error(ErrorCode::kPermission, "remote tier " + o.name + ": " + first_auth_failure);
    }
    if (!mapped) {
      log().warn("remote tier {}: the cluster at {} is unreachable; chunks miss until it answers",
                 o.name, o.url.to_string());
    }
    refresher = std::thread([this] { refresh_loop(); });
    return;
  }
  for (const auto& ep : o.url.nodes) (void)node_for(ep);
  // Probe each node once: an unreachable store warns and degrades (its circuit opens); one that
  // refuses the credentials (or their absence), or whose certificate does not verify, is a
  // misconfiguration and fails the open.
  for (std::uint32_t n = 0; n < o.url.nodes.size(); ++n) {
    Node& node = *node_at(n);
    try {
      const auto deadline = RemoteClock::now() + o.connect_timeout;
      if (o.url.kind == RemoteKind::kMemcached) {
        (void)connect_memcached(node.endpoint, o.url, deadline);
      } else {
        verify_redis(node.endpoint, o.url, deadline);
      }
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kPermission || e.code() == ErrorCode::kInvalidArgument) {
        throw Error(e.code(), "remote tier " + o.name + ": " + e.what());
      }
      log().warn(
          "remote tier {}: {} is unreachable at start ({}); its chunks miss until it answers",
          o.name, node.name, e.what());
      for (unsigned f = 0; f < o.breaker_failures; ++f) {
        if (node.breaker.on_failure(RemoteClock::now())) ++breaker_opens;
      }
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

void RemoteTier::Impl::drain() {
  std::unique_lock lock(outstanding_mutex);
  outstanding_cv.wait(lock, [&] { return outstanding == 0; });
}

void RemoteTier::Impl::stop() noexcept {
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
  require_open(impl_->closed, impl_->o.name);
  std::vector<Impl::RowIo> rows(items.size());
  for (std::size_t r = 0; r < items.size(); ++r) rows[r] = {items[r].key, items[r].bytes, {}};
  return impl_->submit_rows(OpKind::kPut, rows);
}

TierBatch RemoteTier::get(std::span<const TierGet> items) {
  require_open(impl_->closed, impl_->o.name);
  std::vector<Impl::RowIo> rows(items.size());
  for (std::size_t r = 0; r < items.size(); ++r) rows[r] = {items[r].key, {}, items[r].into};
  return impl_->submit_rows(OpKind::kGet, rows);
}

bool RemoteTier::contains(const BlockKey& key) const {
  std::lock_guard lock(impl_->presence_mutex);
  const auto it = impl_->presence.find(key);
  return it != impl_->presence.end() && it->second.state == Impl::Known::kPresent;
}

void RemoteTier::lookup(std::span<const BlockKey> keys, std::span<TierPresence> out) {
  Impl& m = *impl_;
  require_open(m.closed, m.o.name);
  if (out.size() < keys.size()) {
    throw_invalid("remote lookup: out holds " + std::to_string(out.size()) + " entries for " +
                  std::to_string(keys.size()) + " keys");
  }
  const std::vector<BlockKey> ask = m.answer_or_claim(keys, out);
  if (ask.empty()) return;
  m.lookups += ask.size();
  m.submit_exists(ask);
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
  s.auth_failures = m.auth_failures;
  std::shared_lock lock(m.nodes_mutex);
  s.nodes = m.nodes.size();
  for (const auto& n : m.nodes) s.nodes_open += n->breaker.open() ? 1 : 0;
  return s;
}

std::string RemoteTier::first_auth_failure() const {
  std::lock_guard lock(impl_->auth_mutex);
  return impl_->first_auth_failure;
}

TierStats RemoteTier::stats() const {
  const RemoteStats r = remote_stats();
  TierStats s;
  {
    std::lock_guard lock(impl_->presence_mutex);
    for (const auto& [k, e] : impl_->presence)
      s.entries += e.state == Impl::Known::kPresent ? 1 : 0;
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
