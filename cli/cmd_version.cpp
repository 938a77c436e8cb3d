// `kvoffload version`: the library version, the backends this build has (built or not, with
// their devices and why one is unavailable), as `probe` lists them, and whether it has the remote
// tier (-DKVOFFLOAD_REMOTE_TIER).
#include <memory>
#include <string>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/remote_tier.hpp>
#include <kvoffload/version.hpp>

#include "cli.hpp"

namespace kvoffload::cli {
namespace {

const CommandRegistrar kRegisterVersion("version", [](CLI::App& top) {
  auto* app = top.add_subcommand("version", "Print the version and the backends built in");
  auto json = std::make_shared<bool>(false);
  app->add_flag("--json", *json, "Print one JSON object");
  return Command{app, [json] {
                   const std::vector<BackendInfo> backends = list_backends();
                   const bool remote = remote_tier_built();
                   const nlohmann::json out{{"version", KVOFFLOAD_VERSION_STRING},
                                            {"backends", backends_json(backends)},
                                            {"remote_tier", remote}};
                   emit(*json, out,
                        std::string("kvoffload ") + KVOFFLOAD_VERSION_STRING + "\nbackends:\n" +
                            backends_text(backends) + "remote tier: " +
                            (remote ? "built (redis, redis-cluster, memcached)"
                                    : "not built (-DKVOFFLOAD_REMOTE_TIER=OFF)") +
                            "\n");
                   return kExitOk;
                 }};
});

}  // namespace
}  // namespace kvoffload::cli
