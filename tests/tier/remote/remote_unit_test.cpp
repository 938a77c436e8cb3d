// Remote tier pieces that need no server: URL parsing, the value format, the store key, the
// CRC16 hash slot, the geometry fingerprint, option validation and the circuit breaker.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "tier/remote/memcached_message.hpp"
#include "tier/remote/remote_ops.hpp"
#include "tier/remote/remote_value.hpp"

namespace kvoffload {
namespace {

using ::testing::HasSubstr;

std::string url_error(const std::string& text) {
  try {
    (void)RemoteUrl::parse(text);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return {};
}

TEST(RemoteUrl, ParsesEachScheme) {
  const RemoteUrl r = RemoteUrl::parse("redis://127.0.0.1:6380/3");
  EXPECT_EQ(r.kind, RemoteKind::kRedis);
  ASSERT_EQ(r.nodes.size(), 1u);
  EXPECT_EQ(r.nodes[0].host, "127.0.0.1");
  EXPECT_EQ(r.nodes[0].port, 6380);
  EXPECT_EQ(r.db, 3u);
  EXPECT_EQ(r.to_string(), "redis://127.0.0.1:6380/3");

  const RemoteUrl c = RemoteUrl::parse("redis-cluster://a:7000,b.example:7001,[::1]:7002");
  EXPECT_EQ(c.kind, RemoteKind::kRedisCluster);
  ASSERT_EQ(c.nodes.size(), 3u);
  EXPECT_EQ(c.nodes[1].host, "b.example");
  EXPECT_EQ(c.nodes[2].host, "::1");
  EXPECT_EQ(c.nodes[2].port, 7002);
  EXPECT_EQ(c.to_string(), "redis-cluster://a:7000,b.example:7001,[::1]:7002");

  const RemoteUrl m = RemoteUrl::parse("memcached://h1:11211,h2:11212");
  EXPECT_EQ(m.kind, RemoteKind::kMemcached);
  EXPECT_EQ(m.nodes.size(), 2u);
  EXPECT_EQ(RemoteUrl::parse("redis://h:1").db, 0u);
}

TEST(RemoteUrl, ErrorsNameWhatIsWrong) {
  EXPECT_THAT(url_error("redisx://h:1"), HasSubstr("unknown scheme 'redisx'"));
  EXPECT_THAT(url_error("h:6379"), HasSubstr("no scheme"));
  EXPECT_THAT(url_error("redis://"), HasSubstr("no host:port"));
  EXPECT_THAT(url_error("redis://:6379"), HasSubstr("has no host"));
  EXPECT_THAT(url_error("redis://host"), HasSubstr("'host' has no port"));
  EXPECT_THAT(url_error("redis://host:"), HasSubstr("has no port"));
  EXPECT_THAT(url_error("redis://host:70000"),
              HasSubstr("port 70000 is out of range; allowed 1..65535"));
  EXPECT_THAT(url_error("redis://host:0"), HasSubstr("port 0 is out of range"));
  EXPECT_THAT(url_error("redis://host:99999999999999999999"), HasSubstr("out of range"));
  EXPECT_THAT(url_error("redis://host:12ab"), HasSubstr("port '12ab' is not a number"));
  EXPECT_THAT(url_error("redis://h:1/16"), HasSubstr("db '16' is not a database number 0..15"));
  EXPECT_THAT(url_error("redis-cluster://h:1/2"), HasSubstr("only allowed on redis://"));
  EXPECT_THAT(url_error("redis://a:1,b:2"), HasSubstr("takes one host:port"));
  EXPECT_THAT(url_error("memcached://a:1,,b:2"), HasSubstr("an empty node"));
  EXPECT_THAT(url_error("redis://::1:6379"), HasSubstr("IPv6 host in brackets"));
  EXPECT_THAT(url_error("redis://h$x:1"), HasSubstr("contains '$'"));
}

TEST(RemoteValue, StoreKeyIsNamespacedAndHasNoHashTag) {
  const BlockKey k(0x0123456789abcdefULL, 0xfedcba9876543210ULL);
  const auto sk = detail::make_store_key(0xaabbccdd00112233ULL, k, 3);
  EXPECT_EQ(sk.view(), "kvo1:aabbccdd00112233:0123456789abcdeffedcba9876543210:3");
  EXPECT_EQ(detail::make_store_key(1, k, detail::kReplicatedCopy).view().back(), 'r');
  EXPECT_EQ(sk.view().find('{'), std::string_view::npos);
}

TEST(RemoteValue, ClusterSlotMatchesRedis) {
  // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
  EXPECT_EQ(detail::cluster_slot("123456789"), 0x31C3 % 16384);
  EXPECT_EQ(detail::cluster_slot("foo"), 12182);
  EXPECT_EQ(detail::cluster_slot("{user1000}.following"),
            detail::cluster_slot("{user1000}.followers"));
  EXPECT_EQ(detail::cluster_slot("{}x"), detail::cluster_slot("{}x"));
  EXPECT_NE(detail::cluster_slot("{}x"), detail::cluster_slot("x"));  // empty tag: whole key
  // Chunk keys of one engine spread over the slot space (no hash tag pins them).
  std::vector<int> quarter(4, 0);
  for (std::uint64_t i = 0; i < 400; ++i) {
    const auto sk = detail::make_store_key(7, BlockKey::from_u64(i), 0);
    ++quarter[detail::cluster_slot(sk.view()) / 4096];
  }
  for (const int q : quarter) EXPECT_GT(q, 50);
}

std::vector<std::byte> value_of(std::uint64_t fp, const BlockKey& key, std::uint32_t copy,
                                const std::vector<std::byte>& payload) {
  const auto h = detail::make_header(fp, key, copy, payload);
  std::vector<std::byte> v(sizeof h + payload.size());
  std::memcpy(v.data(), &h, sizeof h);
  // An empty payload's data() may be null, which memcpy must not be given (UBSan).
  if (!payload.empty()) std::memcpy(v.data() + sizeof h, payload.data(), payload.size());
  return v;
}

// Note [Remote values]: the payload's checksum is XXH3-64 of exactly its bytes, whichever of
// xxHash's entry points computes it (the dispatching one picks AVX-512 / AVX2 kernels): values
// written by another build or another machine must verify here, and a changed byte must not.
TEST(RemoteValue, ThePayloadChecksumIsXxh3OfThePayloadAtEverySize) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{240}, std::size_t{4096},
                              std::size_t{65536 + 13}, std::size_t{1} << 20}) {
    std::vector<std::byte> payload(n);
    for (std::size_t i = 0; i < n; ++i) payload[i] = static_cast<std::byte>(i * 131 + (i >> 11));
    const auto h = detail::make_header(5, BlockKey::from_u64(3), 0, payload);
    EXPECT_EQ(h.payload_xxh3, XXH3_64bits(payload.data(), n)) << n;
    auto v = value_of(5, BlockKey::from_u64(3), 0, payload);
    EXPECT_EQ(detail::verify_value(v, 5, BlockKey::from_u64(3), 0, n), detail::ValueCheck::kOk);
    if (n == 0) continue;
    v[v.size() - 1 - n / 2] ^= std::byte{0x10};
    EXPECT_EQ(detail::verify_value(v, 5, BlockKey::from_u64(3), 0, n),
              detail::ValueCheck::kPayloadChecksum)
        << n;
  }
}

