// Where a value goes: the tier's nodes (each created with its workers), key -> node routing
// (standalone: the one node; cluster: CRC16 slot -> master from the CLUSTER SLOTS map;
// memcached: libmemcached's ketama hash), node failures, and the cluster slot map's refresher.
#include <algorithm>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>

#include "tier/remote/remote_tier_impl.hpp"
#include "util/log.hpp"

namespace kvoffload {

using namespace detail;

RemoteTier::Impl::Node* RemoteTier::Impl::node_at(std::uint32_t index) const {
  std::shared_lock lock(nodes_mutex);
  return index < nodes.size() ? nodes[index].get() : nullptr;
}

std::uint32_t RemoteTier::Impl::node_for(const RemoteEndpoint& ep) {
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

std::uint32_t RemoteTier::Impl::route(const StoreKey& key) {
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

bool RemoteTier::Impl::is_auth_failure(const std::exception& e) noexcept {
  const auto* error = dynamic_cast<const Error*>(&e);
  return error != nullptr && error->code() == ErrorCode::kPermission;
}

bool RemoteTier::Impl::is_auth_failure(const std::string& error) noexcept {
  return error.find("authentication failed") != std::string::npos;
}

void RemoteTier::Impl::auth_failed(const std::string& why) {
  ++auth_failures;
  std::lock_guard lock(auth_mutex);
  if (first_auth_failure.empty()) first_auth_failure = why;
}

void RemoteTier::Impl::node_failed(Node& node, const std::string& error) {
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

void RemoteTier::Impl::request_refresh() {
  {
    std::lock_guard lock(refresh_mutex);
    refresh_requested = true;
  }
  refresh_cv.notify_all();
}

bool RemoteTier::Impl::refresh_map() {
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
          cluster_slots(ep, o.url, o.connect_timeout + o.lookup_timeout);
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
      if (is_auth_failure(e)) auth_failed(e.what());
      errors += std::string(" ") + e.what() + ";";
    }
  }
  warn.warn("slot map", "remote tier {}: no cluster node gave a slot map:{}", o.name, errors);
  return false;
}

void RemoteTier::Impl::refresh_loop() {
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

}  // namespace kvoffload
