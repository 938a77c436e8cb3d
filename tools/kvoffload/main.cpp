// kvoffload: the command-line program (DESIGN.md §5). Subcommands register themselves.
#include "cli.hpp"

#include <kvoffload/error.hpp>
#include <kvoffload/version.hpp>

#include <exception>
#include <iostream>
#include <map>
#include <vector>

namespace kvoffload::cli {
std::map<std::string, CommandSetup>& command_registry();
}

int main(int argc, char** argv) {
  using namespace kvoffload::cli;
  CLI::App app{"kvoffload: offload KV-cache blocks to a shared pinned host pool"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kvoffload ") + KVOFFLOAD_VERSION_STRING);
  std::vector<Command> commands;
  for (auto& [name, setup] : command_registry()) commands.push_back(setup(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvoffload: " << e.what()
              << "\nRun 'kvoffload --help' or 'kvoffload <command> --help' for usage.\n";
    return kExitUsage;
  } catch (const kvoffload::Error& e) {
    std::cerr << "kvoffload: " << e.what() << "\n";  // from an option callback (a bad size)
    return kExitUsage;
  }

  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
    std::cerr << "kvoffload: no command given; run 'kvoffload --help'\n";
    return kExitUsage;
  } catch (const kvoffload::Error& e) {
    std::cerr << "kvoffload: " << e.what() << "\n";
    return e.code() == kvoffload::ErrorCode::kInvalidArgument ? kExitUsage : kExitError;
  } catch (const std::exception& e) {
    std::cerr << "kvoffload: unexpected error: " << e.what() << "\n";
    return kExitError;
  }
}
