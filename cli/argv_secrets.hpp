#pragma once
// Store passwords typed on the command line (`--remote-tier redis://:PASSWORD@host:port`): kept
// out of the program's messages and, once the options are parsed, out of its argv, so that
// /proc/PID/cmdline and `ps` show the run with "***" for the rest of its life (docs/OPERATING.md,
// Security; password_file= and password_env= keep them out of argv altogether).
#include <string>

namespace kvoffload::cli {

// `message` with every command-line word that holds a URL password replaced by its redacted
// form (CLI11's usage errors quote the words they refuse).
std::string redact_argv_secrets(std::string message, int argc, char** argv);

// Overwrites, in place, the password of every command-line word that holds one with '*' (the
// kernel reads /proc/PID/cmdline from this memory). Call after parsing: the parser keeps copies.
void scrub_argv_secrets(int argc, char** argv) noexcept;

}  // namespace kvoffload::cli
