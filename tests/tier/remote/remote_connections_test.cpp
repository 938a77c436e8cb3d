// A redis-server node's connections and their failures, seen through RemoteTier: a batch is cut
// into one task per connection, a node killed with SIGKILL mid-run degrades to misses and is used
// again once restarted (by every connection), a frozen node answers pending then miss within the
// lookup budget, and a node unreachable at start warns and degrades. The suite's overview is at the
// top of remote_tier_test.cpp.

#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "remote_servers.hpp"
#include "remote_tier_test_util.hpp"

namespace kvoffload {
namespace {

using namespace std::chrono_literals;
using namespace kvoffload::test;
using ::testing::HasSubstr;

// ---- standalone Redis: connections and node failures ------------------------------------------

TEST(RemoteRedis, KillNineMidRunDegradesToMissesAndARestartedEmptyNodeIsUsedAgain) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  RemoteTierOptions o = options(redis.url());
  // The circuit must still be open when the test looks ("answers at once" below): a 100 ms
  // backoff ran out first on a loaded machine under ASan; 3 s is 30 times that, and the probe
  // after the restart still comes within seconds.
  o.breaker_backoff = 3s;
  o.breaker_backoff_max = 3s;
  auto tier = RemoteTier::open(o);
  const auto before = keys_from(1, 4);
  ASSERT_EQ(count(put_rows(*tier, before), TierItemStatus::kOk), 4u);

  // Loads run in another thread while the node dies.
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread loader([&] {
    while (!stop) {
      (void)get_rows(*tier, before);
      ++rounds;
    }
  });
  while (rounds < 3) std::this_thread::sleep_for(1ms);
  redis.kill9();
  const int at_kill = rounds;
  while (rounds < at_kill + 5) std::this_thread::sleep_for(1ms);  // loads keep completing
  stop = true;
  loader.join();

  const GetResult dead = get_rows(*tier, before);
  EXPECT_EQ(count(dead.items, TierItemStatus::kFailed), before.size());
  EXPECT_TRUE(all_sentinel(dead.rows[0]));
  EXPECT_EQ(count(put_rows(*tier, keys_from(50, 2)), TierItemStatus::kFailed), 2u);
  RemoteStats s = tier->remote_stats();
  EXPECT_EQ(s.breaker_opens, 1u);
  EXPECT_EQ(s.nodes_open, 1u);
  // An open circuit answers at once, without touching the network.
  const GetResult fast = get_rows(*tier, before);
  EXPECT_THAT(fast.items[0].detail, HasSubstr("circuit open"));

  redis.restart();  // same port, empty
  std::vector<TierItemResult> put;
  const auto give_up = std::chrono::steady_clock::now() + 60s;  // a hang, not a slow machine
  while (std::chrono::steady_clock::now() < give_up) {  // the probe after the backoff closes it
    put = put_rows(*tier, keys_from(60, 1));
    if (put[0].status == TierItemStatus::kOk) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(put[0].status, TierItemStatus::kOk) << put[0].detail;
  // Every connection of the node is used again, not only the one that probed: each worker had a
  // socket to the dead server, and none of them may fail a request after the restart.
  const std::uint64_t errors_before = tier->remote_stats().get_errors;
  for (int round = 0; round < 20; ++round) {
    const GetResult after = get_rows(*tier, before);  // the restarted node lost them: misses
    ASSERT_EQ(count(after.items, TierItemStatus::kMiss), before.size())
        << "round " << round << ": " << after.items[0].detail;
    ASSERT_EQ(get_rows(*tier, keys_from(60, 1)).rows[0],
              row_of(keys_from(60, 1)[0], kSlot * kWorld))
        << "round " << round;
  }
  EXPECT_EQ(tier->remote_stats().get_errors, errors_before);
  EXPECT_EQ(tier->remote_stats().nodes_open, 0u);
}

// Note [Task size]: one batch is spread over every connection of the node, never more tasks than
// connections while the window allows, and tiny requests are not split at all.
TEST(RemoteRedis, ABatchIsCutIntoOneTaskPerConnection) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  RemoteTierOptions o = options(redis.url(), 64 * 1024, 1);
  o.connections_per_node = 4;
  o.max_inflight_bytes = 64ULL << 20;  // a window of 4 MiB per task: never the limit here
  o.put_timeout = 5000ms;
  o.get_timeout = 5000ms;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 32);  // 32 values of 64 KiB: 2 MiB, 8 values per connection
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), keys.size());
  EXPECT_EQ(tier->remote_stats().tasks, 4u);
  ASSERT_EQ(count(get_rows(*tier, keys).items, TierItemStatus::kOk), keys.size());
  EXPECT_EQ(tier->remote_stats().tasks, 8u);
  ASSERT_EQ(count(get_rows(*tier, keys_from(1, 3)).items, TierItemStatus::kOk), 3u);
  EXPECT_EQ(tier->remote_stats().tasks, 11u) << "three values of 64 KiB: one task each";
  for (const auto p : resolve(*tier, keys_from(100, 16))) EXPECT_EQ(p, TierPresence::kAbsent);
  EXPECT_EQ(tier->remote_stats().tasks, 12u) << "16 EXISTS are one task";
}

