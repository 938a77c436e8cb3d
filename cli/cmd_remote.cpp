// `kvoffload remote check URL`: can this machine use the distributed store at URL? Connects to
// every node, times one round trip, and for a Redis Cluster reads the slot map and reports how
// many of the 16384 hash slots have a reachable master. Exits 0 only when the store can serve
// every key as given (RemoteCheckReport::problem()): every slot served by a reachable master,
// every memcached server reachable, a standalone Redis reachable and not in cluster mode.
#include <memory>
#include <sstream>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "cli.hpp"

namespace kvoffload::cli {
namespace {

struct CheckArgs {
  std::string url;
  unsigned timeout_ms = 1000;
  bool json = false;
};

nlohmann::json to_json(const RemoteCheckReport& r) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : r.nodes) {
    nlohmann::json j{{"endpoint", n.endpoint.to_string()},
                     {"reachable", n.reachable},
                     {"auth_failed", n.auth_failed}};
    if (n.reachable) {
      j["rtt_ms"] = n.rtt_ms;
      j["role"] = n.role;
      j["version"] = n.version;
    }
    if (r.url.kind == RemoteKind::kRedisCluster) j["slots"] = n.slots;
    if (!n.error.empty()) j["error"] = n.error;
    nodes.push_back(j);
  }
  nlohmann::json out{{"url", r.url.to_string()},
                     {"kind", std::string(to_string(r.url.kind))},
                     {"reachable", r.reachable()},
                     {"nodes", nodes}};
  if (r.url.kind == RemoteKind::kRedisCluster) {
    out["slots_assigned"] = r.slots_assigned;
    out["slots_covered"] = r.slots_covered;
  }
  return out;
}

std::string human(const RemoteCheckReport& r) {
  std::ostringstream out;
  out << "remote store " << r.url.to_string() << " (" << to_string(r.url.kind) << ")\n";
  for (const auto& n : r.nodes) {
    out << "  " << n.endpoint.to_string() << "  ";
    if (n.reachable) {
      out << n.role << (n.version.empty() ? "" : " " + n.version) << ", round trip " << n.rtt_ms
          << " ms";
      if (r.url.kind == RemoteKind::kRedisCluster) out << ", " << n.slots << " slots";
    } else if (n.auth_failed) {
      out << n.error;  // "authentication failed at ...", or the certificate that did not verify
    } else {
      out << "unreachable";
    }
    if (!n.error.empty() && !n.auth_failed) out << " (" << n.error << ")";
    out << "\n";
  }
  if (r.url.kind == RemoteKind::kRedisCluster) {
    out << "  slot coverage " << r.slots_covered << " / 16384 served by a reachable master"
        << (r.slots_covered == 16384 ? "" : " (INCOMPLETE: keys of uncovered slots will miss)")
        << "\n";
  }
  return out.str();
}

const CommandRegistrar kRegisterRemote("remote", [](CLI::App& top) {
  auto* app =
      top.add_subcommand("remote", "Distributed tier stores (Redis, Redis Cluster, memcached)");
  app->require_subcommand(1);
  auto* check = app->add_subcommand(
      "check", "Connect to a store, report its nodes, round-trip time and (cluster) slot coverage");
  auto args = std::make_shared<CheckArgs>();
  check
      ->add_option("url", args->url,
                   "redis://host:port[/db], redis-cluster://host:port[,...] or "
                   "memcached://host:port[,...]")
      ->required();
  check->add_option("--timeout-ms", args->timeout_ms, "Connect and reply deadline per node")
      ->capture_default_str();
  check->add_flag("--json", args->json, "Print one JSON object");
  return Command{
      app, [args] {
        const RemoteUrl url = RemoteUrl::parse(args->url);  // kInvalidArgument: exit 2
        if (args->timeout_ms == 0) throw_invalid("--timeout-ms 0: it must be at least 1");
        const RemoteCheckReport report =
            check_remote(url, std::chrono::milliseconds(args->timeout_ms));
        if (report.refused()) {
          // Not "unreachable": the server answered, and refused us.
          return emit_failure(
              args->json, to_json(report), human(report), to_string(ErrorCode::kPermission),
              "remote store " + url.to_string() + ": " + report.problem(), kExitError);
        }
        if (!report.reachable()) {
          std::string why;
          for (const auto& n : report.nodes) why += "; " + n.endpoint.to_string() + ": " + n.error;
          throw Error(ErrorCode::kNotAvailable,
                      "remote store " + url.to_string() + " is unreachable" + why +
                          ". Is the server running and listening on that address?");
        }
        if (const std::string problem = report.problem(); !problem.empty()) {
          return emit_failure(args->json, to_json(report), human(report),
                              to_string(ErrorCode::kNotAvailable),
                              "remote store " + url.to_string() + ": " + problem, kExitError);
        }
        emit(args->json, to_json(report), human(report));
        return kExitOk;
      }};
});

}  // namespace
}  // namespace kvoffload::cli
