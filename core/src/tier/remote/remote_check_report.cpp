// The verdicts of a `kvoffload remote check` report (RemoteCheckReport): pure functions of the
// report, no network, so they are in every build (the probes are in remote_check.cpp).
#include <algorithm>
#include <string>
#include <vector>

#include <kvoffload/remote_tier.hpp>

#include "tier/remote/remote_value.hpp"

namespace kvoffload {

using detail::kClusterSlots;

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

}  // namespace kvoffload