// Only one worker sees a node die when the tier is idle (one single-task request); after the
// node comes back every other worker must reconnect too, not send down its dead socket.
TEST(RemoteRedis, EveryConnectionOfARestartedNodeReconnects) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  RemoteTierOptions o = options(redis.url());
  o.connections_per_node = 4;
  o.max_inflight_bytes = 4 * 6000;  // one value per task: a batch of 16 rows is 32 tasks
  o.breaker_failures = 1;
  o.get_timeout = 2000ms;
  o.put_timeout = 2000ms;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 16);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), keys.size());
  // Until every worker holds a connection (the server counts them; +1 for redis-cli itself).
  auto clients = [&] {
    const std::string info = redis.cli({"INFO", "clients"});
    const auto at = info.find("connected_clients:");
    return at == std::string::npos ? 0 : std::stoi(info.substr(at + 18));
  };
  for (int i = 0; i < 200 && clients() < 5; ++i) (void)get_rows(*tier, keys);
  ASSERT_EQ(clients(), 5);

  redis.kill9();  // while idle: no worker has noticed
  EXPECT_EQ(count(get_rows(*tier, keys_from(1, 1)).items, TierItemStatus::kFailed), 1u);
  EXPECT_EQ(tier->remote_stats().breaker_opens, 1u);
  redis.restart();
  std::vector<TierItemResult> put;
  for (int i = 0; i < 200; ++i) {  // the probe after the backoff closes the circuit
    put = put_rows(*tier, keys_from(60, 1));
    if (put[0].status == TierItemStatus::kOk) break;
    // Refused while the circuit waits; the first probe, whichever worker sends it, succeeds.
    ASSERT_THAT(put[0].detail, HasSubstr("circuit open")) << "attempt " << i;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(put[0].status, TierItemStatus::kOk) << put[0].detail;
  const std::uint64_t errors = tier->remote_stats().errors();
  for (int round = 0; round < 10; ++round) {
    const GetResult g = get_rows(*tier, keys);  // the restarted node is empty: all misses
    ASSERT_EQ(count(g.items, TierItemStatus::kMiss), keys.size())
        << "round " << round << ": " << g.items[0].detail;
  }
  EXPECT_EQ(tier->remote_stats().errors(), errors);
  EXPECT_EQ(tier->remote_stats().breaker_opens, 1u);
}

TEST(RemoteRedis, FrozenNodeAnswersPendingThenMissWithinTheBudget) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  RemoteTierOptions o = options(redis.url());
  o.breaker_failures = 1;  // the frozen get alone opens the circuit
  o.breaker_backoff = 3s;  // still open when the checks below look, on any machine
  o.breaker_backoff_max = 3s;
  auto tier = RemoteTier::open(o);
  // A second engine's tier whose lookup budget (50 ms) and get deadline (30 s) are 600 times
  // apart, and whose circuit stays closed, so its existence checks really wait on the frozen node:
  // answered at the budget and answered at the deadline cannot be mistaken for each other.
  RemoteTierOptions lo = options(redis.url());
  lo.lookup_timeout = 50ms;
  lo.negative_ttl = 0ms;
  lo.get_timeout = 30s;
  lo.breaker_failures = 1000;
  auto looker = RemoteTier::open(lo);
  const auto stored = keys_from(1, 2);
  ASSERT_EQ(count(put_rows(*tier, stored), TierItemStatus::kOk), 2u);
  redis.stop();  // SIGSTOP: connects are accepted by the kernel, nothing ever answers

  // Lookups of unknown keys: pending first, then a miss when the budget is spent; never a stall.
  // Bounds: at least the budget (nothing answered), and a third of the get deadline (a loaded
  // machine is late by milliseconds, not by 10 s; a lookup given the get deadline takes 30 s).
  const auto unknown = keys_from(10, 3);
  std::size_t rounds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto p : resolve(*looker, unknown, &rounds)) EXPECT_EQ(p, TierPresence::kAbsent);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GT(rounds, 1u);
  EXPECT_GE(took, lo.lookup_timeout) << "answered before the budget, yet nothing answered";
  EXPECT_LT(took, lo.get_timeout / 3) << "the lookup waited for the get deadline, not its budget";

  const GetResult g = get_rows(*tier, stored);  // returns: the get deadline fails it
  EXPECT_EQ(count(g.items, TierItemStatus::kFailed), 2u);
  EXPECT_THAT(g.items[0].detail, HasSubstr("deadline passed"));
  EXPECT_TRUE(all_sentinel(g.rows[0]));
  EXPECT_EQ(tier->remote_stats().breaker_opens, 1u);
  // With the circuit open, lookups are misses too (the node is not asked).
  for (const auto p : resolve(*tier, unknown, &rounds)) EXPECT_EQ(p, TierPresence::kAbsent);
  const RemoteStats s = tier->remote_stats();
  EXPECT_EQ(s.lookup_absent + s.lookup_errors, 3u);
  EXPECT_THAT(get_rows(*tier, stored).items[0].detail, HasSubstr("circuit open"));
  redis.cont();
  GetResult back;
  const auto give_up = std::chrono::steady_clock::now() + 60s;  // a hang, not a slow machine
  while (std::chrono::steady_clock::now() < give_up) {  // the probe after the backoff closes it
    back = get_rows(*tier, stored);
    if (back.items[0].status == TierItemStatus::kOk) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(count(back.items, TierItemStatus::kOk), 2u);
}

TEST(RemoteRedis, UnreachableAtStartWarnsAndDegrades) {
  const int port = test::free_port();  // nothing listens there
  auto tier = RemoteTier::open(options("redis://127.0.0.1:" + std::to_string(port)));
  EXPECT_EQ(tier->remote_stats().nodes_open, 1u);
  const auto keys = keys_from(1, 2);
  for (const auto p : resolve(*tier, keys)) EXPECT_EQ(p, TierPresence::kAbsent);
  EXPECT_EQ(count(put_rows(*tier, keys), TierItemStatus::kFailed), 2u);
  EXPECT_EQ(count(get_rows(*tier, keys).items, TierItemStatus::kFailed), 2u);
}

}  // namespace
}  // namespace kvoffload
