// memcached servers the tests start, through RemoteTier: a round trip across two servers of which
// one dies, and a corrupted value that is a counted miss. The suite's overview is at the top of
// remote_tier_test.cpp.

#include <string>
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

// ---- memcached --------------------------------------------------------------------------------

TEST(RemoteMemcached, RoundTripAcrossTwoServersAndOneDies) {
  SKIP_WITHOUT("memcached");
  ServerProcess m1(ServerProcess::Kind::kMemcached);
  ServerProcess m2(ServerProcess::Kind::kMemcached);
  RemoteTierOptions o = options("memcached://" + m1.endpoint() + "," + m2.endpoint());
  o.memcached_item_max = 4 << 20;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 32);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), keys.size());
  auto reader = RemoteTier::open(o);
  for (const auto p : resolve(*reader, keys)) EXPECT_EQ(p, TierPresence::kPresent);
  const GetResult g = get_rows(*reader, keys);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(g.items[i].status, TierItemStatus::kOk) << g.items[i].detail;
    EXPECT_EQ(g.rows[i], row_of(keys[i], kSlot * kWorld));
  }
  m2.kill9();
  const GetResult half = get_rows(*reader, keys);
  const std::size_t ok = count(half.items, TierItemStatus::kOk);
  EXPECT_GT(ok, 0u);  // the keys hashed to the live server (both copies) still load
  EXPECT_LT(ok, keys.size());
  EXPECT_EQ(ok + count(half.items, TierItemStatus::kFailed), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (half.items[i].status == TierItemStatus::kOk) {
      EXPECT_EQ(half.rows[i], g.rows[i]);
    } else {
      EXPECT_TRUE(all_sentinel(half.rows[i]));
    }
  }
}

TEST(RemoteMemcached, CorruptValueIsACountedMiss) {
  SKIP_WITHOUT("memcached");
  ServerProcess m(ServerProcess::Kind::kMemcached);
  RemoteTierOptions o = options(m.url(), kSlot, 1);
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 2);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 2u);
  // Overwrite one value with five bytes through the text protocol.
  const std::string key = tier->store_key(keys[0], 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(m.port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string cmd = "set " + key + " 0 0 5\r\nhello\r\n";
  ASSERT_EQ(::send(fd, cmd.data(), cmd.size(), 0), static_cast<ssize_t>(cmd.size()));
  char buf[64];
  ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  ::close(fd);
  const GetResult g = get_rows(*tier, keys);
  EXPECT_EQ(g.items[0].status, TierItemStatus::kMiss);
  EXPECT_THAT(g.items[0].detail, HasSubstr("shorter than a header"));
  EXPECT_TRUE(all_sentinel(g.rows[0]));
  EXPECT_EQ(g.items[1].status, TierItemStatus::kOk);
  EXPECT_EQ(tier->remote_stats().corrupt, 1u);
}

// Note [Gets into the destination]: memcached values come out of libmemcached's own buffer, so
// even with verify_in_destination a slot is written only once its row verified: a damaged payload
// leaves the destination untouched.
TEST(RemoteMemcached, VerifyInDestinationStillLeavesAMissUntouched) {
  SKIP_WITHOUT("memcached");
  ServerProcess m(ServerProcess::Kind::kMemcached);
  RemoteTierOptions o = options(m.url(), kSlot, 1);
  o.verify_in_destination = true;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 2);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 2u);
  // Read the first value through the text protocol, flip one payload byte, store it back.
  const std::string key = tier->store_key(keys[0], 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(m.port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string get = "get " + key + "\r\n";
  ASSERT_EQ(::send(fd, get.data(), get.size(), 0), static_cast<ssize_t>(get.size()));
  const std::size_t value_bytes = remote_value_bytes(kSlot);
  std::string reply;
  while (reply.find("\r\nEND\r\n") == std::string::npos) {
    char buf[8192];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    reply.append(buf, static_cast<std::size_t>(n));
  }
  const std::size_t body = reply.find("\r\n") + 2;
  ASSERT_GE(reply.size(), body + value_bytes);
  std::string value = reply.substr(body, value_bytes);
  value[1000] = static_cast<char>(value[1000] ^ 0x5A);
  const std::string set =
      "set " + key + " 0 0 " + std::to_string(value_bytes) + "\r\n" + value + "\r\n";
  ASSERT_EQ(::send(fd, set.data(), set.size(), 0), static_cast<ssize_t>(set.size()));
  char ack[64];
  ASSERT_GT(::recv(fd, ack, sizeof ack, 0), 0);
  ::close(fd);
  const GetResult g = get_rows(*tier, keys);
  EXPECT_EQ(g.items[0].status, TierItemStatus::kMiss);
  EXPECT_THAT(g.items[0].detail, HasSubstr("payload checksum mismatch"));
  EXPECT_TRUE(all_sentinel(g.rows[0]));
  ASSERT_EQ(g.items[1].status, TierItemStatus::kOk);
  EXPECT_EQ(g.rows[1], row_of(keys[1], kSlot));
  EXPECT_EQ(tier->remote_stats().corrupt, 1u);
}

}  // namespace
}  // namespace kvoffload
