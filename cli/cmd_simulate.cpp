// `kvoffload simulate`: replays a request trace through the Manager as an engine's scheduler
// would, and reports hits, misses, evictions and the Manager's speed.
//
// Trace format: one request per line, its chunk keys in prefix order as hexadecimal strings
// (1 to 32 digits, shorter keys zero-padded to the 128-bit key width) separated by spaces or tabs.
// Lines whose first non-blank character is '#' are comments; blank lines are skipped.
//
// Per request: lookup (the longest hit prefix), touch the whole request (as an engine does at
// lookup, so a chunk seen for the first time is not counted as reused), prepare/complete load of
// the hit prefix, then prepare/complete store (success) of the remaining chunks, protecting the
// request's hit prefix from eviction. hits = chunks in hit prefixes, misses = the other chunks
// looked up; ops_per_second = Manager calls per second of replay (parsing excluded).
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kvoffload/block_key.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/manager.hpp>

#include "cli.hpp"

namespace kvoffload::cli {
namespace {

struct Trace {
  std::vector<BlockKey> keys;           // all requests, back to back
  std::vector<std::size_t> offsets{0};  // request i is keys[offsets[i] .. offsets[i+1])
};

[[noreturn]] void bad_token(const std::string& path, std::size_t line_no, std::string_view token) {
  std::string why;
  try {
    (void)BlockKey::parse_hex(token);
  } catch (const Error& e) {
    why = e.what();
  }
  throw_invalid("simulate: trace '" + path + "' line " + std::to_string(line_no) + ": token '" +
                std::string(token.substr(0, 64)) + "' is not a key (" + why +
                "); a request line lists hexadecimal chunk keys separated by spaces");
}

// Note [Trace parsing]: the file is read with one read into one buffer and parsed in place: no
// line strings, no per-token allocation, one table load per hex digit (BlockKey::try_parse_hex).
// An 800k-key trace parses in a few tens of milliseconds, below the replay itself.
Trace read_trace(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::is_directory(status)) {
    // An ifstream opens a directory and reports a size of 2^63: say what it is instead.
    throw_invalid("simulate: trace '" + path +
                  "' is a directory; give a trace file (one request per line)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kSystem,
                errno_text("simulate: cannot open trace '" + path + "'", err), err, "open");
  }
  std::string text;
  if (std::filesystem::is_regular_file(status)) {
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > 0) {
      text.resize(static_cast<std::size_t>(size));
      in.read(text.data(), static_cast<std::streamsize>(size));
      text.resize(static_cast<std::size_t>(in.gcount()));  // a file that shrank meanwhile
    }
  } else {
    // A pipe or a device (--trace /dev/stdin): no size to ask for; read it to the end.
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (in.bad()) throw_system_error("read", errno, "trace '" + path + "'");

  Trace trace;
  trace.keys.reserve(text.size() / (BlockKey::kHexDigits + 1) + 1);
  const char* p = text.data();
  const char* const end = p + text.size();
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  std::size_t line_no = 0;
  while (p < end) {
    ++line_no;
    while (p < end && blank(*p)) ++p;
    if (p < end && *p == '#') {
      const void* nl = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
      p = nl == nullptr ? end : static_cast<const char*>(nl) + 1;
      continue;
    }
    if (p == end) break;
    if (*p == '\n') {  // a blank line
      ++p;
      continue;
    }
    while (p < end && *p != '\n') {
      const char* token = p;
      while (p < end && *p != '\n' && !blank(*p)) ++p;
      const std::string_view text_of(token, static_cast<std::size_t>(p - token));
      const auto key = BlockKey::try_parse_hex(text_of);
      if (!key) bad_token(path, line_no, text_of);
      trace.keys.push_back(*key);
      while (p < end && blank(*p)) ++p;
    }
    trace.offsets.push_back(trace.keys.size());
    if (p < end) ++p;  // the newline
  }
  return trace;
}

struct Options {
  std::string trace;
  std::string policy = "lru";
  std::uint64_t chunks = 0;
  std::uint32_t store_threshold = 0;
  bool json = false;
};

int run_simulate(const Options& opt) {
  const PolicyKind policy = parse_policy_kind(opt.policy);
  if (opt.chunks == 0) throw_invalid("simulate: --chunks must be at least 1");
  ManagerConfig config;
  config.num_chunks = opt.chunks;
  config.policy = policy;
  config.store_threshold = opt.store_threshold;
  config.record_events = false;  // nobody drains them here
  Manager manager(config);       // validates before the trace is read: usage errors come first
  // CPU seconds beside wall seconds: on a shared machine wall time measures the neighbours.
  const auto cpu_now = [] { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
  const auto parse_start = std::chrono::steady_clock::now();
  const double parse_cpu_start = cpu_now();
  const Trace trace = read_trace(opt.trace);
  const double parse_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - parse_start).count();
  const double parse_cpu_seconds = cpu_now() - parse_cpu_start;

  std::uint64_t requests = 0;
  std::uint64_t hits = 0;
  std::uint64_t cannot_store = 0;
  std::uint64_t calls = 0;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = cpu_now();
  for (std::size_t r = 0; r + 1 < trace.offsets.size(); ++r) {
    const std::span<const BlockKey> keys(trace.keys.data() + trace.offsets[r],
                                         trace.offsets[r + 1] - trace.offsets[r]);
    ++requests;
    const std::size_t prefix = manager.lookup(keys);
    manager.touch(keys);
    calls += 2;
    const auto hit = keys.first(prefix);
    if (!hit.empty()) {
      (void)manager.prepare_load(hit);
      manager.complete_load(hit);
      calls += 2;
    }
    hits += prefix;
    const auto rest = keys.subspan(prefix);
    if (rest.empty()) continue;
    const StorePlan plan = manager.prepare_store(rest, hit);
    ++calls;
    if (!plan.ok()) {
      ++cannot_store;
      continue;
    }
    if (!plan.keys.empty()) {
      manager.complete_store(plan.keys, true);
      ++calls;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu_seconds = cpu_now() - cpu_start;

  const ManagerStats stats = manager.stats();
  const std::uint64_t looked_up = trace.keys.size();
  const double hit_rate =
      looked_up == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(looked_up);
  const double ops_per_second = seconds > 0 ? static_cast<double>(calls) / seconds : 0.0;
  const double keys_per_second = seconds > 0 ? static_cast<double>(looked_up) / seconds : 0.0;

  nlohmann::json out{
      {"requests", requests},
      {"chunks_looked_up", looked_up},
      {"hits", hits},
      {"misses", looked_up - hits},
      {"hit_rate", hit_rate},
      {"evictions", stats.evictions},
      {"ops_per_second", ops_per_second},
      {"policy", to_string(policy)},
      {"chunks", opt.chunks},
      {"store_threshold", opt.store_threshold},
      {"stored", stats.stores_completed},
      {"cannot_store", cannot_store},
      {"manager_calls", calls},
      {"seconds", seconds},
      {"cpu_seconds", cpu_seconds},
      {"parse_seconds", parse_seconds},
      {"parse_cpu_seconds", parse_cpu_seconds},
      {"requests_per_second", seconds > 0 ? static_cast<double>(requests) / seconds : 0.0},
  };
  char buf[512];
  (void)std::snprintf(
      buf, sizeof(buf),
      "simulate %s over %llu chunks: %llu requests, %llu chunks looked up\n"
      "  hits %llu, misses %llu, hit rate %.2f%%\n"
      "  evictions %llu, chunks stored %llu, requests that could not store %llu\n"
      "  %.3g manager calls/s (%.3g chunk keys/s), %.3f s (trace read and parsed in %.3f s)",
      std::string(to_string(policy)).c_str(), static_cast<unsigned long long>(opt.chunks),
      static_cast<unsigned long long>(requests), static_cast<unsigned long long>(looked_up),
      static_cast<unsigned long long>(hits), static_cast<unsigned long long>(looked_up - hits),
      100.0 * hit_rate, static_cast<unsigned long long>(stats.evictions),
      static_cast<unsigned long long>(stats.stores_completed),
      static_cast<unsigned long long>(cannot_store), ops_per_second, keys_per_second, seconds,
      parse_seconds);
  emit(opt.json, out, buf);
  return kExitOk;
}

const CommandRegistrar kRegisterSimulate("simulate", [](CLI::App& top) {
  auto* app = top.add_subcommand(
      "simulate",
      "Replay a request trace through the manager and report hits, misses, evictions and speed.\n"
      "Trace: one request per line, chunk keys in prefix order as hex strings separated by spaces\n"
      "(up to 32 digits, zero-padded on the left); lines starting with # are comments.");
  auto opt = std::make_shared<Options>();
  app->add_option("--trace", opt->trace, "Trace file")->required();
  app->add_option("--policy", opt->policy,
                  "Eviction policy: " + policy_kind_names() + " (default lru)");
  // The manager's limit: slot indexes are 32-bit and one value is reserved.
  app->add_option("--chunks", opt->chunks, "Chunk slots in the simulated region")
      ->required()
      ->check(whole_range(1, 0xFFFFFFFEULL));
  app->add_option("--store-threshold", opt->store_threshold,
                  "Store a chunk only after it was looked up this many times (0: always)")
      ->check(whole_range(0, std::numeric_limits<std::uint32_t>::max()));
  app->add_flag("--json", opt->json, "Print one JSON object");
  return Command{app, [opt] { return run_simulate(*opt); }};
});

}  // namespace
}  // namespace kvoffload::cli
