// `kvoffload remote check`: reachability, round trip and (cluster) slot coverage of a store.
#include <algorithm>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "remote_ops.hpp"

namespace kvoffload {

using namespace detail;

bool RemoteCheckReport::reachable() const noexcept {
  return std::any_of(nodes.begin(), nodes.end(),
                     [](const RemoteNodeReport& n) { return n.reachable; });
}

bool RemoteCheckReport::refused() const noexcept {
  return std::any_of(nodes.begin(), nodes.end(),
                     [](const RemoteNodeReport& n) { return n.auth_failed; });
}

std::string RemoteCheckReport::problem() const {
  // Credentials (or a certificate) refused: the one thing to fix, whatever else is wrong.
  for (const auto& n : nodes) {
    if (n.auth_failed) return n.error;
  }
  std::vector<std::string> down;
  for (const auto& n : nodes) {
    if (!n.reachable) down.push_back(n.endpoint.to_string());
  }
  const auto list = [](const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
    return out;
  };
  switch (url.kind) {
    case RemoteKind::kRedisCluster: {
      if (slots_covered == kClusterSlots) return {};
      if (slots_assigned == 0) {
        std::string why;
        for (const auto& n : nodes) {
          if (!n.error.empty()) why += "; " + n.endpoint.to_string() + ": " + n.error;
        }
        return "no node gave a cluster slot map" + why +
               ". Is it a Redis Cluster (cluster-enabled yes) with every slot assigned? For a "
               "standalone server use redis://";
      }
      std::vector<std::string> masters_down;
      for (const auto& n : nodes) {
        if (!n.reachable && n.slots > 0) masters_down.push_back(n.endpoint.to_string());
      }
      std::string out = std::to_string(kClusterSlots - slots_covered) + " of " +
                        std::to_string(kClusterSlots) + " hash slots have no reachable master";
      if (!masters_down.empty()) out += " (unreachable: " + list(masters_down) + ")";
      if (slots_assigned < kClusterSlots) {
        out += "; " + std::to_string(kClusterSlots - slots_assigned) + " are assigned to no master";
      }
      return out + ": keys of those slots miss until the cluster is repaired";
    }
    case RemoteKind::kMemcached:
      if (down.empty()) return {};
      return std::to_string(down.size()) + " of " + std::to_string(nodes.size()) +
             " memcached servers are unreachable (" + list(down) +
             "): the keys hashed to them miss";
    case RemoteKind::kRedis:
      if (!down.empty()) return "the server is unreachable (" + list(down) + ")";
      for (const auto& n : nodes) {
        if (!n.error.empty()) return n.endpoint.to_string() + ": " + n.error;
      }
      return {};
  }
  return {};
}

namespace {

RemoteNodeReport probe(const RemoteUrl& url, const RemoteEndpoint& ep,
                       std::chrono::milliseconds timeout) {
  RemoteNodeReport r;
  r.endpoint = ep;
  try {
    if (url.kind == RemoteKind::kMemcached) {
      const MemcachedProbe p = probe_memcached(ep, url, timeout);
      r.rtt_ms = p.rtt_ms;
      r.version = p.version;
      r.role = "memcached";
    } else {
      const RedisProbe p = probe_redis(ep, url, timeout);
      r.rtt_ms = p.rtt_ms;
      r.version = p.version;
      r.role = url.kind == RemoteKind::kRedis ? (p.cluster_enabled ? "cluster-node" : "standalone")
                                              : (p.role.empty() ? "unknown" : p.role);
      if (url.kind == RemoteKind::kRedis && p.cluster_enabled) {
        r.error = "this node runs in cluster mode: use redis-cluster://";
      }
    }
    r.reachable = true;
  } catch (const Error& e) {
    r.error = e.what();
    r.auth_failed = e.code() == ErrorCode::kPermission;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace

RemoteCheckReport check_remote(const RemoteUrl& url, std::chrono::milliseconds timeout) {
  RemoteCheckReport report;
  report.url = url;
  if (url.kind != RemoteKind::kRedisCluster) {
    for (const auto& ep : url.nodes) report.nodes.push_back(probe(url, ep, timeout));
    return report;
  }
  // Cluster: the slot map from the first seed that answers, then every master it names.
  std::vector<SlotRange> ranges;
  std::vector<RemoteNodeReport> seeds;
  for (const auto& ep : url.nodes) {
    seeds.push_back(probe(url, ep, timeout));
    if (!seeds.back().reachable || !ranges.empty()) continue;
    try {
      ranges = cluster_slots(ep, url, timeout);
    } catch (const Error& e) {
      seeds.back().error = e.what();
      if (e.code() == ErrorCode::kPermission) {
        seeds.back().auth_failed = true;
        seeds.back().reachable = false;
      }
    } catch (const std::exception& e) {
      seeds.back().error = e.what();
    }
  }
  std::vector<RemoteEndpoint> masters;
  for (const auto& range : ranges) {
    if (std::find(masters.begin(), masters.end(), range.master) == masters.end()) {
      masters.push_back(range.master);
    }
  }
  for (const auto& m : masters) {
    auto it = std::find_if(seeds.begin(), seeds.end(),
                           [&](const RemoteNodeReport& s) { return s.endpoint == m; });
    RemoteNodeReport r = it != seeds.end() ? *it : probe(url, m, timeout);
    for (const auto& range : ranges) {
      if (range.master == m) r.slots += range.last - range.first + 1;
    }
    report.slots_assigned += r.slots;
    if (r.reachable) report.slots_covered += r.slots;
    report.nodes.push_back(std::move(r));
  }
  for (auto& s : seeds) {  // seeds that are not masters (replicas, or unreachable)
    if (std::find(masters.begin(), masters.end(), s.endpoint) == masters.end()) {
      report.nodes.push_back(std::move(s));
    }
  }
  return report;
}

}  // namespace kvoffload
