// `kvoffload run --pool NAME` (Note [Run on a node pool] in cli/run/pool_run.cpp), driven as a
// user runs it: several real `kvoffload run` processes, each with its own ranks, on one node pool
// in a per-test shm dir. A later run hits what an earlier one stored (cross_engine_hits) and every
// byte it loads is verified by run's own check; refusals name the flags; a run killed by SIGKILL
// leaves the others serving; the pool file goes with its last tenant.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::read_text;
using ::testing::HasSubstr;

class RunPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "kvoffload_run_pool_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    shm_ = dir_ / "shm";
    fs::create_directory(shm_);
  }
  void TearDown() override {
    children_.clear();  // kills what still runs
    fs::remove_all(dir_);
  }

  // `kvoffload run --pool P --engine-id <id> <small geometry> <extra>`, stdout/stderr in files
  // named after the engine id.
  ChildProcess& start(const std::string& id, std::vector<std::string> extra,
                      std::map<std::string, std::string> env = {}) {
    std::vector<std::string> args = {"run",
                                     "--shm-dir",
                                     shm_.string(),
                                     "--pool",
                                     "P",
                                     "--engine-id",
                                     id,
                                     "--backend",
                                     "host",
                                     "--world-size",
                                     "2",
                                     "--layers",
                                     "4",
                                     "--block-bytes",
                                     "4K",
                                     "--blocks-per-chunk",
                                     "2",
                                     "--gpu-blocks",
                                     "64",
                                     "--host-pool",
                                     "4M",
                                     "--prefixes",
                                     "6",
                                     "--prefix-chunks",
                                     "4",
                                     "--unique-chunks",
                                     "1",
                                     "--duration",
                                     "0",
                                     "--seed",
                                     "7",
                                     "--json"};
    // A flag in `extra` that is among the defaults replaces its value there.
    for (std::size_t i = 0; i + 1 < extra.size(); i += 2) {
      auto it = std::find(args.begin(), args.end(), extra[i]);
      if (it != args.end() && it + 1 != args.end()) {
        *(it + 1) = extra[i + 1];
      } else {
        args.push_back(extra[i]);
        args.push_back(extra[i + 1]);
      }
    }
    ChildSpec spec;
    spec.args = std::move(args);
    spec.out_file = dir_ / ("out-" + id);
    spec.err_file = dir_ / ("err-" + id);
    spec.own_process_group = true;
    spec.env = std::move(env);
    return *children_.emplace_back(std::make_unique<ChildProcess>(spec));
  }

  // Waits until the run says it served its requests and stays on the pool (--pool-linger).
  void wait_lingering(ChildProcess& child, const std::string& id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (read_text(dir_ / ("err-" + id)).find("staying on pool P") == std::string::npos) {
      ASSERT_FALSE(child.poll().has_value())
          << id << " ended before it lingered: " << read_text(dir_ / ("err-" + id));
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << id << " never lingered";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  json report(const std::string& id) const { return json::parse(read_text(dir_ / ("out-" + id))); }
  std::string err(const std::string& id) const { return read_text(dir_ / ("err-" + id)); }
  fs::path pool_file() const { return shm_ / "kvoffload_P.pool"; }

  // Every loaded byte verified by the run's own check (kv_pattern), something loaded.
  static void expect_verified(const json& r) {
    EXPECT_TRUE(r["all_verified"].get<bool>()) << r.dump();
    EXPECT_GT(r["load_bytes"].get<std::uint64_t>(), 0U) << r.dump();
    EXPECT_EQ(r["verified_bytes"], r["load_bytes"]);
    EXPECT_EQ(r["mismatched_bytes"], 0);
    EXPECT_EQ(r["failed_jobs"], 0);
  }

  fs::path dir_;
  fs::path shm_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

TEST_F(RunPoolTest, ASecondRunHitsWhatTheFirstStoredAndVerifiesEveryByte) {
  ChildProcess& a = start("a", {"--requests", "120", "--pool-linger", "90"});
  wait_lingering(a, "a");
  ASSERT_TRUE(fs::exists(pool_file()));
  ChildProcess& b = start("b", {"--requests", "120"});
  ASSERT_EQ(b.wait(), 0) << err("b");
  ASSERT_EQ(a.wait(), 0) << err("a");  // b came and went: a leaves
  const json rb = report("b");
  const json ra = report("a");
  expect_verified(rb);
  expect_verified(ra);
  EXPECT_GT(rb["cross_engine_hits"].get<std::uint64_t>(), 0U) << rb.dump();
  EXPECT_EQ(ra["cross_engine_hits"], 0);  // nobody stored before a
  EXPECT_EQ(rb["tenants"], 2);
  EXPECT_EQ(rb["pool"]["name"], "P");
  EXPECT_EQ(rb["pool"]["policy"], "lru");
  EXPECT_FALSE(rb["region_removed"].get<bool>());  // a was still attached
  EXPECT_TRUE(ra["region_removed"].get<bool>());   // a was the last tenant out
  EXPECT_FALSE(fs::exists(pool_file()));
  EXPECT_TRUE(fs::is_empty(shm_));
}

TEST_F(RunPoolTest, ThreeRunsShareOnePoolUnderArc) {
  ChildProcess& a = start("a", {"--requests", "80", "--pool-linger", "90", "--pool-policy", "arc"});
  wait_lingering(a, "a");
  ChildProcess& b = start("b", {"--requests", "80", "--pool-linger", "90", "--pool-policy", "arc",
                                "--pool-cap", "0.5"});
  wait_lingering(b, "b");
  ChildProcess& c = start("c", {"--requests", "80", "--pool-policy", "arc"});
  ASSERT_EQ(c.wait(), 0) << err("c");
  ASSERT_EQ(b.wait(), 0) << err("b");
  ASSERT_EQ(a.wait(), 0) << err("a");
  for (const char* id : {"a", "b", "c"}) expect_verified(report(id));
  EXPECT_GT(report("b")["cross_engine_hits"].get<std::uint64_t>(), 0U)
      << report("b").dump() << err("b");
  EXPECT_GT(report("c")["cross_engine_hits"].get<std::uint64_t>(), 0U);
  EXPECT_EQ(report("c")["tenants"], 3);
  EXPECT_EQ(report("c")["pool"]["policy"], "arc");
  EXPECT_GT(report("b")["pool"]["cap_slots"].get<std::uint64_t>(), 0U);
  EXPECT_FALSE(fs::exists(pool_file()));
}

TEST_F(RunPoolTest, AnotherGeometryIsRefusedNamingBothValues) {
  ChildProcess& a = start("a", {"--requests", "10", "--pool-linger", "90"});
  wait_lingering(a, "a");
  // --layers 8: slots twice as large.
  ChildProcess& b = start("b", {"--requests", "10", "--layers", "8"});
  EXPECT_NE(b.wait(), 0);
  EXPECT_THAT(err("b"), HasSubstr("--pool P"));
  EXPECT_THAT(err("b"), HasSubstr("slot_bytes is 32768 in the pool, 65536 for engine 'b'"));
  EXPECT_THAT(err("b"), HasSubstr("--layers"));
  // Another eviction policy, the same way.
  ChildProcess& c = start("c", {"--requests", "10", "--pool-policy", "arc"});
  EXPECT_NE(c.wait(), 0);
  EXPECT_THAT(err("c"), HasSubstr("policy is 'lru' in the pool, 'arc' for engine 'c'"));
  EXPECT_THAT(err("c"), HasSubstr("--pool-policy"));
  // A twin engine id is refused naming the flag and the live tenant's PID.
  ChildProcess& twin = start("a", {"--requests", "10"});
  EXPECT_NE(twin.wait(), 0);
  a.signal(SIGTERM);
  (void)a.wait();
  EXPECT_THAT(err("a"), HasSubstr("--engine-id a on --pool P"));
  EXPECT_THAT(err("a"), HasSubstr("already a tenant (PID"));
}

TEST_F(RunPoolTest, FlagsThatCannotGoWithAPoolAreRefusedNamingBoth) {
  ChildProcess& f = start("f", {"--requests", "10", "--file-tier", (dir_ / "ft").string()});
  EXPECT_NE(f.wait(), 0);
  EXPECT_THAT(err("f"), HasSubstr("--pool P and --file-tier"));
  ChildProcess& g = start("g", {"--requests", "10", "--bringup", "background"});
  EXPECT_NE(g.wait(), 0);
  EXPECT_THAT(err("g"), HasSubstr("--pool P and --bringup background"));
  EXPECT_FALSE(fs::exists(pool_file()));
}

TEST_F(RunPoolTest, ARunKilledBySigkillLeavesTheOtherServingAndThePoolGoesWithIt) {
  ChildProcess& a = start("a", {"--requests", "60", "--pool-linger", "90"});
  wait_lingering(a, "a");
  ChildProcess& b = start("b", {"--requests", "400"});
  // a says when b joined (b attached, so it holds the pool too); then a (scheduler and ranks:
  // its process group) is killed while b serves.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (err("a").find("engine b (PID") == std::string::npos) {
    ASSERT_FALSE(b.poll().has_value()) << err("b");
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "a never saw b: " << err("a");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LT(a.kill(), 0);  // killed by a signal
  ASSERT_EQ(b.wait(), 0) << err("b");
  const json rb = report("b");
  expect_verified(rb);
  EXPECT_TRUE(rb["region_removed"].get<bool>()) << rb.dump();
  EXPECT_FALSE(fs::exists(pool_file()));
}

// Note [Pool layout]: the pool is rank-major, so each rank of a run maps and registers only its
// own range, 1/W of the chunk bytes, as the simulated device saw it (each process's
// registrations, KVOFFLOAD_SIM_REGISTER_LOG) and as the report says (rank_bringup's
// registered_bytes). The geometry: 32 KiB slots (4 layers x 4 KiB x 2 blocks), --host-pool 4M
// holds 128 / W chunks, so the chunk bytes are 4 MiB and each rank's range 4 MiB / W.
TEST_F(RunPoolTest, EachRankRegistersOnlyItsOwnRangeOnTheSimulatedDevice) {
  constexpr std::uint64_t kChunkArea = 4ULL << 20;
  for (const std::uint32_t world : {2U, 4U, 8U}) {
    SCOPED_TRACE("world size " + std::to_string(world));
    const std::string id = "w" + std::to_string(world);
    const fs::path log = dir_ / ("registrations-" + id);
    ChildProcess& run =
        start(id, {"--backend", "sim", "--world-size", std::to_string(world), "--requests", "30"},
              {{"KVOFFLOAD_SIM_DEVICES", std::to_string(world)},
               {"KVOFFLOAD_SIM_REGISTER_LOG", log.string()}});
    ASSERT_EQ(run.wait(), 0) << err(id);
    const json r = report(id);
    expect_verified(r);
    const std::uint64_t share = kChunkArea / world;
    EXPECT_EQ(r["pool"]["chunk_area_bytes"], kChunkArea);
    EXPECT_EQ(r["pool"]["rank_range_bytes"], share);
    ASSERT_EQ(r["rank_bringup"].size(), world) << r.dump();
    for (const json& b : r["rank_bringup"]) {
      EXPECT_EQ(b["registered_bytes"], share) << "rank " << b["rank"];
      EXPECT_EQ(b["registration"]["bytes"], share);
    }
    EXPECT_EQ(r["registered_bytes"], kChunkArea) << "W ranks of 1/W each";
    // What each device registered, per process: one rank per device, 1/W of the chunk bytes.
    std::map<int, std::map<long, std::uint64_t>> by_device;
    std::ifstream lines(log);
    std::string word;
    long pid = 0;
    int device = 0;
    std::uint64_t bytes = 0;
    while (lines >> word >> pid >> word >> device >> word >> bytes) by_device[device][pid] += bytes;
    ASSERT_EQ(by_device.size(), world) << read_text(log);
    for (const auto& [d, pids] : by_device) {
      ASSERT_EQ(pids.size(), 1U) << "device " << d << ":\n" << read_text(log);
      EXPECT_EQ(pids.begin()->second, share) << "device " << d << ":\n" << read_text(log);
    }
    EXPECT_FALSE(fs::exists(pool_file()));
  }
}

}  // namespace
