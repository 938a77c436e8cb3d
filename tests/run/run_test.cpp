#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "skip.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

std::string binary() {
  const char* dir = std::getenv("KVOFFLOAD_TEST_BIN_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/kvoffload";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class RunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "kvoffload_run_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    shm_ = dir_ / "shm";
    fs::create_directory(shm_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts `kvoffload run <args> --shm-dir <shm>` with stdout/stderr to files.
  pid_t start(std::vector<std::string> args) {
    args.insert(args.begin(), {binary(), "run", "--shm-dir", shm_.string()});
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = (dir_ / "out").string();
    const std::string err = (dir_ / "err").string();
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);  // its own process group, as a terminal job would be
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return pid;
  }

  int finish(pid_t pid) {
    int status = 0;
    for (int i = 0; i < 1200; ++i) {  // 120 s
      if (waitpid(pid, &status, WNOHANG) == pid)
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "kvoffload run did not finish";
    return -1;
  }

  int run(std::vector<std::string> args) { return finish(start(std::move(args))); }
  std::string out() const { return slurp(dir_ / "out"); }
  std::string err() const { return slurp(dir_ / "err"); }
  json report() const { return json::parse(out()); }
  bool shm_empty() const { return fs::is_empty(shm_); }

  fs::path dir_;
  fs::path shm_;
};

// A small pool (8 chunks of 2 ranks x 4 layers x 4 KiB x 2 blocks) under a workload of 6 prefixes
// of up to 4 chunks: stores, evictions, and loads that must come back byte for byte.
const std::vector<std::string> kSmall = {
    "--backend",          "host",     "--world-size",    "2",
    "--layers",           "4",        "--block-bytes",   "4K",
    "--blocks-per-chunk", "2",        "--gpu-blocks",    "64",
    "--host-pool",        "512K",     "--prefixes",      "6",
    "--prefix-chunks",    "4",        "--unique-chunks", "1",
    "--requests",         "120",      "--duration",      "0",
    "--bringup",          "blocking", "--json"};  // blocking: the same seed gives the same
                                                  // decisions

TEST_F(RunTest, EveryLoadedByteIsVerifiedAndTheRegionIsRemoved) {
  ASSERT_EQ(run(kSmall), 0) << err();
  const json r = report();
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_TRUE(r["region_removed"].get<bool>());
  EXPECT_EQ(r["requests"], 120);
  EXPECT_EQ(r["chunks"], 8);
  EXPECT_GT(r["hits"].get<std::uint64_t>(), 0u);
  EXPECT_GT(r["evictions"].get<std::uint64_t>(), 0u) << "the pool is smaller than the working set";
  EXPECT_GT(r["load_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(r["verified_bytes"], r["load_bytes"]);
  EXPECT_EQ(r["mismatched_bytes"], 0);
  EXPECT_EQ(r["failed_jobs"], 0);
  // Every hit chunk moves layers x blocks_per_chunk x block_bytes per rank.
  EXPECT_EQ(r["load_bytes"].get<std::uint64_t>(),
            r["hits"].get<std::uint64_t>() * 2 * 4 * 2 * 4096);
  EXPECT_EQ(r["hits"].get<std::uint64_t>() + r["misses"].get<std::uint64_t>(),
            r["chunks_looked_up"].get<std::uint64_t>());
  ASSERT_EQ(r["ranks"].size(), 2u);
  EXPECT_EQ(r["ranks"][0]["role"], "joiner") << "the scheduler creates the region before the ranks";
  EXPECT_TRUE(shm_empty());
}

// The main job on the simulated GPU: the GPU runtime's copy paths (batched DMA, copy kernel) with
// every loaded byte verified, and rank r on device r mod the device count.
TEST_F(RunTest, OnTheSimulatedGpuEveryByteVerifiesAndRanksSpreadOverDevices) {
  std::vector<std::string> args = kSmall;
  args[1] = "sim";
  args[std::find(args.begin(), args.end(), "120") - args.begin()] = "40";
  ::setenv("KVOFFLOAD_SIM_DEVICES", "2", 1);
  const int rc = run(args);
  ::unsetenv("KVOFFLOAD_SIM_DEVICES");
  ASSERT_EQ(rc, 0) << err();
  const json r = report();
  EXPECT_EQ(r["backend"], "sim");
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_GT(r["load_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(r["verified_bytes"], r["load_bytes"]);
  ASSERT_EQ(r["ranks"].size(), 2u);
  EXPECT_EQ(r["ranks"][0]["device"], 0);
  EXPECT_EQ(r["ranks"][1]["device"], 1);
  EXPECT_TRUE(shm_empty());

  // --devices overrides the placement; a device the backend lacks is refused clearly.
  args.insert(args.end() - 1, {"--devices", "0"});
  ASSERT_EQ(run(args), 0) << err();
  EXPECT_EQ(report()["ranks"][1]["device"], 0);
  args[args.size() - 2] = "3";
  EXPECT_NE(run(args), 0);
  EXPECT_THAT(err(), HasSubstr("would use device 3"));
  EXPECT_TRUE(shm_empty());
}

// Note [Progressive bring-up]: the ranks come up in pieces (here one 64 KiB row each) while the
// scheduler serves; each rank registers every piece, the pool becomes ready on every rank, and
// every byte still verifies.
TEST_F(RunTest, BackgroundBringupServesAtOnceAndReportsReadiness) {
  std::vector<std::string> args = kSmall;
  const auto mode = std::find(args.begin(), args.end(), "blocking");
  ASSERT_NE(mode, args.end());
  *mode = "background";
  args.insert(args.end(), {"--bringup-piece", "64K"});
  ASSERT_EQ(run(args), 0) << err();
  const json r = report();
  EXPECT_EQ(r["bringup"], "background");
  EXPECT_EQ(r["bringup_piece_bytes"], 65536);
  EXPECT_TRUE(r["first_request_seconds"].is_number());
  EXPECT_TRUE(r["pool_ready_seconds"].is_number());
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_EQ(r["failed_jobs"], 0);
  EXPECT_TRUE(r["region_removed"].get<bool>());
  ASSERT_EQ(r["rank_bringup"].size(), 2u);
  for (const auto& b : r["rank_bringup"]) {
    EXPECT_EQ(b["bringup"]["state"], "ready");
    EXPECT_EQ(b["bringup"]["ready_chunks"], 8);
    EXPECT_EQ(b["registration"]["pieces"], 8) << "one registration per 64 KiB row";
  }
  EXPECT_TRUE(shm_empty());

  // Blocking: the engine registers the whole region once; no piece registrations.
  ASSERT_EQ(run(kSmall), 0) << err();
  const json b = report();
  EXPECT_EQ(b["bringup"], "blocking");
  EXPECT_TRUE(b["pool_ready_seconds"].is_number());
  EXPECT_EQ(b["rank_bringup"][0]["registration"]["pieces"], 0);
}

TEST_F(RunTest, TheSameSeedGivesTheSameDecisions) {
  ASSERT_EQ(run(kSmall), 0) << err();
  const json a = report();
  ASSERT_EQ(run(kSmall), 0) << err();
  const json b = report();
  EXPECT_EQ(a["hits"], b["hits"]);
  EXPECT_EQ(a["evictions"], b["evictions"]);
}

TEST_F(RunTest, OddBlockSizesAndOneRankVerify) {
  ASSERT_EQ(run({"--backend",          "host",     "--world-size",    "1",
                 "--layers",           "3",        "--block-bytes",   "1000",
                 "--blocks-per-chunk", "1",        "--gpu-blocks",    "40",
                 "--host-pool",        "64K",      "--prefixes",      "3",
                 "--prefix-chunks",    "6",        "--unique-chunks", "2",
                 "--requests",         "60",       "--duration",      "0",
                 "--bringup",          "blocking", "--json"}),
            0)
      << err();
  const json r = report();
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_GT(r["verified_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(shm_empty());
}

TEST_F(RunTest, EvictedChunksComeBackFromTheFileTier) {
  std::vector<std::string> args = kSmall;
  args.insert(args.end(), {"--file-tier", (dir_ / "tier").string()});
  fs::create_directory(dir_ / "tier");
  ASSERT_EQ(run(args), 0) << err();
  const json r = report();
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_GT(r["tier_offloads"].get<std::uint64_t>(), 0u);
  EXPECT_GT(r["promoted"].get<std::uint64_t>(), 0u) << "evicted prefixes are requested again";
  EXPECT_TRUE(shm_empty());
}

TEST_F(RunTest, HumanOutputWithoutJson) {
  std::vector<std::string> args = kSmall;
  args.pop_back();  // --json
  ASSERT_EQ(run(args), 0) << err();
  EXPECT_THAT(out(), HasSubstr("every byte verified"));
  EXPECT_THAT(err(), HasSubstr("run:")) << "plain progress lines when stderr is not a terminal";
}

TEST_F(RunTest, InterruptStopsCleanlyAndRemovesTheRegion) {
  const pid_t pid = start({"--backend", "host", "--duration", "60", "--json"});
  // Wait until the ranks are working (the region exists and progress is printed).
  for (int i = 0; i < 200 && err().find("run:") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(shm_empty());
  kill(-pid, SIGINT);  // Ctrl-C reaches the whole process group
  EXPECT_EQ(finish(pid), 130) << err();
  const json r = report();
  EXPECT_TRUE(r["interrupted"].get<bool>());
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_TRUE(shm_empty()) << "nothing left behind after Ctrl-C";
}

TEST_F(RunTest, AnUnavailableBackendFailsAndLeavesNothing) {
  std::vector<std::string> args = kSmall;
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--backend") args[i + 1] = "hip";
  }
  const int code = run(args);
  if (code == 0) KVO_SKIP("gpu-present") << "this build has a HIP device";
  EXPECT_EQ(code, 1);
  EXPECT_THAT(err(), HasSubstr("hip"));
  EXPECT_TRUE(shm_empty());
}

struct UsageCase {
  std::vector<std::string> args;
  std::string mentions;
};

class RunUsageTest : public RunTest, public ::testing::WithParamInterface<UsageCase> {};

TEST_P(RunUsageTest, BadOptionsAreUsageErrorsNamingTheValue) {
  EXPECT_EQ(run(GetParam().args), 2);
  EXPECT_THAT(err(), HasSubstr(GetParam().mentions));
  EXPECT_TRUE(shm_empty());
}

INSTANTIATE_TEST_SUITE_P(
    Options, RunUsageTest,
    ::testing::Values(
        // Every numeric option: its range is checked as the command line is parsed, and the
        // message names the flag, the value and the allowed range.
        UsageCase{{"--world-size", "0"}, "--world-size: 0 is out of range; allowed 1 to 64"},
        UsageCase{{"--world-size", "65"}, "--world-size: 65 is out of range; allowed 1 to 64"},
        UsageCase{{"--layers", "x"}, "--layers: 'x' is not a whole number; allowed 1 to 1024"},
        UsageCase{{"--layers", "0"}, "--layers: 0 is out of range; allowed 1 to 1024"},
        UsageCase{{"--block-bytes", "0"},
                  "--block-bytes: 0 is out of range; allowed 1 to 64M bytes"},
        UsageCase{{"--block-bytes", "128M"},
                  "--block-bytes: 128M is out of range; allowed 1 to 64M bytes"},
        UsageCase{{"--blocks-per-chunk", "1025"},
                  "--blocks-per-chunk: 1025 is out of range; allowed 1 to 1024"},
        UsageCase{{"--gpu-blocks", "0"}, "--gpu-blocks: 0 is out of range; allowed 1 to 2^32"},
        UsageCase{{"--host-pool", "0"},
                  "--host-pool: 0 is out of range; allowed 1 to 2^64-1 bytes"},
        UsageCase{{"--duration", "-1"},
                  "--duration: -1 is out of range; allowed 0 to 86400 seconds"},
        UsageCase{{"--duration", "soon"},
                  "--duration: 'soon' is not a number; allowed 0 to 86400 seconds"},
        UsageCase{{"--requests", "-5"}, "--requests: -5 is out of range; allowed 0 to 2^64-1"},
        UsageCase{{"--requests", "18446744073709551616"},
                  "--requests: 18446744073709551616 is out of range; allowed 0 to 2^64-1"},
        UsageCase{{"--prefixes", "0"}, "--prefixes: 0 is out of range; allowed 1 to 2^20"},
        UsageCase{{"--prefix-chunks", "4097"},
                  "--prefix-chunks: 4097 is out of range; allowed 1 to 4096"},
        UsageCase{{"--unique-chunks", "-1"},
                  "--unique-chunks: -1 is out of range; allowed 0 to 4096"},
        UsageCase{{"--seed", "1.5"}, "--seed: '1.5' is not a whole number; allowed 0 to 2^64-1"},
        UsageCase{{"--file-tier-bytes", "0"},
                  "--file-tier-bytes: 0 is out of range; allowed 1 to 2^64-1 bytes"},
        UsageCase{{"--threads", "257"}, "--threads: 257 is out of range; allowed 1 to 256"},
        // What depends on several flags, and what is not a number.
        UsageCase{{"--host-pool", "1K"}, "--host-pool"},
        UsageCase{{"--backend", "tpu"}, "--backend 'tpu'"},
        UsageCase{{"--block-bytes", "12Q"}, "--block-bytes '12Q': unknown suffix 'Q'"},
        UsageCase{{"--gpu-blocks", "3"}, "--gpu-blocks 3"},
        UsageCase{{"--duration", "0"}, "--requests"}, UsageCase{{"--no-such-flag"}, "no-such-flag"},
        UsageCase{{"--bringup", "lazy"}, "--bringup 'lazy'"},
        UsageCase{{"--bringup-piece", "0"}, "--bringup-piece: 0 is out of range"},
        UsageCase{{"--remote-lookup-budget", "0"},
                  "--remote-lookup-budget: 0 is out of range; allowed 1 to 60000"}));

}  // namespace
