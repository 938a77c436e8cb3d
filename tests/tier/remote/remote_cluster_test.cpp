// Redis Cluster through RemoteTier: ASK and MOVED from two fake nodes that redirect exactly when a
// test says, then a real 3-master cluster the test starts (keys over all masters, a failed node,
// resharding while loads run). The suite's overview is at the top of remote_tier_test.cpp.

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "remote_servers.hpp"
#include "remote_tier_test_util.hpp"
#include "tier/remote/remote_value.hpp"

namespace kvoffload {
namespace {

using namespace std::chrono_literals;
using namespace kvoffload::test;

// ---- cluster redirects (fake nodes) -----------------------------------------------------------

// Two fake cluster nodes over one shared key space, so MOVED and ASK happen exactly when a test
// says. Their slot map (CLUSTER SLOTS) gives every slot to node A; `a_redirect` makes A answer GET
// with an ASK or a MOVED to B. B behaves as a real node that does not own the slot: it answers a
// command only right after ASKING on the same connection (it is importing the slot), or once
// `b_owns` says the slot is B's (after MOVED); otherwise it sends the client back to A with MOVED.
// After the first slot map both nodes refuse CLUSTER SLOTS, so the tier's map changes only
// through the redirects under test.
struct FakeCluster {
  enum class Redirect { kNone, kAsk, kMoved };

  FakeCluster()
      : a(FakeResp::SessionScript([this](const std::vector<std::string>& argv,
                                         const FakeResp::Session&) { return node_a(argv); })),
        b(FakeResp::SessionScript(
            [this](const std::vector<std::string>& argv, const FakeResp::Session& session) {
              return node_b(argv, session);
            })) {}

  [[nodiscard]] std::string url() const {
    return "redis-cluster://127.0.0.1:" + std::to_string(a.port());
  }
  // Commands B received that were not right after ASKING on their connection (GETs only).
  [[nodiscard]] int gets_on_b_without_asking() const {
    std::map<int, std::string> previous;
    int n = 0;
    for (const auto& l : b.log()) {
      if (l.argv[0] == "GET" && previous[l.connection] != "ASKING") ++n;
      previous[l.connection] = l.argv[0];
    }
    return n;
  }

  std::atomic<Redirect> a_redirect{Redirect::kNone};
  std::atomic<bool> b_owns{false};
  std::atomic<int> slot_maps{0};  // CLUSTER SLOTS asked (of either node)
  std::atomic<int> b_moved{0};    // MOVED replies B gave
  std::mutex mu;
  std::map<std::string, std::string> kv;
  FakeResp a;
  FakeResp b;

 private:
  static std::string redirect(const char* kind, const std::string& key, int port) {
    return std::string("-") + kind + " " + std::to_string(detail::cluster_slot(key)) +
           " 127.0.0.1:" + std::to_string(port) + "\r\n";
  }
  FakeResp::Reply slot_map() {
    if (slot_maps++ > 0) return {"-ERR no slot map in this test\r\n"};
    return {"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n" + FakeResp::bulk("127.0.0.1") + ":" +
            std::to_string(a.port()) + "\r\n"};
  }
  FakeResp::Reply serve(const std::vector<std::string>& argv) {
    const std::lock_guard lock(mu);
    if (argv[0] == "SET" && argv.size() == 3) {
      kv[argv[1]] = argv[2];
      return {"+OK\r\n"};
    }
    if (argv[0] == "GET" && argv.size() == 2) {
      const auto it = kv.find(argv[1]);
      return {it == kv.end() ? "$-1\r\n" : FakeResp::bulk(it->second)};
    }
    if (argv[0] == "EXISTS" && argv.size() == 2) return {kv.count(argv[1]) ? ":1\r\n" : ":0\r\n"};
    return {"-ERR unknown command '" + argv[0] + "'\r\n"};
  }
  FakeResp::Reply node_a(const std::vector<std::string>& argv) {
    if (argv[0] == "CLUSTER") return slot_map();
    if (argv[0] == "GET" && a_redirect != Redirect::kNone) {
      return {redirect(a_redirect == Redirect::kAsk ? "ASK" : "MOVED", argv[1], b.port())};
    }
    return serve(argv);
  }
  FakeResp::Reply node_b(const std::vector<std::string>& argv, const FakeResp::Session& session) {
    if (argv[0] == "CLUSTER") return slot_map();
    if (argv[0] == "ASKING") return {"+OK\r\n"};
    const bool asked = !session.previous->empty() && (*session.previous)[0] == "ASKING";
    if (!b_owns && !asked) {
      ++b_moved;
      return {redirect("MOVED", argv[1], a.port())};
    }
    return serve(argv);
  }
};

// Deadlines no loaded machine runs into: nothing fails in these tests.
RemoteTierOptions patient(RemoteTierOptions o) {
  o.connect_timeout = 10s;
  o.get_timeout = 30s;
  o.put_timeout = 30s;
  return o;
}

TEST(RemoteClusterRedirects, AskIsFollowedWithAskingAndLeavesTheSlotMapAlone) {
  FakeCluster cluster;
  auto tier = RemoteTier::open(patient(options(cluster.url(), kSlot, 1)));
  ASSERT_EQ(tier->remote_stats().map_refreshes, 1u);
  const auto keys = keys_from(1, 1);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 1u);
  ASSERT_EQ(cluster.a.count("SET"), 1);
  cluster.a_redirect = FakeCluster::Redirect::kAsk;  // the slot is migrating to B
  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE("get " + std::to_string(round));
    const GetResult g = get_rows(*tier, keys);
    ASSERT_EQ(g.items[0].status, TierItemStatus::kOk) << g.items[0].detail;
    EXPECT_EQ(g.rows[0], row_of(keys[0], kSlot));
    // An ASK moves one command: every get still goes to A first (the map was not changed).
    EXPECT_EQ(cluster.a.count("GET"), round);
    EXPECT_EQ(tier->remote_stats().redirects, static_cast<std::uint64_t>(round));
  }
  EXPECT_EQ(cluster.b.count("GET"), 2);
  EXPECT_EQ(cluster.b.count("ASKING"), 2);
  EXPECT_EQ(cluster.gets_on_b_without_asking(), 0) << "ASKING must precede the redirected GET";
  EXPECT_EQ(cluster.b_moved, 0);
  EXPECT_EQ(tier->remote_stats().map_refreshes, 1u);
}

