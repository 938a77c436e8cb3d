#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "skip.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::read_text;
using ::testing::HasSubstr;

class RunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "kvoffload_run_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    shm_ = dir_ / "shm";
    fs::create_directory(shm_);
  }
  void TearDown() override {
    children_.clear();  // kills what still runs
    fs::remove_all(dir_);
  }

  // Starts `kvoffload run <args> --shm-dir <shm>` in its own process group (as a terminal job
  // is) with stdout/stderr to files (out<tag>, err<tag>: several runs at once use different tags).
  ChildProcess& start(std::vector<std::string> args, const std::string& tag = "") {
    args.insert(args.begin(), {"run", "--shm-dir", shm_.string()});
    ChildSpec spec;
    spec.args = std::move(args);
    spec.out_file = dir_ / ("out" + tag);
    spec.err_file = dir_ / ("err" + tag);
    spec.own_process_group = true;
    return *children_.emplace_back(std::make_unique<ChildProcess>(spec));
  }

  static int finish(ChildProcess& child) { return child.wait(); }

  int run(std::vector<std::string> args) { return finish(start(std::move(args))); }
  std::string out(const std::string& tag = "") const { return read_text(dir_ / ("out" + tag)); }
  std::string err(const std::string& tag = "") const { return read_text(dir_ / ("err" + tag)); }
  json report(const std::string& tag = "") const { return json::parse(out(tag)); }
  bool shm_empty() const { return fs::is_empty(shm_); }

  fs::path dir_;
  fs::path shm_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
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
  // The error is the first thing on stderr (after the warning about this test's shm dir on a
  // disk filesystem, when it is on one): the other rank, told to stop, leaves quietly (it used
  // to warn about a broken pipe before the real error).
  std::string first = err();
  if (first.find("not in memory (tmpfs, hugetlbfs)") < first.find('\n')) {
    first.erase(0, first.find('\n') + 1);
  }
  EXPECT_EQ(first.rfind("kvoffload: rank ", 0), 0u) << err();
  EXPECT_THAT(err(), ::testing::Not(HasSubstr("EPIPE")));
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
  std::uint64_t populated = 0;
  double registration = 0;
  for (const auto& b : r["rank_bringup"]) {
    EXPECT_EQ(b["bringup"]["state"], "ready");
    EXPECT_EQ(b["bringup"]["ready_chunks"], 8);
    EXPECT_EQ(b["registration"]["pieces"], 8) << "one registration per 64 KiB row";
    EXPECT_EQ(b["registered_bytes"], 8 * 65536) << "every piece, as registered";
    EXPECT_EQ(b["registration"]["bytes"], b["registered_bytes"]);
    EXPECT_NE(b["populate"]["method"], "none");
    populated += b["populate"]["bytes"].get<std::uint64_t>();
    registration = std::max(registration, b["registration"]["seconds"].get<double>());
  }
  // The summary's populate and registration are the ranks' (the scheduler's mapping populates
  // nothing in background bring-up): it used to say "populate none, 0.00 s; registration 0.00 s".
  EXPECT_NE(r["populate"]["method"], "none");
  EXPECT_EQ(r["populate"]["bytes"].get<std::uint64_t>(), populated);
  EXPECT_GT(populated, 0U);
  EXPECT_EQ(r["registration_seconds"].get<double>(), registration);
  EXPECT_TRUE(shm_empty());

  // Blocking: each rank registers its pieces before it says "ready" (Note [Rank assembly]); the
  // 512 KiB pool is one piece (the first piece is 64 MiB).
  ASSERT_EQ(run(kSmall), 0) << err();
  const json b = report();
  EXPECT_EQ(b["bringup"], "blocking");
  EXPECT_TRUE(b["pool_ready_seconds"].is_number());
  for (const auto& rank : b["rank_bringup"]) {
    EXPECT_EQ(rank["registration"]["pieces"], 1);
    EXPECT_EQ(rank["registered_bytes"], 8 * 65536);
  }
  for (const auto& rank : b["ranks"]) EXPECT_TRUE(rank["host_registered"].get<bool>());
  // Note [Run phases]: the pool is ready before the first request, so every request is "ready".
  EXPECT_EQ(b["phases"]["coming_up"]["requests"], 0);
  EXPECT_EQ(b["phases"]["ready"]["requests"], b["requests"]);
  EXPECT_EQ(b["phases"]["ready"]["hits"], b["hits"]);
  EXPECT_EQ(b["paced_seconds"], 0.0);
}

