// `kvoffload remote check`: reachability, round trip and (cluster) slot coverage of a store (the
// report's verdicts are in remote_check_report.cpp).
#include <algorithm>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "tier/remote/remote_ops.hpp"

namespace kvoffload {

using namespace detail;

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
