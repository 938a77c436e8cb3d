// How the program fails for scripts: --json gives one error object on stdout on every exit, bad
// traces are clear errors, usage errors exit 2 naming the problem and create nothing; and
// --version lists the backends.
//
// The `kvoffload` program as operators and scripts use it (docs/DESIGN.md §10.1): every test execs
// the real binary ($KVOFFLOAD_TEST_BIN_DIR/kvoffload) with a per-test temporary --shm-dir, and
// checks exit codes, JSON keys and values, and what is left in the directory. The suite:
// cli_probe_test.cpp, cli_region_test.cpp, cli_errors_test.cpp; its kit: cli_test_util.hpp.

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "cli_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::CliTest;
using kvoffload::test::kExitError;
using kvoffload::test::kExitOk;
using kvoffload::test::kExitUsage;
using kvoffload::test::Result;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// errors as scripts see them: --json gives one JSON object on stdout on every exit

// The error object of a failed command, checked against its exit code and stderr.
void expect_error_object(const Result& r, int exit_code, const std::string& code,
                         const std::string& mentions) {
  EXPECT_EQ(r.exit_code, exit_code) << "stderr: " << r.err << "\nstdout: " << r.out;
  EXPECT_THAT(r.err, HasSubstr(mentions));
  json j;
  try {
    j = json::parse(r.out);  // exactly one JSON value, nothing else on stdout
  } catch (const std::exception& e) {
    ADD_FAILURE() << "stdout is not one JSON object: " << e.what() << "\n" << r.out;
    return;
  }
  ASSERT_TRUE(j.contains("error")) << j.dump();
  EXPECT_EQ(j["error"]["code"], code) << j.dump();
  EXPECT_EQ(j["error"]["exit_code"], exit_code);
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(mentions));
}

TEST_F(CliTest, JsonOnErrorPrintsOneErrorObjectOnStdout) {
  const std::string missing = (dir_ / "missing").string();
  const fs::path trace = dir_ / "trace.txt";
  std::ofstream(trace) << "0a 0b\n";
  // Every subcommand, through each way a command fails: a refused command line, a bad value found
  // by the command, a failing operation.
  expect_error_object(run({"probe", "--shm-dir", missing, "--json"}), kExitError, "system",
                      missing);
  expect_error_object(run({"region", "list", "--shm-dir", missing, "--json"}), kExitUsage, "usage",
                      missing + " does not exist");
  expect_error_object(
      run({"region", "clean", "--shm-dir", shm_.string(), "--engine-id", "a b", "--json"}),
      kExitUsage, "usage", "a b");
  expect_error_object(run({"region", "create", "--shm-dir", shm_.string(), "--engine-id", "e",
                           "--chunks", "4", "--slot-bytes", "4K", "--threads", "0", "--json"}),
                      kExitUsage, "usage", "--threads: 0 is out of range");
  expect_error_object(run({"simulate", "--trace", trace.string(), "--chunks", "0", "--json"}),
                      kExitUsage, "usage", "--chunks: 0 is out of range");
  expect_error_object(run({"simulate", "--trace", missing, "--chunks", "4", "--json"}), kExitError,
                      "not_found", missing);
  expect_error_object(run({"remote", "check", "mongodb://h:1", "--json"}), kExitUsage, "usage",
                      "unknown scheme 'mongodb'");
  expect_error_object(run({"run", "--shm-dir", shm_.string(), "--host-pool", "1K", "--json"}),
                      kExitUsage, "usage", "--host-pool");
  expect_error_object(run({"version", "--json", "--bogus"}), kExitUsage, "usage", "--bogus");
  // Without --json stdout stays empty on error.
  const Result plain = run({"probe", "--shm-dir", missing});
  EXPECT_EQ(plain.exit_code, kExitError);
  EXPECT_TRUE(plain.out.empty()) << plain.out;
  EXPECT_TRUE(shm_is_empty());
}