TEST(RemoteClusterRedirects, MovedUpdatesTheSlotMapAndAsksForAFreshOne) {
  FakeCluster cluster;
  auto tier = RemoteTier::open(patient(options(cluster.url(), kSlot, 1)));
  ASSERT_EQ(tier->remote_stats().map_refreshes, 1u);
  const auto keys = keys_from(1, 1);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 1u);
  cluster.b_owns = true;  // the slot moved to B
  cluster.a_redirect = FakeCluster::Redirect::kMoved;
  for (int round = 1; round <= 2; ++round) {
    SCOPED_TRACE("get " + std::to_string(round));
    const GetResult g = get_rows(*tier, keys);
    ASSERT_EQ(g.items[0].status, TierItemStatus::kOk) << g.items[0].detail;
    EXPECT_EQ(g.rows[0], row_of(keys[0], kSlot));
    // The MOVED of the first get changed the map: the second goes straight to B.
    EXPECT_EQ(cluster.a.count("GET"), 1);
    EXPECT_EQ(cluster.b.count("GET"), round);
    EXPECT_EQ(tier->remote_stats().redirects, 1u);
  }
  EXPECT_EQ(cluster.b.count("ASKING"), 0) << "ASKING belongs to ASK, not to MOVED";
  // A MOVED also asks for a fresh slot map (the nodes refuse it here, so the map above is the
  // MOVED's own doing). Bounded wait: the refresh runs on the tier's own thread.
  for (int i = 0; i < 10'000 && cluster.slot_maps < 2; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_GE(cluster.slot_maps, 2) << "no slot map was asked for after MOVED";
}

// ---- Redis Cluster ----------------------------------------------------------------------------

TEST(RemoteCluster, KeysSpreadOverAllMastersAndAFailedNodeOnlyLosesItsOwn) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  RedisCluster cluster;
  auto tier = RemoteTier::open(options(cluster.url(), kSlot, 1));
  EXPECT_EQ(tier->remote_stats().map_refreshes, 1u);
  const auto keys = keys_from(1, 30);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), keys.size());
  for (std::size_t n = 0; n < cluster.size(); ++n) {
    EXPECT_NE(cluster.node(n).cli({"DBSIZE"}), "0") << "no chunk on master " << n;
  }
  const RemoteCheckReport report = check_remote(RemoteUrl::parse(cluster.url()), 500ms);
  EXPECT_EQ(report.slots_covered, 16384u);
  EXPECT_EQ(report.nodes.size(), 3u);

  cluster.node(2).kill9();
  const GetResult g = get_rows(*tier, keys);
  const std::size_t ok = count(g.items, TierItemStatus::kOk);
  EXPECT_GT(ok, 0u);
  EXPECT_LT(ok, keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (g.items[i].status == TierItemStatus::kOk) {
      EXPECT_EQ(g.rows[i], row_of(keys[i], kSlot));
    }
  }
}

TEST(RemoteCluster, MovedDuringReshardingWhileLoadsRun) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  RedisCluster cluster;
  auto tier = RemoteTier::open(options(cluster.url(), kSlot, 1));
  const auto keys = keys_from(1, 40);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), keys.size());
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> bad{0}, loads{0};
  std::thread loader([&] {
    while (!stop) {
      const GetResult g = get_rows(*tier, keys);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (g.items[i].status != TierItemStatus::kOk || g.rows[i] != row_of(keys[i], kSlot)) ++bad;
      }
      ++loads;
    }
  });
  // Move every slot of master 0 to master 1 while the loads run (MIGRATE key by key: ASK, then
  // MOVED once the slot's owner changed).
  std::string out;
  const int rc = test::run_command(
      {test::which("redis-cli"), "--cluster", "reshard", cluster.node(0).endpoint(),
       "--cluster-from", cluster.node_id(0), "--cluster-to", cluster.node_id(1), "--cluster-slots",
       "16384", "--cluster-yes"},
      &out);
  while (loads < 3) std::this_thread::sleep_for(1ms);
  stop = true;
  loader.join();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(cluster.node(0).cli({"DBSIZE"}), "0");
  EXPECT_EQ(bad, 0u) << "a load failed during resharding";
  const RemoteStats s = tier->remote_stats();
  EXPECT_GT(s.redirects, 0u);
  EXPECT_GT(s.map_refreshes, 1u);
  const GetResult after = get_rows(*tier, keys);
  EXPECT_EQ(count(after.items, TierItemStatus::kOk), keys.size());
}

}  // namespace
}  // namespace kvoffload
