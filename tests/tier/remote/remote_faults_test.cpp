// Protocol faults from a scriptable fake RESP server, seen through RemoteTier: error replies,
// partial replies, disconnects in the middle of a value, garbage on the wire, a busy node against
// the lookup budget, and the bytes pipelined in flight. The suite's overview is at the top of
// remote_tier_test.cpp.

#include <memory>
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

// ---- protocol faults (fake RESP server) -------------------------------------------------------

TEST(RemoteFaults, ErrorRepliesFailTheItemAndKeepTheConnection) {
  FakeResp fake([](const std::vector<std::string>& argv) -> FakeResp::Reply {
    if (argv[0] == "SET") return {"-OOM command not allowed when used memory > 'maxmemory'.\r\n"};
    if (argv[0] == "GET") return {"-ERR wrong kind\r\n"};
    return {":0\r\n"};
  });
  RemoteTierOptions o = options(fake.url());
  o.connections_per_node = 1;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 2);
  const auto put = put_rows(*tier, keys);
  EXPECT_EQ(count(put, TierItemStatus::kFailed), 2u);
  EXPECT_THAT(put[0].detail, HasSubstr("OOM command not allowed"));
  const GetResult g = get_rows(*tier, keys);
  EXPECT_EQ(count(g.items, TierItemStatus::kFailed), 2u);
  EXPECT_THAT(g.items[0].detail, HasSubstr("ERR wrong kind"));
  EXPECT_TRUE(all_sentinel(g.rows[0]));
  EXPECT_EQ(tier->remote_stats().nodes_open, 0u);  // an answer is not a node failure
  EXPECT_EQ(fake.connections(), 2);                // the open() probe and the one worker connection
}

// A get that failed on a node error forgets that the key was present (its own put said so):
// known() no longer answers "present" for a chunk that could not be read, and the next lookup asks
// the store again (which says absent here).
TEST(RemoteFaults, AFailedGetForgetsThatTheKeyWasPresent) {
  FakeResp fake([](const std::vector<std::string>& argv) -> FakeResp::Reply {
    if (argv[0] == "SET") return {"+OK\r\n"};
    if (argv[0] == "GET") return {"-ERR wrong kind\r\n"};
    return {":0\r\n"};
  });
  RemoteTierOptions o = options(fake.url());
  o.connections_per_node = 1;
  o.lookup_timeout = 30s;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 2);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 2u);
  EXPECT_EQ(tier->known(keys[0]), TierPresence::kPresent);
  const GetResult g = get_rows(*tier, keys);
  EXPECT_EQ(count(g.items, TierItemStatus::kFailed), 2u);
  EXPECT_EQ(tier->remote_stats().get_errors, 2u);
  EXPECT_FALSE(tier->known(keys[0]).has_value());
  EXPECT_FALSE(tier->known(keys[1]).has_value());
  for (const auto p : resolve(*tier, keys)) EXPECT_EQ(p, TierPresence::kAbsent);
  EXPECT_EQ(tier->remote_stats().lookups, 2u) << "asked again";
}

TEST(RemoteFaults, PartialReplyThenSilenceFailsAtTheDeadline) {
  FakeResp fake([](const std::vector<std::string>& argv) -> FakeResp::Reply {
    if (argv[0] == "GET") return {"$5064\r\nonly-the-start", false, /*stall=*/true};
    return {"+OK\r\n"};
  });
  auto tier = RemoteTier::open(options(fake.url()));
  const GetResult g = get_rows(*tier, keys_from(1, 1));
  EXPECT_EQ(g.items[0].status, TierItemStatus::kFailed);
  EXPECT_THAT(g.items[0].detail, HasSubstr("deadline passed waiting for a reply"));
  EXPECT_TRUE(all_sentinel(g.rows[0]));
}

TEST(RemoteFaults, DisconnectInTheMiddleOfAValueFailsAndReconnects) {
  std::atomic<int> gets{0};
  FakeResp fake([&](const std::vector<std::string>& argv) -> FakeResp::Reply {
    if (argv[0] == "GET" && gets++ == 0) return {"$5064\r\nhalf a value", /*close_after=*/true};
    if (argv[0] == "GET") return {"$-1\r\n"};
    return {"+OK\r\n"};
  });
  RemoteTierOptions o = options(fake.url(), kSlot, 1);
  o.connections_per_node = 1;
  auto tier = RemoteTier::open(o);
  const GetResult first = get_rows(*tier, keys_from(1, 1));
  EXPECT_EQ(first.items[0].status, TierItemStatus::kFailed);
  EXPECT_THAT(first.items[0].detail, HasSubstr("closed the connection"));
  EXPECT_TRUE(all_sentinel(first.rows[0]));
  const GetResult second = get_rows(*tier, keys_from(1, 1));  // a new connection, a clean miss
  EXPECT_EQ(second.items[0].status, TierItemStatus::kMiss);
  EXPECT_EQ(fake.connections(), 3);  // probe at open, the dropped one, the new one
}