// Input that used to slip through (issue 26): each is refused with exit 2 and the code "usage"
// (every exit 2 carries it, however the value was found), naming the flag, the value and what
// is allowed, and nothing is created.
TEST_F(CliTest, InputThatSlippedThroughIsRefusedNamingFlagValueAndRange) {
  const std::string shm = shm_.string();
  const auto run_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"run", "--shm-dir", shm, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  // An empty engine id used to become run-<pid>.
  expect_error_object(run_with({"--engine-id", ""}), kExitUsage, "usage",
                      "--engine-id: engine id '' has 0 characters; it must have 1 to 128");
  expect_error_object(run_with({"--engine-id", "a/b"}), kExitUsage, "usage",
                      "--engine-id: engine id 'a/b' contains the character '/'");
  // E and P were accepted although help and messages offer K/M/G/T; 1E then failed naming the
  // manager's num_chunks.
  expect_error_object(run_with({"--host-pool", "1E"}), kExitUsage, "usage",
                      "--host-pool '1E': unknown suffix 'E'; use plain bytes or a K/M/G/T suffix");
  expect_error_object(run_with({"--block-bytes", "1P"}), kExitUsage, "usage",
                      "--block-bytes '1P': unknown suffix 'P'");
  expect_error_object(run_with({"--host-pool", "abc"}), kExitUsage, "usage",
                      "--host-pool 'abc': not a number");
  // A pool of more chunks than a slot index counts names --host-pool, not num_chunks.
  expect_error_object(run_with({"--host-pool", "17T", "--world-size", "1", "--layers", "1",
                                "--block-bytes", "4K", "--blocks-per-chunk", "1"}),
                      kExitUsage, "usage",
                      "--host-pool 17T would hold 4563402752 chunks of 4K; at most 4294967294");
  // A device cache larger than the machine used to fail as "allocate_device of N bytes".
  expect_error_object(run_with({"--gpu-blocks", "4294967296", "--backend", "host"}), kExitUsage,
                      "usage", "--gpu-blocks 4294967296 x --block-bytes 16K x --layers");
  const Result big = run_with({"--gpu-blocks", "4294967296", "--backend", "host"});
  EXPECT_THAT(big.err, HasSubstr("of RAM, where the host backend keeps it"));
  EXPECT_THAT(big.err, ::testing::Not(HasSubstr("allocate_device")));
  // The same without --backend (the command): auto is the host backend without a GPU.
  // auto: the first of cuda, hip, host that is built and sees a device (`probe --json`).
  std::string auto_backend;
  const nlohmann::json probe = run_json({"probe"});
  for (const auto& b : probe["backends"]) {
    if (b["name"] != "sim" && b["built"].get<bool>() && b["device_count"].get<int>() > 0) {
      auto_backend = b["name"].get<std::string>();
      break;
    }
  }
  EXPECT_FALSE(auto_backend.empty()) << probe.dump();
  if (auto_backend == "host") {
    expect_error_object(run_with({"--gpu-blocks", "4294967296"}), kExitUsage, "usage",
                        "of RAM, where the host backend (--backend auto here) keeps it");
  }
  // An unknown subcommand is named, with the commands there are.
  expect_error_object(run({"nosuch", "--json"}), kExitUsage, "usage",
                      std::string("unknown command 'nosuch'; the commands are ") +
                          (KVOFFLOAD_TEST_EXPORTER ? "exporter, " : "") +
                          "probe, region, remote, run, simulate, top, version");
  const Result plain = run({"nosuch"});
  EXPECT_EQ(plain.exit_code, kExitUsage);
  EXPECT_THAT(plain.err, ::testing::Not(HasSubstr("A subcommand is required")));
  EXPECT_TRUE(shm_is_empty());
}

// `simulate --trace DIR` used to read a directory as a 2^63-byte file (std::bad_alloc).
TEST_F(CliTest, SimulateTraceThatIsADirectoryIsAClearError) {
  const Result r = run({"simulate", "--trace", dir_.string(), "--chunks", "4"});
  EXPECT_EQ(r.exit_code, kExitUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr("trace '" + dir_.string() + "' is a directory"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("bad_alloc")));
  // A pipe has no size to ask for, and is read to its end.
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::thread writer([&] { std::ofstream(fifo) << "0a 0b\n0a 0c\n"; });
  const Result f = run({"simulate", "--trace", fifo.string(), "--chunks", "4", "--json"});
  writer.join();
  ASSERT_EQ(f.exit_code, kExitOk) << f.err;
  EXPECT_EQ(json::parse(f.out)["requests"], 2);
  EXPECT_EQ(json::parse(f.out)["hits"], 1);
}