TEST(RemoteValue, EveryHeaderFieldIsChecked) {
  using detail::ValueCheck;
  const BlockKey key = BlockKey::from_u64(42);
  std::vector<std::byte> payload(1000);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7);
  const auto good = value_of(9, key, 1, payload);
  auto check = [&](const std::vector<std::byte>& v) {
    return detail::verify_value(v, 9, key, 1, 1000);
  };
  EXPECT_EQ(check(good), ValueCheck::kOk);
  EXPECT_EQ(detail::verify_value(good, 8, key, 1, 1000), ValueCheck::kFingerprint);
  EXPECT_EQ(detail::verify_value(good, 9, BlockKey::from_u64(43), 1, 1000), ValueCheck::kKey);
  EXPECT_EQ(detail::verify_value(good, 9, key, 0, 1000), ValueCheck::kCopy);
  EXPECT_EQ(detail::verify_value(good, 9, key, 1, 999), ValueCheck::kLength);
  EXPECT_EQ(check(std::vector<std::byte>(good.begin(), good.begin() + 63)), ValueCheck::kShort);
  EXPECT_EQ(check(std::vector<std::byte>(good.begin(), good.end() - 1)), ValueCheck::kLength);
  auto flipped = good;
  flipped[64 + 500] ^= std::byte{1};
  EXPECT_EQ(check(flipped), ValueCheck::kPayloadChecksum);
  auto magic = good;
  magic[0] ^= std::byte{1};
  EXPECT_EQ(check(magic), ValueCheck::kMagic);
  auto version = good;
  version[4] ^= std::byte{2};
  EXPECT_EQ(check(version), ValueCheck::kVersion);
  auto header = good;
  header[40] ^= std::byte{1};  // payload length field, header checksum no longer matches
  EXPECT_EQ(check(header), ValueCheck::kHeaderChecksum);
}

