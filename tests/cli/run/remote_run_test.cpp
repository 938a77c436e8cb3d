// `kvoffload run --remote-tier URL` and `kvoffload remote check URL`, driven as a user runs them,
// against redis-server / memcached / a Redis Cluster that the tests start on loopback ports.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "remote_servers.hpp"
#include "skip.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::read_text;
using kvoffload::test::RedisCluster;
using kvoffload::test::ServerProcess;
using ::testing::HasSubstr;

class RemoteRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "kvoffload_remote_run_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    shm_ = dir_ / "shm";
    fs::create_directory(shm_);
  }
  void TearDown() override {
    children_.clear();  // kills what still runs
    fs::remove_all(dir_);
  }

  // `kvoffload <args>` in its own process group (as a terminal job: Ctrl-C reaches its ranks too)
  // with stdout/stderr to files.
  ChildProcess& start(std::vector<std::string> args) {
    ChildSpec spec;
    spec.args = std::move(args);
    spec.out_file = dir_ / "out";
    spec.err_file = dir_ / "err";
    spec.own_process_group = true;
    return *children_.emplace_back(std::make_unique<ChildProcess>(spec));
  }
  static int finish(ChildProcess& child) { return child.wait(); }
  int exec(std::vector<std::string> args) { return finish(start(std::move(args))); }

  // Waits for what the running program did itself (its effect on the store, a line it logged),
  // however long a loaded machine takes; false when the program exited first or after 120 s (a
  // hang, not a slow machine).
  static bool wait_for(ChildProcess& child, const std::function<bool()>& happened) {
    const auto hang = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < hang) {
      if (happened()) return true;
      if (child.poll()) return happened();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Ctrl-C, then the exit code (130 when the run stopped for it).
  static int interrupt(ChildProcess& child) {
    if (child.ended()) return *child.poll();
    child.signal_group(SIGINT);
    return finish(child);
  }

  // `kvoffload run` on a small pool (evictions, so chunks come back from the remote tier).
  std::vector<std::string> run_args(const std::string& url, const std::string& engine,
                                    std::vector<std::string> more = {"--requests", "120",
                                                                     "--duration", "0"}) {
    std::vector<std::string> a = {
        "run",         "--shm-dir",
        shm_.string(), "--engine-id",
        engine,        "--backend",
        "host",        "--world-size",
        "2",           "--layers",
        "4",           "--block-bytes",
        "4K",          "--blocks-per-chunk",
        "2",           "--gpu-blocks",
        "64",          "--host-pool",
        "512K",        "--prefixes",
        "6",           "--prefix-chunks",
        "4",           "--unique-chunks",
        "1",           "--remote-tier",
        url,           "--json",
        "--bringup",   "blocking"};  // blocking: two runs of one seed make the same decisions
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }

  std::string out() const { return read_text(dir_ / "out"); }
  std::string err() const { return read_text(dir_ / "err"); }
  json report() const { return json::parse(out()); }

  fs::path dir_;
  fs::path shm_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

TEST_F(RemoteRunTest, TwoEnginesShareChunksThroughOneRedis) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  // A lookup budget no loaded CI machine runs out of, so every existence answer is the store's
  // (with 50 ms a late answer is a miss, and the counts below would depend on the machine).
  const std::vector<std::string> patient = {
      "--requests", "120", "--duration", "0", "--remote-lookup-budget", "10000"};
  ASSERT_EQ(exec(run_args(redis.url(), "engine-a", patient)), 0) << err();
  const json a = report();
  EXPECT_TRUE(a["all_verified"].get<bool>());
  const json& ra = a["remote"];
  EXPECT_GT(ra["stored"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(ra["corrupt"], 0);
  EXPECT_EQ(ra["errors"], 0);
  // Every stored chunk is one value per rank in the store.
  EXPECT_EQ(redis.cli({"DBSIZE"}), std::to_string(ra["stored"].get<std::uint64_t>() * 2));

  // A second engine (another region) finds what the first stored and loads it back verified.
  ASSERT_EQ(exec(run_args(redis.url(), "engine-b", patient)), 0) << err();
  const json b = report();
  EXPECT_TRUE(b["all_verified"].get<bool>());
  const json& rb = b["remote"];
  EXPECT_GT(rb["promoted"].get<std::uint64_t>(), 0u);
  EXPECT_GT(rb["lookup_present"].get<std::uint64_t>(), 0u) << "chunks engine-a stored";
  // The same workload asks the store once about every chunk, so it finds each one engine-a put
  // there, and stores only what it did not find. Engine-a may not have stored a chunk or two (a
  // request finds no room while earlier write-through puts still pin their slots: its
  // cannot_store), so "stored" is 0 only when engine-a stored everything.
  EXPECT_EQ(rb["lookup_present"], ra["stored"]);
  const std::uint64_t absent =
      rb["lookups"].get<std::uint64_t>() - rb["lookup_present"].get<std::uint64_t>();
  EXPECT_LE(rb["stored"].get<std::uint64_t>(), absent)
      << "engine-b stored again a chunk that was in the store already";
  if (a["cannot_store"] == 0) {
    EXPECT_EQ(rb["stored"], 0) << "engine-a stored every chunk";
  }
  EXPECT_EQ(rb["errors"], 0);
  EXPECT_EQ(b["promoted"], rb["promoted"]);
  EXPECT_EQ(b["promoted_from"]["remote"], rb["promoted"]);
  for (const char* field : {"promoted", "stored", "misses", "corrupt", "errors", "lookup_timeouts",
                            "lookup_errors", "get_errors", "put_errors", "breaker_opens"}) {
    EXPECT_TRUE(rb.contains(field)) << field;
  }
  EXPECT_TRUE(fs::is_empty(shm_));

  // The text summary says where promotions came from: the remote tier (there is no file tier).
  std::vector<std::string> text = run_args(redis.url(), "engine-c", patient);
  text.erase(std::find(text.begin(), text.end(), "--json"));
  ASSERT_EQ(exec(text), 0) << err();
  EXPECT_THAT(out(), ::testing::ContainsRegex("promoted +[1-9][0-9]* from the remote tier"));
  EXPECT_THAT(out(), ::testing::Not(HasSubstr("file tier")));
}

// A lookup answered after its budget is a miss (lookup_timeouts), not an error: the check keeps
// its connection and the node's circuit stays closed. Redis is paused for 300 ms mid-run
// (CLIENT PAUSE): the lookups of those 300 ms are late for the 50 ms budget, and every command
// is still answered well within the 1 s network deadline. The pool holds the whole workload, so
// nothing is evicted and promoted back: the scheduler never waits on a get, and every request's
// new chunk is looked up during the pause.
TEST_F(RemoteRunTest, LateLookupsAreMissesNotErrors) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  std::vector<std::string> args =
      run_args(redis.url(), "engine-l", {"--requests", "0", "--duration", "6"});
  *(std::find(args.begin(), args.end(), "--host-pool") + 1) = "64M";
  ChildProcess& job = start(args);
  // The run is serving once it has written through to the store.
  for (int i = 0; i < 6000 && redis.cli({"DBSIZE"}) == "0"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(redis.cli({"DBSIZE"}), "0") << "the run stored nothing; stderr: " << err();
  EXPECT_EQ(redis.cli({"CLIENT", "PAUSE", "300", "ALL"}), "OK");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ASSERT_FALSE(job.poll()) << "the run ended before the pause did";
  ASSERT_EQ(finish(job), 0) << err();
  const json r = report();
  EXPECT_TRUE(r["all_verified"].get<bool>());
  const json& m = r["remote"];
  EXPECT_GT(m["lookup_timeouts"].get<std::uint64_t>(), 0u) << m.dump();
  EXPECT_EQ(m["lookup_errors"], 0) << m.dump();
  EXPECT_EQ(m["errors"], 0) << m.dump();
  EXPECT_EQ(m["breaker_opens"], 0) << m.dump();
  EXPECT_GE(m["misses"].get<std::uint64_t>(), m["lookup_timeouts"].get<std::uint64_t>());
  EXPECT_TRUE(fs::is_empty(shm_));
}

// `--memcached-item-size` is the flag the item-size error asks for: a 2 MiB slot does not fit
// memcached's default 1 MiB item, and fits the 4 MiB (-I 4m) of the server started here.
TEST_F(RemoteRunTest, MemcachedItemSizeIsAFlag) {
  SKIP_WITHOUT("memcached");
  ServerProcess mc(ServerProcess::Kind::kMemcached);  // -I 4m
  auto args = [&](const std::string& url, std::vector<std::string> more) {
    std::vector<std::string> a = {"run",         "--shm-dir",
                                  shm_.string(), "--engine-id",
                                  "engine-i",    "--backend",
                                  "host",        "--world-size",
                                  "2",           "--layers",
                                  "1",           "--block-bytes",
                                  "1M",          "--blocks-per-chunk",
                                  "2",           "--gpu-blocks",
                                  "20",          "--host-pool",
                                  "24M",         "--prefixes",
                                  "4",           "--prefix-chunks",
                                  "4",           "--unique-chunks",
                                  "1",           "--requests",
                                  "30",          "--duration",
                                  "0",           "--remote-tier",
                                  url,           "--bringup",
                                  "blocking",    "--json"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  EXPECT_EQ(exec(args(mc.url(), {})), 2);
  EXPECT_THAT(err(), HasSubstr("larger than memcached's item size 1.00 MiB"));
  EXPECT_THAT(err(), HasSubstr("start memcached with -I 3m or more and pass "
                               "--memcached-item-size 3M"));
  EXPECT_TRUE(fs::is_empty(shm_)) << "refused before anything was created";

  ASSERT_EQ(exec(args(mc.url(), {"--memcached-item-size", "4M"})), 0) << err();
  const json r = report();
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_GT(r["remote"]["stored"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(r["remote"]["put_errors"], 0);

  // The flag means nothing to another store: refused, naming the store.
  EXPECT_EQ(exec(args("redis://127.0.0.1:1", {"--memcached-item-size", "4M"})), 2);
  EXPECT_THAT(err(), HasSubstr("--memcached-item-size 4M applies to a memcached:// --remote-tier "
                               "only; this run's is redis://127.0.0.1:1"));
  EXPECT_TRUE(fs::is_empty(shm_));
}

TEST_F(RemoteRunTest, UnreachableServerAtStartWarnsAndTheRunSucceeds) {
  const int port = kvoffload::test::free_port();
  ASSERT_EQ(exec(run_args("redis://127.0.0.1:" + std::to_string(port), "engine-u")), 0) << err();
  EXPECT_THAT(err(), HasSubstr("unreachable at start"));
  const json r = report();
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_EQ(r["remote"]["promoted"], 0);
  EXPECT_EQ(r["remote"]["stored"], 0);
  EXPECT_GT(r["remote"]["errors"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(r["remote"]["nodes_open"], 1);
}

// The server's own count of reads that found a key (GET or EXISTS). The run's chunks reach the
// remote tier only after their write-through put finished (the put pins the slot until then), so
// a hit means the engine already counted a stored chunk: its progress, seen from the store.
std::uint64_t keyspace_hits(const ServerProcess& redis) {
  const std::string info = redis.cli({"INFO", "stats"});
  const auto at = info.find("keyspace_hits:");
  return at == std::string::npos ? 0 : std::stoull(info.substr(at + 14));
}

// A run is driven by what it does, not by the clock: it runs until Ctrl-C (a 600 s duration is
// only a safety net), the server is killed once the engine has loaded a chunk back from it, and
// the run is interrupted once its log says the node's circuit opened.
TEST_F(RemoteRunTest, KillNineOfTheServerMidRunKeepsTheEngineServing) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  ChildProcess& job =
      start(run_args(redis.url(), "engine-k", {"--requests", "0", "--duration", "600"}));
  ASSERT_TRUE(wait_for(job, [&] { return keyspace_hits(redis) > 0; }))
      << "the run never read a chunk back from the store\n"
      << err();
  redis.kill9();
  ASSERT_TRUE(wait_for(job, [&] { return err().find("then it is probed") != std::string::npos; }))
      << "the run never noticed the dead server\n"
      << err();
  ASSERT_EQ(interrupt(job), 130) << err();
  const json r = report();
  EXPECT_TRUE(r["interrupted"].get<bool>());
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_GT(r["remote"]["stored"].get<std::uint64_t>(), 0u);  // before the kill
  EXPECT_GT(r["remote"]["errors"].get<std::uint64_t>(), 0u);  // after it
  EXPECT_EQ(r["remote"]["breaker_opens"], 1);
  EXPECT_TRUE(fs::is_empty(shm_));
}

TEST_F(RemoteRunTest, FrozenServerMidRunKeepsTheEngineServing) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  ChildProcess& job =
      start(run_args(redis.url(), "engine-s", {"--requests", "0", "--duration", "600"}));
  ASSERT_TRUE(wait_for(job, [&] { return keyspace_hits(redis) > 0; }))
      << "the run never read a chunk back from the store\n"
      << err();
  redis.stop();  // SIGSTOP: connections are accepted, nothing is answered
  const bool noticed =
      wait_for(job, [&] { return err().find("then it is probed") != std::string::npos; });
  const int code = interrupt(job);
  redis.cont();
  ASSERT_TRUE(noticed) << "the run never noticed the frozen server\n" << err();
  ASSERT_EQ(code, 130) << err();
  const json r = report();
  EXPECT_TRUE(r["all_verified"].get<bool>());
  EXPECT_GT(r["requests"].get<std::uint64_t>(), 0u);
  EXPECT_GT(r["remote"]["errors"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(fs::is_empty(shm_));
}

TEST_F(RemoteRunTest, MemcachedAndClusterStoresRunToo) {
  SKIP_WITHOUT("redis-server", "redis-cli", "memcached");
  ServerProcess mc(ServerProcess::Kind::kMemcached);
  ASSERT_EQ(exec(run_args(mc.url(), "engine-m")), 0) << err();
  EXPECT_GT(report()["remote"]["stored"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(report()["all_verified"].get<bool>());
  RedisCluster cluster;
  ASSERT_EQ(exec(run_args(cluster.url(), "engine-c1")), 0) << err();
  ASSERT_EQ(exec(run_args(cluster.url(), "engine-c2")), 0) << err();
  EXPECT_GT(report()["remote"]["promoted"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(report()["all_verified"].get<bool>());
}

TEST_F(RemoteRunTest, RemoteCheckReportsNodesAndSlotCoverage) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  ASSERT_EQ(exec({"remote", "check", redis.url(), "--json"}), 0) << err();
  json r = report();
  EXPECT_TRUE(r["reachable"].get<bool>());
  ASSERT_EQ(r["nodes"].size(), 1u);
  EXPECT_EQ(r["nodes"][0]["role"], "standalone");
  EXPECT_GT(r["nodes"][0]["rtt_ms"].get<double>(), 0.0);

  RedisCluster cluster;
  ASSERT_EQ(exec({"remote", "check", cluster.url(), "--json"}), 0) << err();
  r = report();
  EXPECT_EQ(r["slots_covered"], 16384);
  ASSERT_EQ(r["nodes"].size(), 3u);
  std::uint64_t slots = 0;
  for (const auto& n : r["nodes"]) slots += n["slots"].get<std::uint64_t>();
  EXPECT_EQ(slots, 16384u);
  ASSERT_EQ(exec({"remote", "check", cluster.url()}), 0);
  EXPECT_THAT(out(), HasSubstr("slot coverage 16384 / 16384"));

  const int port = kvoffload::test::free_port();
  EXPECT_EQ(exec({"remote", "check", "redis://127.0.0.1:" + std::to_string(port)}), 1);
  EXPECT_THAT(err(), HasSubstr("is unreachable"));

  // A cluster URL on a server that is not a cluster: no slot is served, exit 1.
  EXPECT_EQ(exec({"remote", "check", "redis-cluster://" + redis.url().substr(8), "--json"}), 1);
  r = report();
  EXPECT_EQ(r["slots_covered"], 0);
  EXPECT_THAT(r["error"]["message"].get<std::string>(),
              HasSubstr("no node gave a cluster slot map"));
  EXPECT_THAT(err(), HasSubstr("no node gave a cluster slot map"));
  // A standalone URL on a cluster node would get MOVED for most keys: exit 1 too.
  EXPECT_EQ(exec({"remote", "check", "redis://" + cluster.node(0).endpoint()}), 1);
  EXPECT_THAT(err(), HasSubstr("use redis-cluster://"));
}

// A master that is down leaves its slots without a server: the check says which and exits 1
// (it used to count the dead master's slots and print 16384 / 16384).
TEST_F(RemoteRunTest, RemoteCheckFailsWhenAMasterIsDown) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  RedisCluster cluster;
  cluster.node(1).kill9();
  EXPECT_EQ(exec({"remote", "check", cluster.url(), "--json"}), 1) << err();
  const json r = report();
  EXPECT_EQ(r["slots_assigned"], 16384);
  std::uint64_t dead_slots = 0;
  for (const auto& n : r["nodes"]) {
    if (n["endpoint"] == cluster.node(1).endpoint()) {
      EXPECT_FALSE(n["reachable"].get<bool>());
      dead_slots = n["slots"].get<std::uint64_t>();
    }
  }
  EXPECT_GT(dead_slots, 0u);
  EXPECT_EQ(r["slots_covered"].get<std::uint64_t>(), 16384 - dead_slots);
  const std::string message = r["error"]["message"];
  EXPECT_THAT(message, HasSubstr(std::to_string(dead_slots) +
                                 " of 16384 hash slots have no reachable master (unreachable: " +
                                 cluster.node(1).endpoint() + ")"));
  EXPECT_EQ(exec({"remote", "check", cluster.url()}), 1);
  EXPECT_THAT(out(), HasSubstr("INCOMPLETE"));
  EXPECT_THAT(err(), HasSubstr("have no reachable master"));
}

struct BadUrlCase {
  std::string url;
  std::string mentions;
};

class RemoteUsageTest : public RemoteRunTest, public ::testing::WithParamInterface<BadUrlCase> {};

TEST_P(RemoteUsageTest, BadUrlsAreUsageErrorsNamingWhatIsWrong) {
  EXPECT_EQ(exec(run_args(GetParam().url, "engine-x")), 2);
  EXPECT_THAT(err(), HasSubstr(GetParam().mentions));
  EXPECT_TRUE(fs::is_empty(shm_)) << "nothing is created before the URL is checked";
  EXPECT_EQ(exec({"remote", "check", GetParam().url}), 2);
  EXPECT_THAT(err(), HasSubstr(GetParam().mentions));
}

INSTANTIATE_TEST_SUITE_P(
    Urls, RemoteUsageTest,
    ::testing::Values(BadUrlCase{"mongodb://h:1", "unknown scheme 'mongodb'"},
                      BadUrlCase{"redis://:6379", "has no host"},
                      BadUrlCase{"redis://h", "'h' has no port"},
                      BadUrlCase{"redis://h:65536", "port 65536 is out of range; allowed 1..65535"},
                      BadUrlCase{"memcached://h:1,", "an empty node"}));

}  // namespace