// Bytes of a bad trace that a terminal would act on are shown escaped, in text and in JSON;
// well-formed UTF-8 is kept.
TEST_F(CliTest, BinaryBytesOfABadTraceAreEscaped) {
  const fs::path trace = dir_ / "binary.trace";
  std::ofstream(trace, std::ios::binary) << "0a \xc3\xa9\x80\x1b[2J\x07\xc2\x9b\n";
  const Result r = run({"simulate", "--trace", trace.string(), "--chunks", "4"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("line 1"));
  EXPECT_THAT(r.err, HasSubstr("\xc3\xa9\\x80\\x1b[2J\\x07\\xc2\\x9b")) << r.err;
  for (const char raw : {'\x80', '\x1b', '\x07', '\x9b'}) {
    EXPECT_EQ(r.err.find(raw), std::string::npos) << "a raw byte " << int(raw) << ": " << r.err;
  }
  const Result j = run({"simulate", "--trace", trace.string(), "--chunks", "4", "--json"});
  EXPECT_EQ(j.exit_code, kExitUsage);
  const json e = json::parse(j.out);  // valid JSON although the input was not UTF-8
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("\xc3\xa9\\x80\\x1b"));
}

// `version` lists the backends its help promises: every backend, built or not.
TEST_F(CliTest, VersionListsTheBackends) {
  const json v = run_json({"version"});
  EXPECT_FALSE(v["version"].get<std::string>().empty());
  std::vector<std::string> names;
  for (const auto& b : v["backends"]) {
    names.push_back(b["name"]);
    EXPECT_TRUE(b.contains("built") && b.contains("device_count") && b.contains("detail"));
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("cuda", "hip", "host", "sim"));
  const Result text = run({"version"});
  EXPECT_EQ(text.exit_code, kExitOk);
  EXPECT_THAT(text.out, HasSubstr("backends:\n"));
  EXPECT_THAT(text.out, HasSubstr("  host: 1 device"));
  EXPECT_THAT(text.out, HasSubstr("  sim: "));
  // And whether the remote tier is built (KVOFFLOAD_REMOTE_TIER, ON in the presets).
  EXPECT_EQ(v["remote_tier"], KVOFFLOAD_TEST_REMOTE_TIER != 0);
  EXPECT_THAT(text.out,
              HasSubstr(KVOFFLOAD_TEST_REMOTE_TIER
                            ? "\nremote tier: built (redis, redis-cluster, memcached)\n"
                            : "\nremote tier: not built (-DKVOFFLOAD_REMOTE_TIER=OFF)\n"));
  // probe lists the same backends, the same way.
  const json p = run_json({"probe", "--shm-dir", shm_.string()});
  EXPECT_EQ(p["backends"].size(), v["backends"].size());
}

// ---------------------------------------------------------------------------------------------
// usage errors: exit 2, a message naming the problem, nothing created

struct UsageCase {
  const char* name;
  std::vector<std::string> args;  // after `region create --shm-dir DIR` unless `raw`
  const char* message;            // a substring stderr must contain
  bool raw = false;               // args are the whole command line (except --shm-dir)
};

class CliUsageTest : public CliTest, public ::testing::WithParamInterface<UsageCase> {};

