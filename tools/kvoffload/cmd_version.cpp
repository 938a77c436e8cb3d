// `kvoffload version`: the library version and the backends this build has.
#include "cli.hpp"

#include <kvoffload/version.hpp>

namespace kvoffload::cli {
namespace {

const CommandRegistrar kRegister("version", [](CLI::App& top) {
  auto* app = top.add_subcommand("version", "Print the version and the backends built in");
  auto json = std::make_shared<bool>(false);
  app->add_flag("--json", *json, "Print one JSON object");
  return Command{app, [json] {
                   nlohmann::json out{{"version", KVOFFLOAD_VERSION_STRING}};
                   emit(*json, out, std::string("kvoffload ") + KVOFFLOAD_VERSION_STRING);
                   return kExitOk;
                 }};
});

}  // namespace
}  // namespace kvoffload::cli
