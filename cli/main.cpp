// kvoffload: the command-line program (docs/DESIGN.md §10.1). Subcommands register themselves.
#include <exception>
#include <iostream>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/version.hpp>

#include "argv_secrets.hpp"
#include "cli.hpp"

namespace kvoffload::cli {
std::map<std::string, CommandSetup>& command_registry();
}

namespace {

// Whether the command line asks for JSON. Read from the words themselves, so that a command line
// CLI11 refused (a usage error) still gets its error as JSON: "--json" before a "--" separator.
bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "--") break;
    if (word == "--json") return true;
  }
  return false;
}

// Reports a failure: the message on stderr (always), and with --json one error object on stdout,
// so a caller parsing stdout gets an answer on every exit. Never throws (it runs in main's
// handlers): what it cannot print is lost, the exit code is not.
int report_failure(bool json, std::string_view code, const std::string& message, int exit_code,
                   int sys_errno = 0, std::string_view call = {}) noexcept {
  using namespace kvoffload::cli;
  try {
    std::cerr << "kvoffload: " << printable(message) << "\n";
    if (json) emit(true, error_object(code, message, exit_code, sys_errno, call), "");
  } catch (...) {  // nothing is left to report it to
  }
  return exit_code;
}

// CLI11 answers a first word that is no command with "A subcommand is required": name the word
// and the commands instead. "" when the first word that is not an option is a command (or there
// is none: CLI11's own message covers that).
std::string unknown_command(int argc, char** argv) {
  using namespace kvoffload::cli;
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "--") return {};
    if (word.starts_with("-")) continue;  // --help, --version, --json take no value
    const auto& registry = command_registry();
    if (registry.contains(std::string(word))) return {};
    std::string names;
    for (const auto& entry : registry) {
      if (entry.first == "run-worker") continue;  // internal, hidden from --help
      names += (names.empty() ? "" : ", ") + entry.first;
    }
    return "unknown command '" + std::string(word) + "'; the commands are " + names +
           ". Run 'kvoffload --help' for usage.";
  }
  return {};
}

int run_program(int argc, char** argv, bool json) {
  using namespace kvoffload::cli;
  CLI::App app{"kvoffload: offload KV-cache blocks to a shared pinned host pool"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kvoffload ") + KVOFFLOAD_VERSION_STRING);
  std::vector<Command> commands;
  for (auto& [name, setup] : command_registry()) commands.push_back(setup(app));

  if (const std::string unknown = unknown_command(argc, argv); !unknown.empty()) {
    return report_failure(json, "usage", unknown, kExitUsage);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    return report_failure(json, "usage",
                          redact_argv_secrets(e.what(), argc, argv) +
                              "\nRun 'kvoffload --help' or 'kvoffload <command> --help' for usage.",
                          kExitUsage);
  } catch (const kvoffload::Error& e) {
    // From an option callback (a bad size). Every exit 2 carries the code "usage".
    return report_failure(json, "usage", e.what(), kExitUsage, e.sys_errno(), e.call());
  }

  scrub_argv_secrets(argc, argv);  // parsed: from now on `ps` shows "***"
  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
    return report_failure(json, "usage", "no command given; run 'kvoffload --help'", kExitUsage);
  } catch (const kvoffload::Error& e) {
    // A refused value is a usage error however it was found (by CLI11 or by the command): exit
    // 2 with the code "usage", so a script tells "fix the command line" from a failure.
    if (e.code() == kvoffload::ErrorCode::kInvalidArgument) {
      return report_failure(json, "usage", e.what(), kExitUsage, e.sys_errno(), e.call());
    }
    return report_failure(json, kvoffload::to_string(e.code()), e.what(), kExitError, e.sys_errno(),
                          e.call());
  } catch (const std::bad_alloc&) {
    return report_failure(json, "out_of_memory",
                          "out of memory (std::bad_alloc); the input may be larger than this "
                          "machine's memory",
                          kExitError);
  } catch (const std::exception& e) {
    return report_failure(json, "internal", std::string("unexpected error: ") + e.what(),
                          kExitError);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = json_requested(argc, argv);
  try {
    return run_program(argc, argv, json);
  } catch (const std::exception& e) {  // setting the commands up failed (out of memory)
    return report_failure(json, "internal", std::string("unexpected error: ") + e.what(),
                          kvoffload::cli::kExitError);
  } catch (...) {
    return report_failure(json, "internal", "unexpected error", kvoffload::cli::kExitError);
  }
}
