// `kvoffload version`: the library version and the backends this build has (built or not, with
// their devices and why one is unavailable), as `probe` lists them.
#include <memory>
#include <string>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/version.hpp>

#include "cli.hpp"

namespace kvoffload::cli {
namespace {

const CommandRegistrar kRegister("version", [](CLI::App& top) {
  auto* app = top.add_subcommand("version", "Print the version and the backends built in");
  auto json = std::make_shared<bool>(false);
  app->add_flag("--json", *json, "Print one JSON object");
  return Command{app, [json] {
                   const std::vector<BackendInfo> backends = list_backends();
                   const nlohmann::json out{{"version", KVOFFLOAD_VERSION_STRING},
                                            {"backends", backends_json(backends)}};
                   emit(*json, out,
                        std::string("kvoffload ") + KVOFFLOAD_VERSION_STRING + "\nbackends:\n" +
                            backends_text(backends));
                   return kExitOk;
                 }};
});

}  // namespace
}  // namespace kvoffload::cli