TEST(RemoteGeometry, FingerprintCoversEveryField) {
  RemoteGeometry g{.slot_bytes = 4096,
                   .world_size = 2,
                   .replicated = false,
                   .tensor_layout = "layers=8",
                   .block_bytes = 512,
                   .blocks_per_chunk = 4,
                   .dtype = "bf16"};
  const std::uint64_t base = g.fingerprint();
  EXPECT_EQ(base, RemoteGeometry(g).fingerprint());
  auto differs = [&](auto mutate) {
    RemoteGeometry h = g;
    mutate(h);
    return h.fingerprint() != base;
  };
  EXPECT_TRUE(differs([](RemoteGeometry& h) { h.slot_bytes = 4097; }));
  EXPECT_TRUE(differs([](RemoteGeometry& h) { h.world_size = 4; }));
  EXPECT_TRUE(differs([](RemoteGeometry& h) { h.replicated = true; }));
  EXPECT_TRUE(differs([](RemoteGeometry& h) { h.tensor_layout = "layers=9"; }));
  EXPECT_TRUE(differs([](RemoteGeometry& h) { h.block_bytes = 1024; }));
  EXPECT_TRUE(differs([](RemoteGeometry& h) { h.blocks_per_chunk = 8; }));
  EXPECT_TRUE(differs([](RemoteGeometry& h) { h.dtype = "fp8"; }));
  EXPECT_THAT(g.describe(), HasSubstr("format=1"));
  EXPECT_EQ(g.copies(), 2u);
  g.replicated = true;
  EXPECT_EQ(g.copies(), 1u);
}