TEST(RemoteFaults, LookupBudgetAnswersMissWhileTheNodeIsBusy) {
  // One connection, busy with a GET the server never answers (get deadline 30 s): an existence
  // check queued behind it cannot run, yet lookup() turns it into a miss at its own budget
  // (50 ms), not at the get deadline. The bounds are the frozen-node test's: at least the budget,
  // under a third of the get deadline.
  auto fake = std::make_unique<FakeResp>([](const std::vector<std::string>& argv) {
    if (argv[0] == "GET") return FakeResp::Reply{"", false, /*stall=*/true};
    return FakeResp::Reply{":1\r\n"};
  });
  RemoteTierOptions o = options(fake->url(), kSlot, 1);
  o.connections_per_node = 1;
  o.lookup_timeout = 50ms;
  o.negative_ttl = 0ms;
  o.get_timeout = 30s;
  auto tier = RemoteTier::open(o);
  std::vector<std::byte> row(kSlot);
  const std::vector<TierGet> gets = {{BlockKey::from_u64(1), row}};
  const TierBatch busy = tier->get(gets);
  std::size_t rounds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto p : resolve(*tier, keys_from(7, 2), &rounds)) EXPECT_EQ(p, TierPresence::kAbsent);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GT(rounds, 1u);
  EXPECT_GE(took, o.lookup_timeout);
  EXPECT_LT(took, o.get_timeout / 3) << "the lookup waited for the busy connection";
  EXPECT_FALSE(busy.ready()) << "the lookup waited for the busy connection instead of its budget";
  EXPECT_EQ(tier->remote_stats().lookup_absent, 2u);
  fake.reset();  // the server goes away: the busy GET fails now, not at its 30 s deadline
  EXPECT_EQ(busy.wait()[0].status, TierItemStatus::kFailed);
}

// The lookup budget is the caller's: past it lookup() answers a miss (lookup_timeouts), never an
// error, while the existence check itself runs on to the get deadline so that an answer that is
// late but comes is still remembered; only a node that never answers counts as failed
// (lookup_errors, its circuit breaker), at the get deadline. Budget 50 ms, get deadline 5 s: the
// second look at the keys comes long before the deadline even on a loaded machine.
TEST(RemoteFaults, AnUnansweredExistenceCheckIsAMissAtTheBudgetAndAnErrorAtTheGetDeadline) {
  FakeResp fake([](const std::vector<std::string>& argv) -> FakeResp::Reply {
    if (argv[0] == "EXISTS") return {"", false, /*stall=*/true};
    return {"+OK\r\n"};
  });
  RemoteTierOptions o = options(fake.url(), kSlot, 1);
  o.connections_per_node = 1;
  o.lookup_timeout = 50ms;
  o.get_timeout = 5s;
  o.breaker_failures = 1000;  // the node stays asked: no circuit shortens anything
  auto tier = RemoteTier::open(o);
  std::vector<TierPresence> out(2);
  const auto t0 = std::chrono::steady_clock::now();
  tier->lookup(keys_from(1, 2), out);
  EXPECT_EQ(out[0], TierPresence::kPending);
  std::this_thread::sleep_for(o.lookup_timeout + 20ms);
  tier->lookup(keys_from(1, 2), out);
  EXPECT_EQ(out[0], TierPresence::kAbsent) << "past the budget a lookup is a miss";
  EXPECT_EQ(out[1], TierPresence::kAbsent);
  EXPECT_EQ(tier->remote_stats().lookup_timeouts, 2u);
  EXPECT_EQ(tier->remote_stats().lookup_errors, 0u) << "a late answer is a miss, not an error";
  tier->drain();  // returns when the existence check has ended, answered or not
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(tier->remote_stats().lookup_errors, 2u)
      << "the unanswered check failed at its deadline";
  EXPECT_GE(took, o.get_timeout)
      << "the check ended before the get deadline: a late answer is lost";
}

TEST(RemoteFaults, GarbageOnTheWireIsAProtocolError) {
  FakeResp fake([](const std::vector<std::string>& argv) -> FakeResp::Reply {
    if (argv[0] == "EXISTS") return {"?what\r\n"};
    return {"+OK\r\n"};
  });
  auto tier = RemoteTier::open(options(fake.url()));
  for (const auto p : resolve(*tier, keys_from(1, 1))) EXPECT_EQ(p, TierPresence::kAbsent);
  EXPECT_EQ(tier->remote_stats().lookup_errors, 1u);
}

TEST(RemoteFaults, PipelinedBytesInFlightStayWithinTheCap) {
  // Each task carries at most max_inflight_bytes / connections_per_node wire bytes: with one
  // connection and room for two values, six puts are three tasks; with the queue capped at one
  // task, the first is sent and the other two are refused at once (nothing pins without bound).
  std::atomic<int> sets{0};
  FakeResp fake([&](const std::vector<std::string>& argv) -> FakeResp::Reply {
    if (argv[0] == "SET") ++sets;
    return {"+OK\r\n"};
  });
  RemoteTierOptions o = options(fake.url(), kSlot, 1);
  o.connections_per_node = 1;
  o.max_inflight_bytes = 2 * (kSlot + 64 + 200);
  o.max_queued_bytes = o.max_inflight_bytes;  // a third value waits in no queue: refused
  auto tier = RemoteTier::open(o);
  const auto put = put_rows(*tier, keys_from(1, 6));
  EXPECT_EQ(count(put, TierItemStatus::kOk), 2u);
  EXPECT_EQ(count(put, TierItemStatus::kFailed), 4u);
  EXPECT_THAT(put[5].detail, HasSubstr("send queue full"));
  EXPECT_EQ(sets, 2);
}

}  // namespace
}  // namespace kvoffload
