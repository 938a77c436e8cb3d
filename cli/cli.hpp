#pragma once
// Shared plumbing of the `kvoffload` program: subcommand registration, size parsing, output.
//
// Contract (docs/DESIGN.md §10.1): every subcommand takes --json and prints exactly one JSON object
// on stdout, exits 0 on success, and on error exits non-zero with a one-paragraph message on
// stderr.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <kvoffload/device_runtime.hpp>

namespace kvoffload::cli {

// Exit codes of the program.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // the operation failed (message on stderr)
inline constexpr int kExitUsage = 2;  // bad flags or values (usage message on stderr)

// A subcommand adds itself to the top-level app and returns its CLI::App plus a callback that runs
// it after parsing and returns the exit code. Errors are thrown (kvoffload::Error) and reported by
// main: kInvalidArgument exits with kExitUsage (JSON code "usage", as for every exit 2), anything
// else with kExitError.
using CommandRunner = std::function<int()>;
struct Command {
  CLI::App* app = nullptr;
  CommandRunner run;
};
using CommandSetup = std::function<Command(CLI::App& top)>;

struct CommandRegistrar {
  CommandRegistrar(std::string name, CommandSetup setup);
};

// Parses "4096", "64K", "2M", "1G", "1T" (powers of two, case-insensitive, optional trailing 'B'
// or 'iB'). Throws kvoffload::Error(kInvalidArgument) naming the flag and the value otherwise.
std::uint64_t parse_size(std::string_view flag, std::string_view text);

// Adds a size option that accepts the suffixes above and stores into `out`. A size outside
// [lo, hi] is a usage error naming the flag, the value and the range.
CLI::Option* add_size_option(CLI::App& app, const std::string& name, std::uint64_t& out,
                             const std::string& description, std::uint64_t lo = 0,
                             std::uint64_t hi = std::numeric_limits<std::uint64_t>::max());

// The check of an --engine-id flag, as the command line is parsed: 1 to 128 of [A-Za-z0-9._-],
// not "." or ".." (the rule of kvoffload::region_path); the message names the flag and the value.
CLI::Validator engine_id_check();

// Range checks for numeric options, run on the text when the command line is parsed. A value
// outside the range, or text that is not a number, is a usage error that names the flag, the
// value and the range, e.g. "--gpu-blocks: 0 is out of range; allowed 1 to 2^32" (CLI11 puts the
// flag in front). Bounds at or above 2^16 that are powers of two read as 2^N.
CLI::Validator whole_range(std::uint64_t lo, std::uint64_t hi);            // non-negative integers
CLI::Validator real_range(double lo, double hi, const std::string& unit);  // e.g. "seconds"

// How a bound reads in those messages: "64", "2^32", "2^32-1" (whole_range) and "64M" (sizes,
// which fall back to format_count when no K/M/G/T suffix is exact).
std::string format_count(std::uint64_t value);
std::string format_size(std::uint64_t bytes);

// Output of one subcommand: JSON on stdout when --json was given, otherwise the human text.
// Text that is not valid UTF-8 (a path, a token of a bad input file) never breaks the JSON: such
// bytes are replaced.
void emit(bool json, const nlohmann::json& object, const std::string& human_text);

// The JSON object a failed command prints with --json (main does it for thrown errors):
//   {"error": {"code": "system", "message": "...", "exit_code": 1,
//              "errno": "ENOSPC", "call": "fallocate"}}   (errno and call only when known)
// `code` is an ErrorCode name, or "usage" (every exit 2) / "internal" / "out_of_memory".
nlohmann::json error_object(std::string_view code, std::string_view message, int exit_code,
                            int sys_errno = 0, std::string_view call = {});

// A command that measured something and still failed (`run` whose bytes did not verify, `remote
// check` with uncovered slots): its report (with the "error" member of error_object added) or
// its human text on stdout, and `message` on stderr. Returns exit_code.
int emit_failure(bool json, nlohmann::json report, const std::string& human_text,
                 std::string_view code, const std::string& message, int exit_code);

// `text` with control characters (except newline and tab) and bytes that are not valid UTF-8
// written as \xNN, so input echoed in a message cannot garble a terminal or a log.
std::string printable(std::string_view text);

// The backends of list_backends() (built or not, device counts, why unavailable), as `probe`
// and `version` print them: a JSON array, and text lines "  cuda: 2 devices (...)".
nlohmann::json backends_json(const std::vector<BackendInfo>& backends);
std::string backends_text(const std::vector<BackendInfo>& backends);

// Formats bytes as "1.50 GiB" for human output.
std::string human_bytes(std::uint64_t bytes);

}  // namespace kvoffload::cli