std::string options_error(const RemoteTierOptions& o) {
  try {
    o.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return {};
}

TEST(RemoteOptions, ValidationNamesTheField) {
  RemoteTierOptions o;
  o.url = RemoteUrl::parse("redis://h:1");
  o.geometry.slot_bytes = 4096;
  EXPECT_NO_THROW(o.validate());
  auto with = [&](auto mutate) {
    RemoteTierOptions c = o;
    mutate(c);
    return options_error(c);
  };
  EXPECT_THAT(with([](auto& c) { c.geometry.slot_bytes = 0; }), HasSubstr("slot_bytes is 0"));
  EXPECT_THAT(with([](auto& c) { c.lookup_timeout = std::chrono::milliseconds(0); }),
              HasSubstr("lookup_timeout is 0 ms"));
  EXPECT_THAT(with([](auto& c) { c.connections_per_node = 0; }),
              HasSubstr("connections_per_node 0"));
  EXPECT_THAT(with([](auto& c) { c.max_inflight_bytes = 100; }),
              HasSubstr("cannot hold one value"));
  EXPECT_THAT(with([](auto& c) { c.breaker_backoff_max = std::chrono::milliseconds(1); }),
              HasSubstr("breaker_backoff_max"));
  // memcached: a value must fit the servers' item size (-I), and the message says how to set it.
  const std::string m = with([](auto& c) {
    c.url = RemoteUrl::parse("memcached://h:1");
    c.geometry.slot_bytes = 2 << 20;
  });
  EXPECT_THAT(m, HasSubstr("exceeds memcached's item size 1048576"));
  EXPECT_THAT(m, HasSubstr("-I 3m"));
  EXPECT_EQ(remote_value_bytes(100), 164u);
}

TEST(CircuitBreaker, OpensAfterFailuresProbesAfterBackoffAndDoubles) {
  using namespace std::chrono_literals;
  detail::CircuitBreaker b(2, 100ms, 300ms);
  const auto t0 = detail::RemoteClock::now();
  EXPECT_TRUE(b.allow(t0));
  EXPECT_FALSE(b.on_failure(t0));
  EXPECT_TRUE(b.allow(t0));
  EXPECT_TRUE(b.on_failure(t0));  // the second failure opens it
  EXPECT_TRUE(b.open());
  EXPECT_FALSE(b.allow(t0 + 99ms));
  EXPECT_TRUE(b.rejecting(t0 + 99ms));
  EXPECT_TRUE(b.allow(t0 + 100ms));        // the probe
  EXPECT_FALSE(b.allow(t0 + 100ms));       // only one
  EXPECT_FALSE(b.on_failure(t0 + 100ms));  // failed probe: open for 200 ms
  EXPECT_FALSE(b.allow(t0 + 299ms));
  EXPECT_TRUE(b.allow(t0 + 300ms));
  EXPECT_FALSE(b.on_failure(t0 + 300ms));  // 400 ms capped at 300
  EXPECT_FALSE(b.allow(t0 + 599ms));
  EXPECT_TRUE(b.allow(t0 + 600ms));
  b.on_success();
  EXPECT_FALSE(b.open());
  EXPECT_TRUE(b.allow(t0 + 600ms));
  EXPECT_FALSE(b.on_failure(t0 + 600ms));  // the count restarted
  // A success also resets the backoff: the next opening is for the first period (100 ms), not
  // the 300 ms the failed probes had grown it to.
  EXPECT_TRUE(b.on_failure(t0 + 600ms));
  EXPECT_TRUE(b.rejecting(t0 + 699ms));
  EXPECT_FALSE(b.allow(t0 + 699ms));
  EXPECT_TRUE(b.allow(t0 + 700ms)) << "the backoff kept its doubled value after a success";
  EXPECT_FALSE(b.on_failure(t0 + 700ms));  // failed probe: doubles from the first period again
  EXPECT_FALSE(b.allow(t0 + 899ms));
  EXPECT_TRUE(b.allow(t0 + 900ms));
}

}  // namespace
}  // namespace kvoffload

namespace kvoffload {
namespace {

// libmemcached's last-error text carries its client's address in front, its source file behind
// and a server's CR/LF: none of it reaches a user (issue 26).
TEST(MemcachedMessage, ClientAddressSourceFileAndLineBreaksAreDropped) {
  EXPECT_EQ(detail::clean_memcached_message(
                "(0x5611d2a0c2f0) CONNECTION FAILURE(Connection refused), host: 127.0.0.1:1 -> "
                "./src/libmemcached/version.cc:40"),
            "CONNECTION FAILURE(Connection refused), host: 127.0.0.1:1");
  EXPECT_EQ(detail::clean_memcached_message("SERVER_ERROR object too large for cache\r\n"),
            "SERVER_ERROR object too large for cache");
  EXPECT_EQ(detail::clean_memcached_message("a\r\nb  c"), "a b c");
  EXPECT_EQ(detail::clean_memcached_message(""), "unknown error");
  EXPECT_EQ(detail::clean_memcached_message("host a -> b"), "host a -> b") << "not a source file";
}

// The same through real libmemcached, against a loopback port nothing listens on.
TEST(MemcachedMessage, ARefusedConnectionNamesTheEndpointWithoutLibmemcachedInternals) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const RemoteEndpoint ep{.host = "127.0.0.1", .port = ntohs(addr.sin_port)};
  ::close(s);  // bound, never listening, now closed: connect is refused
  try {
    (void)detail::probe_memcached(ep, RemoteUrl::parse("memcached://" + ep.to_string()),
                                  std::chrono::milliseconds(500));
    FAIL() << "a closed port answered";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, ::testing::HasSubstr("connect " + ep.to_string() + ": "));
    EXPECT_THAT(what, ::testing::Not(::testing::HasSubstr("(0x")));
    EXPECT_THAT(what, ::testing::Not(::testing::HasSubstr(".cc:")));
    EXPECT_EQ(what.find_first_of("\r\n"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace kvoffload