TEST_P(CliUsageTest, ExitsWithUsageError) {
  const UsageCase& c = GetParam();
  std::vector<std::string> args;
  if (c.raw) {
    args = c.args;
    if (args.size() > 1) args.insert(args.end(), {"--shm-dir", shm_.string()});
  } else {
    args = {"region", "create", "--shm-dir", shm_.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
  }
  const Result r = run(args);
  EXPECT_EQ(r.exit_code, kExitUsage) << "stderr: " << r.err << "\nstdout: " << r.out;
  EXPECT_THAT(r.err, HasSubstr(c.message));
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(shm_is_empty());
}

// The hidden `run-worker` subcommand (the scheduler starts it) checks its one number too.
TEST_F(CliTest, RunWorkerFdOutOfRange) {
  const Result r = run({"run-worker", "--fd", "-1"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--fd: -1 is out of range; allowed 0 to 2^31-1"));
}

// Sizes take K/M/G/T (powers of two) in any case, with an optional B or iB.
TEST_F(CliTest, SizeSuffixesArePowersOfTwo) {
  int n = 0;
  for (const auto& [text, bytes] : std::vector<std::pair<std::string, std::uint64_t>>{
           {"8192", 8192}, {"8k", 8192}, {"8KiB", 8192}, {"8kb", 8192}, {"1M", 1U << 20}}) {
    const json j = run_json({"region", "create", "--shm-dir", shm_.string(), "--engine-id",
                             "size" + std::to_string(n++), "--chunks", "1", "--slot-bytes", text});
    EXPECT_EQ(j.value("slot_bytes", 0UL), bytes) << text << ": " << j.dump();
  }
}

const std::vector<std::string> kOk{"--engine-id", "e", "--chunks", "4", "--slot-bytes", "4K"};

std::vector<std::string> with(std::vector<std::string> more) {
  std::vector<std::string> args = kOk;
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, CliUsageTest,
    ::testing::Values(
        UsageCase{
            "bad_size_suffix", {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "4X"}, "'4X'"},
        UsageCase{"rank_not_below_world_size", with({"--world-size", "2", "--rank", "2"}),
                  "--rank 2"},
        UsageCase{"rank_and_unranked", with({"--rank", "1", "--unranked"}), "--unranked"},
        UsageCase{"missing_engine_id", {"--chunks", "4", "--slot-bytes", "4K"}, "--engine-id"},
        UsageCase{
            "bad_engine_id", {"--engine-id", "a/b", "--chunks", "4", "--slot-bytes", "4K"}, "a/b"},
        UsageCase{
            "dotdot_engine_id", {"--engine-id", "..", "--chunks", "4", "--slot-bytes", "4K"}, ".."},
        UsageCase{"zero_chunks",
                  {"--engine-id", "e", "--chunks", "0", "--slot-bytes", "4K"},
                  "--chunks: 0 is out of range; allowed 1 to 2^64-1"},
        UsageCase{"too_many_chunks",
                  {"--engine-id", "e", "--chunks", "18446744073709551616", "--slot-bytes", "4K"},
                  "--chunks: 18446744073709551616 is out of range; allowed 1 to 2^64-1"},
        UsageCase{"chunks_not_a_number",
                  {"--engine-id", "e", "--chunks", "1e3", "--slot-bytes", "4K"},
                  "--chunks: '1e3' is not a whole number; allowed 1 to 2^64-1"},
        UsageCase{"zero_slot_bytes",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "0"},
                  "--slot-bytes: 0 is out of range; allowed 1 to 1T bytes"},
        UsageCase{"slot_bytes_too_big",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "2T"},
                  "--slot-bytes: 2T is out of range; allowed 1 to 1T bytes"},
        UsageCase{"slot_bytes_overflow",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "16777216T"},
                  "--slot-bytes '16777216T': too large"},
        UsageCase{"slot_bytes_digits_overflow",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "99999999999999999999"},
                  "--slot-bytes '99999999999999999999': too large"},
        UsageCase{"slot_bytes_not_a_number",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "K"},
                  "--slot-bytes 'K': not a number"},
        UsageCase{"zero_world_size", with({"--world-size", "0"}),
                  "--world-size: 0 is out of range; allowed 1 to 2^32-1"},
        UsageCase{"negative_rank", with({"--rank", "-1"}),
                  "--rank: -1 is out of range; allowed 0 to 4294967294"},
        UsageCase{"negative_join_timeout", with({"--join-timeout", "-1"}),
                  "--join-timeout: -1 is out of range; allowed 0 to 1000000000 seconds"},
        UsageCase{"join_timeout_not_a_number", with({"--join-timeout", "later"}),
                  "--join-timeout: 'later' is not a number; allowed 0 to 1000000000 seconds"},
        UsageCase{"too_many_threads", with({"--threads", "1025"}),
                  "--threads: 1025 is out of range; allowed 1 to 1024"},
        UsageCase{"fill_too_big", with({"--fill", "256"}), "'256'"},
        UsageCase{"check_not_hex", with({"--check", "0xZZ"}), "'0xZZ'"},
        UsageCase{"zero_threads", with({"--threads", "0"}),
                  "--threads: 0 is out of range; allowed 1 to 1024"},
        UsageCase{"negative_hold", with({"--hold", "-1"}),
                  "--hold: -1 is out of range; allowed 0 to 1000000000 seconds"},
        UsageCase{"nan_hold", with({"--hold", "nan"}),
                  "--hold: 'nan' is not a number; allowed 0 to 1000000000 seconds"},
        UsageCase{"unknown_flag", with({"--bogus"}), "--bogus"},
        UsageCase{"region_without_subcommand", {"region"}, "subcommand", true},
        UsageCase{"clean_bad_engine_id", {"region", "clean", "--engine-id", "x y"}, "x y", true}),
    [](const ::testing::TestParamInfo<UsageCase>& p) { return std::string(p.param.name); });

}  // namespace