// Note [Run phases]: in background bring-up the load generator waits until the rows ready on every
// rank can hold one request, so even `--requests 50` stores and loads (before, the 50
// requests went by before the first row was ready and could neither hit nor store). The report
// splits the requests served while the pool came up from those served once it was ready.
// As in the run, the pool (64 MiB here, 1024 rows) comes up as one piece (the default
// 1 GiB piece): no row is ready until a rank has populated its whole column, long after the
// scheduler could have sent its first request.
TEST_F(RunTest, BackgroundBringupPacesRequestsUntilThePoolServes) {
  std::vector<std::string> args = kSmall;
  *std::find(args.begin(), args.end(), "blocking") = "background";
  *std::find(args.begin(), args.end(), "120") = "50";
  *std::find(args.begin(), args.end(), "512K") = "64M";
  ASSERT_EQ(run(args), 0) << err();
  const json r = report();
  EXPECT_EQ(r["requests"], 50);
  EXPECT_EQ(r["cannot_store"], 0) << "every request found room: it waited for the pool";
  EXPECT_GT(r["hits"].get<std::uint64_t>(), 0u);
  EXPECT_GT(r["store_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(r["load_bytes"].get<std::uint64_t>(), 0u);
  // The rates are bytes over the jobs' copy time on the device (issue 25 (8): the run's engines
  // time their jobs; untimed, the rates would read 0 GB/s).
  EXPECT_GT(r["store_gbps"].get<double>(), 0.0);
  EXPECT_GT(r["load_gbps"].get<double>(), 0.0);
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_GE(r["paced_seconds"].get<double>(), 0.0);
  const json& coming_up = r["phases"]["coming_up"];
  const json& ready = r["phases"]["ready"];
  for (const char* field : {"requests", "chunks_looked_up", "hits", "cannot_store"}) {
    EXPECT_EQ(coming_up[field].get<std::uint64_t>() + ready[field].get<std::uint64_t>(),
              r[field].get<std::uint64_t>())
        << field;
  }
  EXPECT_TRUE(shm_empty());
}

// A run whose bring-up fails on every rank (here: the simulated GPU refuses to register the first
// piece of each rank, as a GPU that cannot pin host memory does) stops at once with one line and
// exit 1, instead of serving empty requests for the whole --duration and saying "every byte
// verified". (A run that did not stop would hit this test's 120 s limit.)
TEST_F(RunTest, BringupFailedOnEveryRankStopsEarlyWithAVerdict) {
  std::vector<std::string> args = kSmall;
  args[1] = "sim";
  *std::find(args.begin(), args.end(), "blocking") = "background";
  *std::find(args.begin(), args.end(), "120") = "0";                  // --requests 0
  *(std::find(args.begin(), args.end(), "--duration") + 1) = "3600";  // until stopped
  args.pop_back();  // --json: the text output first
  ::setenv("KVOFFLOAD_SIM_FAIL_REGISTER_AT", "1", 1);
  const int text_rc = run(args);
  const std::string text_out = out();
  const std::string text_err = err();
  args.push_back("--json");
  const int json_rc = run(args);
  ::unsetenv("KVOFFLOAD_SIM_FAIL_REGISTER_AT");

  EXPECT_EQ(text_rc, 1) << text_err;
  EXPECT_TRUE(text_out.empty()) << "the verdict alone, on stderr: " << text_out;
  const auto line_at = text_err.find("kvoffload: run: stopped after ");
  ASSERT_NE(line_at, std::string::npos) << text_err;
  const std::string verdict = text_err.substr(line_at, text_err.find('\n', line_at) - line_at);
  EXPECT_THAT(verdict, HasSubstr("bring-up failed on every rank before the pool could hold one "
                                 "request (5 chunks)"));
  EXPECT_THAT(verdict, HasSubstr("rank 0 after 0 ready chunks: "));
  EXPECT_THAT(verdict, HasSubstr("rank 1 after 0 ready chunks: "));
  EXPECT_THAT(text_err + text_out, ::testing::Not(HasSubstr("every byte verified")));

  EXPECT_EQ(json_rc, 1) << err();
  const json r = report();
  EXPECT_EQ(r["error"]["code"], "run_failed");
  EXPECT_THAT(r["error"]["message"].get<std::string>(), HasSubstr("bring-up failed on every rank"));
  EXPECT_EQ(r["requests"], 0);
  // The whole wait for room is pacing: counted, and within the run.
  EXPECT_GT(r["paced_seconds"].get<double>(), 0.0);
  EXPECT_LE(r["paced_seconds"].get<double>(), r["seconds"].get<double>());
  EXPECT_TRUE(r["pool_ready_seconds"].is_null());
  ASSERT_EQ(r["rank_bringup"].size(), 2u);
  for (const auto& b : r["rank_bringup"]) EXPECT_EQ(b["bringup"]["state"], "failed");
  EXPECT_TRUE(shm_empty());
}

// Note [Run phases]: the scheduler serves on the rows ready on every rank, and a pool that holds
// exactly one request (5 chunks) serves. Rank 1's simulated device refuses its 6th piece (one
// 64 KiB row each), so rank 1 has 5 rows and rank 0 all 8: the scheduler hands out 5 (never
// rank 0's 8), every request is served on them and every loaded byte verifies; the run then
// says the pool never became ready on every rank (exit 1). Each of rank 1's registrations takes
// 100 ms, so rank 0 is typically whole long before, and the first request finds fewer than 5 rows
// and waits for room, which comes at exactly 5 (the outcome is the same when it does not wait;
// rank 0's own end state depends on when the run stopped it, so it is not checked).
TEST_F(RunTest, ServesOnTheRowsReadyOnEveryRankAndAPoolOfOneRequestServes) {
  std::vector<std::string> args = kSmall;
  args[1] = "sim";
  *std::find(args.begin(), args.end(), "blocking") = "background";
  *std::find(args.begin(), args.end(), "120") = "12";
  *(std::find(args.begin(), args.end(), "--duration") + 1) = "60";  // ends a run that never serves
  args.insert(args.end(), {"--bringup-piece", "64K"});
  ::setenv("KVOFFLOAD_SIM_DEVICES", "2", 1);
  ::setenv("KVOFFLOAD_SIM_FAIL_REGISTER_AT", "6", 1);
  ::setenv("KVOFFLOAD_SIM_FAIL_REGISTER_DEVICE", "1", 1);
  ::setenv("KVOFFLOAD_SIM_REGISTER_DELAY_MS", "100", 1);
  const int rc = run(args);
  ::unsetenv("KVOFFLOAD_SIM_REGISTER_DELAY_MS");
  ::unsetenv("KVOFFLOAD_SIM_DEVICES");
  ::unsetenv("KVOFFLOAD_SIM_FAIL_REGISTER_AT");
  ::unsetenv("KVOFFLOAD_SIM_FAIL_REGISTER_DEVICE");
  EXPECT_EQ(rc, 1) << err();
  const json r = report();
  ASSERT_EQ(r["rank_bringup"].size(), 2u);
  EXPECT_EQ(r["rank_bringup"][1]["bringup"]["state"], "failed");
  EXPECT_EQ(r["rank_bringup"][1]["bringup"]["ready_chunks"], 5);
  EXPECT_EQ(r["ready_chunks"], 5) << "the rows ready on every rank, not on rank 0";
  EXPECT_EQ(r["requests"], 12) << "5 rows hold one request of 5 chunks";
  EXPECT_EQ(r["failed_jobs"], 0);
  EXPECT_EQ(r["mismatched_bytes"], 0);
  EXPECT_EQ(r["verified_bytes"], r["load_bytes"]);
  EXPECT_GT(r["load_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(r["pool_ready_seconds"].is_null());
  EXPECT_THAT(r["error"]["message"].get<std::string>(),
              HasSubstr("the pool never became ready on every rank"));
  EXPECT_TRUE(shm_empty());
}

// A run that fails on a system call reports it in its JSON error object: the errno's name and
// the call, beside the code and the message. (The file tier's lock file is a symbolic link: its
// O_NOFOLLOW open fails with ELOOP.) Nothing is left in the shm dir.
TEST_F(RunTest, ASystemErrorNamesItsErrnoAndCallInTheJson) {
  std::vector<std::string> args = kSmall;
  fs::create_directory(dir_ / "tier");
  fs::create_symlink(dir_ / "nowhere", dir_ / "tier" / ".kvoffload-tier.lock");
  args.insert(args.end(), {"--file-tier", (dir_ / "tier").string()});
  EXPECT_EQ(run(args), 1) << err();
  const json r = report();
  EXPECT_EQ(r["error"]["code"], "system") << r.dump();
  EXPECT_EQ(r["error"]["errno"], "ELOOP") << r.dump();
  EXPECT_EQ(r["error"]["call"], "open") << r.dump();
  EXPECT_EQ(r["error"]["exit_code"], 1) << r.dump();
  EXPECT_THAT(r["error"]["message"].get<std::string>(),
              HasSubstr((dir_ / "tier" / ".kvoffload-tier.lock").string()));
  EXPECT_TRUE(shm_empty());
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

// --wait-for-tiers: the tier's writes finish (and release their offload pins) before the next
// request, so what is evicted, and so what comes back, does not depend on the machine's speed
// (without it a loaded machine could keep every chunk pinned and promote nothing). Two runs of
// one seed, each with an empty tier, make the same decisions to the chunk.
TEST_F(RunTest, EvictedChunksComeBackFromTheFileTier) {
  json first;
  for (const char* tier : {"tier1", "tier2"}) {
    std::vector<std::string> args = kSmall;
    args.insert(args.end(), {"--file-tier", (dir_ / tier).string(), "--wait-for-tiers"});
    fs::create_directory(dir_ / tier);
    ASSERT_EQ(run(args), 0) << err();
    const json r = report();
    EXPECT_TRUE(r["all_verified"].get<bool>());
    EXPECT_TRUE(r["wait_for_tiers"].get<bool>());
    EXPECT_GT(r["tier_offloads"].get<std::uint64_t>(), 0u);
    EXPECT_GT(r["promoted"].get<std::uint64_t>(), 0u) << "evicted prefixes are requested again";
    EXPECT_EQ(r["promoted_from"]["file"], r["promoted"]) << "the run's only tier";
    EXPECT_TRUE(shm_empty());
    if (first.is_null()) {
      first = r;
      continue;
    }
    for (const char* field : {"hits", "misses", "evictions", "cannot_store", "promoted",
                              "tier_offloads", "store_bytes", "load_bytes"}) {
      EXPECT_EQ(r[field], first[field]) << field << ": the same seed, the same decisions";
    }
  }
}

TEST_F(RunTest, HumanOutputWithoutJson) {
  std::vector<std::string> args = kSmall;
  args.pop_back();  // --json
  args.insert(args.end(), {"--wait-for-tiers", "--file-tier", (dir_ / "tier").string()});
  fs::create_directory(dir_ / "tier");
  ASSERT_EQ(run(args), 0) << err();
  const std::string text = out();
  EXPECT_THAT(text, HasSubstr("every byte verified"));
  EXPECT_THAT(err(), HasSubstr("run:")) << "plain progress lines when stderr is not a terminal";
  // What the run measured, in human units: 8 chunks of 2 x 4 KiB x 4 layers = 32 KiB per rank.
  EXPECT_THAT(text, HasSubstr("8 chunks of 32.00 KiB per rank (512.00 KiB pool)"));
  EXPECT_THAT(text, ::testing::ContainsRegex("requests could not store"));
  EXPECT_THAT(text, ::testing::ContainsRegex("stored +[0-9.]+ (KiB|MiB) at"));
  EXPECT_THAT(text, ::testing::ContainsRegex("pool ready on every rank after [0-9.]+ s"));
  EXPECT_THAT(text, ::testing::ContainsRegex("promoted +[1-9][0-9]* from the file tier"));
  EXPECT_THAT(text, ::testing::Not(::testing::ContainsRegex("[0-9]{6,} bytes")));

  // One request can hit nothing (and the file tier, which keeps its records across runs, is left
  // out), so nothing comes back: the summary does not claim a verification.
  args.resize(args.size() - 2);  // --file-tier DIR
  *std::find(args.begin(), args.end(), "120") = "1";
  ASSERT_EQ(run(args), 0) << err();
  EXPECT_THAT(out(), HasSubstr("nothing was loaded back, so nothing was verified"));
  EXPECT_THAT(out(), ::testing::Not(HasSubstr("every byte verified")));
}

TEST_F(RunTest, InterruptStopsCleanlyAndRemovesTheRegion) {
  ChildProcess& job = start({"--backend", "host", "--duration", "60", "--json"});
  // Wait until the ranks are working (the region exists and progress is printed).
  for (int i = 0; i < 200 && err().find("run:") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(shm_empty());
  job.signal_group(SIGINT);  // Ctrl-C reaches the whole process group
  EXPECT_EQ(finish(job), 130) << err();
  const json r = report();
  EXPECT_TRUE(r["interrupted"].get<bool>());
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_TRUE(shm_empty()) << "nothing left behind after Ctrl-C";
}

// A second `run --engine-id X` while one runs would hand out the first one's slots: it is refused
// at start (exit 1, naming the scheduler role, the engine id and the first run's PID) and the first
// run goes on undisturbed: every loaded byte verifies and it removes the region when it ends.
TEST_F(RunTest, ASecondRunWithTheSameEngineIdIsRefusedAndTheFirstIsUndisturbed) {
  ChildProcess& first =
      start({"--backend", "host", "--duration", "60", "--engine-id", "twin", "--json"}, "1");
  for (int i = 0; i < 200 && err("1").find("run:") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_THAT(err("1"), HasSubstr("run:")) << "the first run is serving";

  // The same geometry (a different one would be refused as a mismatch before the role counts).
  EXPECT_EQ(finish(start({"--backend", "host", "--requests", "20", "--duration", "0", "--engine-id",
                          "twin", "--json"},
                         "2")),
            1)
      << err("2");
  EXPECT_THAT(err("2"), HasSubstr("the scheduler role of engine 'twin' is held by PID " +
                                  std::to_string(first.pid()) + "."));
  EXPECT_THAT(err("2"), HasSubstr("its own engine id"));
  EXPECT_THAT(err("2"), ::testing::Not(HasSubstr("run:"))) << "refused before any rank started";
  EXPECT_FALSE(shm_empty()) << "the first run's region is still there";

  first.signal_group(SIGINT);
  EXPECT_EQ(finish(first), 130) << err("1");
  const json r = report("1");
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_EQ(r["mismatched_bytes"], 0);
  EXPECT_EQ(r["failed_jobs"], 0);
  EXPECT_TRUE(r["region_removed"].get<bool>());
  EXPECT_TRUE(shm_empty());
}

// The rank processes of run `job`, in the order they were spawned (rank 0 first).
std::vector<pid_t> rank_pids(pid_t job) {
  std::vector<pid_t> pids;
  std::ifstream in("/proc/" + std::to_string(job) + "/task/" + std::to_string(job) + "/children");
  for (pid_t p = 0; in >> p;) pids.push_back(p);
  return pids;
}

// Note [Run stopped early]: SIGKILL of a real rank mid-run. The run fails quickly, names the rank,
// its PID and the signal from the wait status, and still reports what it measured: the text
// summary, and the --json report with an `error` member.
TEST_F(RunTest, AKilledRankIsNamedWithPidAndSignalAndTheRunStillReports) {
  for (const bool as_json : {false, true}) {
    SCOPED_TRACE(as_json ? "--json" : "text");
    const std::string tag = as_json ? "j" : "t";
    std::vector<std::string> args = {"--backend", "host", "--duration", "60", "--world-size", "2"};
    if (as_json) args.push_back("--json");
    ChildProcess& job = start(args, tag);
    for (int i = 0; i < 400 && err(tag).find("run:") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_THAT(err(tag), HasSubstr("run:")) << "the run is serving";
    const std::vector<pid_t> pids = rank_pids(job.pid());
    ASSERT_EQ(pids.size(), 2U);
    ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
    EXPECT_EQ(finish(job), 1) << err(tag);
    const std::string named =
        "rank 1 (PID " + std::to_string(pids[1]) + ") was killed by signal 9 (SIGKILL)";
    EXPECT_THAT(err(tag), HasSubstr(named));
    if (as_json) {
      const json r = report(tag);
      ASSERT_TRUE(r.contains("error")) << r.dump();
      EXPECT_THAT(r["error"]["message"].get<std::string>(), HasSubstr(named));
      EXPECT_GT(r["requests"].get<std::uint64_t>(), 0U) << "what was measured is reported";
      EXPECT_EQ(r["mismatched_bytes"], 0);
      EXPECT_TRUE(r["region_removed"].get<bool>());
    } else {
      EXPECT_THAT(out(tag), HasSubstr("kvoffload run: engine "));
      EXPECT_THAT(out(tag), HasSubstr("  requests        "));
    }
    EXPECT_TRUE(shm_empty()) << "the region is removed after a lost rank too";
  }
}

// One rule for junk (Note [What is ours to remove]): `region clean` and `run` judge the same
// entries alike. An 8-byte file nothing holds and a bad-magic file are both "not a region":
// clean skips them (never "kept (in use)") and run refuses with the same reason instead of
// deleting one as stale; an intact stale region is removed by clean and reclaimed by run.
TEST_F(RunTest, RunAndRegionCleanAgreeOnWhatIsJunk) {
  const auto put = [&](const std::string& id, const std::string& bytes, fs::perms mode) {
    fs::path p = shm_ / ("kvoffload_" + id + ".region");
    { std::ofstream(p, std::ios::binary) << bytes; }
    fs::permissions(p, mode);
    return p;
  };
  const fs::path eight = put("eight", "12345678",
                             fs::perms::owner_read | fs::perms::owner_write |
                                 fs::perms::group_read | fs::perms::others_read);
  const fs::path magic =
      put("magic", std::string(65536, 'x'), fs::perms::owner_read | fs::perms::owner_write);

  ChildSpec clean;
  clean.args = {"region", "clean", "--shm-dir", shm_.string(), "--json"};
  clean.out_file = dir_ / "clean_out";
  clean.err_file = dir_ / "clean_err";
  ASSERT_EQ(ChildProcess(clean).wait(), 0) << read_text(dir_ / "clean_err");
  const json c = json::parse(read_text(dir_ / "clean_out"));
  EXPECT_EQ(c["removed"], json::array());
  EXPECT_EQ(c["kept"], json::array()) << "kept means in use; nothing holds these";
  ASSERT_EQ(c["skipped"].size(), 2U) << c.dump();
  EXPECT_EQ(c["skipped"][0]["path"], eight.string());
  EXPECT_THAT(c["skipped"][0]["reason"].get<std::string>(), HasSubstr("has mode 0644"));
  EXPECT_EQ(c["skipped"][1]["path"], magic.string());
  EXPECT_THAT(c["skipped"][1]["reason"].get<std::string>(), HasSubstr("bad magic"));

  std::vector<std::string> args = kSmall;
  args.insert(args.end(), {"--engine-id", "magic"});
  EXPECT_EQ(run(args), 1) << err();
  EXPECT_THAT(err(), HasSubstr(magic.string() + " is in the way and was left alone"));
  EXPECT_THAT(err(), HasSubstr("bad magic"));
  EXPECT_EQ(fs::file_size(magic), 65536U) << "run must not delete what clean skips";
  args.back() = "eight";
  EXPECT_EQ(run(args), 1) << err();
  EXPECT_THAT(err(), HasSubstr("has mode 0644"));
  EXPECT_EQ(fs::file_size(eight), 8U);
  fs::remove(eight);
  fs::remove(magic);
  EXPECT_TRUE(shm_empty());
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
