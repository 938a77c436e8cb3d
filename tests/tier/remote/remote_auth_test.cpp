// The remote tier against stores that want credentials or TLS, all real servers the tests start
// on loopback: redis-server with requirepass, with ACL users, with a TLS port (certificates made
// by the test, tests/support/test_certs.hpp), and a Redis Cluster with a password. A refusal is
// an authentication failure (kPermission, the server's answer quoted), never "unreachable", and
// no message holds the password.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "remote_servers.hpp"
#include "remote_tier_test_util.hpp"
#include "test_certs.hpp"

namespace kvoffload {
namespace {

using test::get_rows;
using test::keys_from;
using test::options;
using test::put_rows;
using test::RedisCluster;
using test::ServerProcess;
using test::TestCertificates;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kPassword = "Pw-7hX2-secret";
// remote check's deadline per node: only a server that never answers uses it up.
constexpr std::chrono::seconds kCheck{10};

std::string at(const ServerProcess& s) {
  return "127.0.0.1:" + std::to_string(s.port());
}

// The options of these tests: a connect deadline no loaded machine runs out of, so a refusal is
// never a timeout instead (a connect that times out is "unreachable": open() then succeeds).
RemoteTierOptions patient(const std::string& url) {
  RemoteTierOptions o = options(url);
  o.connect_timeout = std::chrono::seconds(10);
  return o;
}

// The message RemoteTier::open fails with (and that it fails with kPermission).
std::string open_refusal(const std::string& url) {
  try {
    auto tier = RemoteTier::open(patient(url));
    ADD_FAILURE() << "opened a tier the store refuses: " << tier->options().url.to_string();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermission) << e.what();
    return e.what();
  }
  return {};
}

// Puts and reads back rows: the tier works.
void expect_round_trip(RemoteTier& tier) {
  const auto keys = keys_from(100, 4);
  for (const auto& r : put_rows(tier, keys)) EXPECT_EQ(r.status, TierItemStatus::kOk);
  const auto got = get_rows(tier, keys);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(got.items[i].status, TierItemStatus::kOk);
    EXPECT_EQ(got.rows[i], test::row_of(keys[i], got.rows[i].size()));
  }
  EXPECT_EQ(tier.remote_stats().auth_failures, 0u);
}

class RedisAuthTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT("redis-server", "redis-cli"); }
};

TEST_F(RedisAuthTest, RequirepassServerWorksWithThePasswordAndRefusesWithoutIt) {
  ServerProcess redis(ServerProcess::Kind::kRedis, {"--requirepass", kPassword});
  redis.set_cli_args({"--pass", kPassword, "--no-auth-warning"});

  auto tier = RemoteTier::open(patient("redis://:" + std::string(kPassword) + "@" + at(redis)));
  expect_round_trip(*tier);
  EXPECT_EQ(redis.cli({"DBSIZE"}), std::to_string(4 * test::kWorld));
  EXPECT_THAT(tier->options().url.to_string(), Not(HasSubstr(kPassword)));

  const std::string none = open_refusal("redis://" + at(redis));
  EXPECT_THAT(none, HasSubstr("authentication failed at " + at(redis) + " without a password"));
  EXPECT_THAT(none, HasSubstr("the server answered NOAUTH"));
  EXPECT_THAT(none, HasSubstr("password_file"));  // what to do

  const std::string wrong = open_refusal("redis://:Wrong-Guess-42@" + at(redis));
  EXPECT_THAT(wrong, HasSubstr("authentication failed"));
  EXPECT_THAT(wrong, HasSubstr("with the password from the URL"));
  EXPECT_THAT(wrong, HasSubstr("WRONGPASS"));
  EXPECT_THAT(wrong, Not(HasSubstr("Wrong-Guess-42")));

  // A password for a server that has none is refused too, saying so.
  ServerProcess open_server(ServerProcess::Kind::kRedis);
  EXPECT_THAT(open_refusal("redis://:" + std::string(kPassword) + "@" + at(open_server)),
              HasSubstr("the server has no password: drop the credentials"));

  // remote check: the node answered, so it is not "unreachable"; it refused us.
  const RemoteCheckReport report = check_remote(RemoteUrl::parse("redis://" + at(redis)), kCheck);
  EXPECT_TRUE(report.refused());
  ASSERT_EQ(report.nodes.size(), 1u);
  EXPECT_TRUE(report.nodes[0].auth_failed);
  EXPECT_THAT(report.problem(), HasSubstr("authentication failed"));
  EXPECT_THAT(report.problem(), HasSubstr("NOAUTH"));
}

TEST_F(RedisAuthTest, ThePasswordComesFromAFileOrTheEnvironment) {
  ServerProcess redis(ServerProcess::Kind::kRedis, {"--requirepass", kPassword});
  const std::string file = (redis.dir() / "pw").string();
  std::ofstream(file) << kPassword << "\n";
  auto from_file = RemoteTier::open(patient("redis://" + at(redis) + "?password_file=" + file));
  expect_round_trip(*from_file);

  ::setenv("KVO_AUTH_TEST_PW", kPassword, 1);
  auto from_env =
      RemoteTier::open(patient("redis://" + at(redis) + "?password_env=KVO_AUTH_TEST_PW"));
  ::unsetenv("KVO_AUTH_TEST_PW");
  expect_round_trip(*from_env);

  std::ofstream(file) << "not-it\n";
  EXPECT_THAT(open_refusal("redis://" + at(redis) + "?password_file=" + file),
              HasSubstr("with the password from password_file " + file));
}

TEST_F(RedisAuthTest, AclUsers) {
  ServerProcess redis(ServerProcess::Kind::kRedis,
                      {"--user", "default", "off", "--user", "alice", "on", ">alice-pw", "~*", "&*",
                       "+@all", "--user", "reader", "on", ">reader-pw", "~*", "+@all", "-set"});
  redis.set_cli_args({"--user", "alice", "--pass", "alice-pw", "--no-auth-warning"});
  auto tier = RemoteTier::open(patient("redis://alice:alice-pw@" + at(redis)));
  expect_round_trip(*tier);

  const std::string wrong = open_refusal("redis://alice:bob-pw@" + at(redis));
  EXPECT_THAT(wrong, HasSubstr("as user 'alice'"));
  EXPECT_THAT(wrong, HasSubstr("WRONGPASS"));
  EXPECT_THAT(wrong, Not(HasSubstr("bob-pw")));
  // The default user is off: no credentials at all is refused too.
  EXPECT_THAT(open_refusal("redis://" + at(redis)), HasSubstr("NOAUTH"));

  // A user that may not SET: the tier opens (PING is allowed), its puts are refused as NOPERM,
  // counted as authentication failures with the server's answer.
  auto reader = RemoteTier::open(patient("redis://reader:reader-pw@" + at(redis)));
  for (const auto& r : put_rows(*reader, keys_from(900, 2)))
    EXPECT_NE(r.status, TierItemStatus::kOk);
  EXPECT_GT(reader->remote_stats().auth_failures, 0u);
  EXPECT_THAT(reader->first_auth_failure(), HasSubstr("NOPERM"));
  EXPECT_THAT(reader->first_auth_failure(), Not(HasSubstr("reader-pw")));
}

// A server that starts wanting a password mid-run: every request is refused, each refusal is
// counted, and the message says NOAUTH (the run fails on it, see remote_run_test).
TEST_F(RedisAuthTest, APasswordSetMidRunMakesEveryRequestAnAuthenticationFailure) {
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto tier = RemoteTier::open(patient(redis.url()));
  expect_round_trip(*tier);
  EXPECT_EQ(redis.cli({"CONFIG", "SET", "requirepass", kPassword}), "OK");
  redis.set_cli_args({"--pass", kPassword, "--no-auth-warning"});
  (void)redis.cli({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  for (int round = 0; round < 3; ++round) {
    for (const auto& r : put_rows(*tier, keys_from(200 + round * 10, 2)))
      EXPECT_NE(r.status, TierItemStatus::kOk);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the breaker's backoff
  }
  EXPECT_GT(tier->remote_stats().auth_failures, 0u);
  EXPECT_THAT(tier->first_auth_failure(), HasSubstr("authentication failed"));
  EXPECT_THAT(tier->first_auth_failure(), HasSubstr("NOAUTH"));
}

TEST_F(RedisAuthTest, ClusterWithAPassword) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  RedisCluster cluster(3, {"--requirepass", kPassword, "--masterauth", kPassword},
                       {"--pass", kPassword, "--no-auth-warning"});
  std::string url = cluster.url();
  const std::string with = "redis-cluster://:" + std::string(kPassword) + "@" +
                           url.substr(std::string("redis-cluster://").size());
  auto tier = RemoteTier::open(patient(with));
  expect_round_trip(*tier);
  EXPECT_EQ(tier->remote_stats().map_refreshes, 1u);

  const std::string refusal = open_refusal(url);
  EXPECT_THAT(refusal, HasSubstr("authentication failed"));
  EXPECT_THAT(refusal, HasSubstr("NOAUTH"));
  const RemoteCheckReport report = check_remote(RemoteUrl::parse(url), kCheck);
  EXPECT_TRUE(report.refused());
  EXPECT_THAT(report.problem(), HasSubstr("authentication failed"));
}

class RedisTlsTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT("redis-server", "redis-cli", "openssl"); }
};

TEST_F(RedisTlsTest, VerifiedTlsWithAPassword) {
  const TestCertificates certs;
  const int port = test::free_port();
  std::vector<std::string> args = certs.redis_args(port, /*require_client_cert=*/false);
  args.insert(args.end(), {"--requirepass", kPassword});
  ServerProcess redis(ServerProcess::Kind::kRedis, args, port);
  redis.set_cli_args({"--tls", "--cacert", certs.ca(), "--pass", kPassword, "--no-auth-warning"});

  const std::string base = "rediss://:" + std::string(kPassword) + "@" + at(redis);
  auto tier = RemoteTier::open(patient(base + "?tls_ca=" + certs.ca()));
  expect_round_trip(*tier);
  EXPECT_EQ(redis.cli({"DBSIZE"}), std::to_string(4 * test::kWorld));
  // The certificate names localhost too.
  auto by_name = RemoteTier::open(patient("rediss://:" + std::string(kPassword) + "@localhost:" +
                                          std::to_string(port) + "?tls_ca=" + certs.ca()));
  expect_round_trip(*by_name);

  // Verification is on by default: the system's trust store does not know the test CA, another
  // CA did not sign the server, and the certificate does not name "wrong.example".
  EXPECT_THAT(open_refusal(base), HasSubstr("the server's certificate did not verify"));
  const std::string other = open_refusal(base + "?tls_ca=" + certs.other_ca());
  EXPECT_THAT(other, HasSubstr("did not verify"));
  EXPECT_THAT(other, HasSubstr("checked against tls_ca " + certs.other_ca()));
  EXPECT_THAT(open_refusal(base + "?tls_ca=" + certs.ca() + "&tls_server_name=wrong.example"),
              HasSubstr("the name 'wrong.example'"));
  // TLS with the wrong password is an authentication failure like any other.
  EXPECT_THAT(open_refusal("rediss://:nope-nope@" + at(redis) + "?tls_ca=" + certs.ca()),
              HasSubstr("WRONGPASS"));

  // remote check over TLS.
  const RemoteCheckReport ok =
      check_remote(RemoteUrl::parse(base + "?tls_ca=" + certs.ca()), kCheck);
  EXPECT_TRUE(ok.problem().empty()) << ok.problem();
  const RemoteCheckReport untrusted = check_remote(RemoteUrl::parse(base), kCheck);
  EXPECT_TRUE(untrusted.refused());
  EXPECT_THAT(untrusted.problem(), HasSubstr("did not verify"));
}

TEST_F(RedisTlsTest, ClientCertificatesAndWrongPorts) {
  const TestCertificates certs;
  const int port = test::free_port();
  ServerProcess redis(ServerProcess::Kind::kRedis, certs.redis_args(port, true), port);
  const std::string url = "rediss://" + at(redis) + "?tls_ca=" + certs.ca();
  auto tier = RemoteTier::open(patient(url + "&tls_cert=" + certs.file("client.crt") +
                                       "&tls_key=" + certs.file("client.key")));
  expect_round_trip(*tier);

  // Without a client certificate (or with one the server's CA did not sign) the server refuses
  // the session. After a TLS 1.3 handshake its alert may lose the race with the first request
  // (which then meets a reset): either way the node is unusable and the message says what to
  // give.
  const TestCertificates others;
  for (const std::string& u : {url, url + "&tls_cert=" + others.file("client.crt") +
                                        "&tls_key=" + others.file("client.key")}) {
    const RemoteCheckReport refused = check_remote(RemoteUrl::parse(u), kCheck);
    ASSERT_EQ(refused.nodes.size(), 1u);
    EXPECT_FALSE(refused.nodes[0].reachable);
    EXPECT_THAT(refused.nodes[0].error, HasSubstr("tls_cert=")) << u;
  }
  // A key that is not the certificate's: refused before any connection.
  try {
    (void)RemoteTier::open(patient(url + "&tls_cert=" + certs.file("client.crt") +
                                   "&tls_key=" + certs.file("server.key")));
    ADD_FAILURE() << "a mismatched key was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("is not the PEM key of tls_cert"));
  }
  // rediss:// to a plain port: the handshake fails, and says to check the port.
  ServerProcess plain(ServerProcess::Kind::kRedis);
  const RemoteCheckReport r =
      check_remote(RemoteUrl::parse("rediss://" + at(plain) + "?tls_ca=" + certs.ca()), kCheck);
  ASSERT_EQ(r.nodes.size(), 1u);
  EXPECT_FALSE(r.nodes[0].reachable);
  EXPECT_THAT(r.nodes[0].error, HasSubstr("is it a TLS port?"));
}

// A Redis Cluster on TLS only (tls-port, tls-cluster) with a password: the slot map and every
// master are reached over verified TLS with AUTH.
TEST_F(RedisTlsTest, ClusterOverTlsWithAPassword) {
  const TestCertificates certs;
  const auto tls_node = [&](int port) {
    std::vector<std::string> a = certs.redis_args(port, false);
    a.insert(a.end(), {"--tls-cluster", "yes"});
    return a;
  };
  RedisCluster cluster(3, {"--requirepass", kPassword, "--masterauth", kPassword},
                       {"--tls", "--cacert", certs.ca(), "--pass", kPassword, "--no-auth-warning"},
                       tls_node);
  const std::string nodes = cluster.url().substr(std::string("redis-cluster://").size());
  const std::string url =
      "rediss-cluster://:" + std::string(kPassword) + "@" + nodes + "?tls_ca=" + certs.ca();
  auto tier = RemoteTier::open(patient(url));
  expect_round_trip(*tier);
  EXPECT_EQ(tier->remote_stats().nodes, 3u);
  const RemoteCheckReport report = check_remote(RemoteUrl::parse(url), kCheck);
  EXPECT_EQ(report.slots_covered, 16384u) << report.problem();
  // Without TLS the nodes answer nothing a client can use: no slot map, and no secret shown.
  const std::string plain = "redis-cluster://:" + std::string(kPassword) + "@" + nodes;
  const RemoteCheckReport none = check_remote(RemoteUrl::parse(plain), std::chrono::seconds(1));
  EXPECT_FALSE(none.problem().empty());
  EXPECT_THAT(none.problem(), Not(HasSubstr(kPassword)));
}

// memcached -S with a sasldb the test writes (saslpasswd2, Debian: sasl2-bin): SASL PLAIN over
// the binary protocol, which libmemcached uses for a URL with credentials.
TEST(MemcachedSaslTest, CredentialsAreSaslPlain) {
  SKIP_WITHOUT("memcached", "saslpasswd2");
  std::string tmpl = (std::filesystem::temp_directory_path() / "kvo-sasl-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::filesystem::path dir = tmpl;
  std::string out;
  ASSERT_EQ(test::run_command(
                {"/bin/sh", "-c",
                 "printf %s 'mc-" + std::string(kPassword) + "' | " + test::which("saslpasswd2") +
                     " -p -a memcached -c -f " + (dir / "sasldb").string() + " alice"},
                &out),
            0)
      << out;
  std::ofstream(dir / "memcached.conf")
      << "mech_list: plain\nsasldb_path: " << (dir / "sasldb").string() << "\n";
  // The server reads its SASL configuration from SASL_CONF_PATH, inherited at its start.
  ::setenv("SASL_CONF_PATH", dir.c_str(), 1);
  ServerProcess mc(ServerProcess::Kind::kMemcached, {"-S"});
  ::unsetenv("SASL_CONF_PATH");

  const std::string good = "memcached://alice:mc-" + std::string(kPassword) + "@" + at(mc);
  auto tier = RemoteTier::open(patient(good));
  expect_round_trip(*tier);
  EXPECT_EQ(tier->options().url.to_string(), "memcached://alice:***@" + at(mc));

  const std::string wrong = open_refusal("memcached://alice:not-it@" + at(mc));
  EXPECT_THAT(wrong, HasSubstr("authentication failed at " + at(mc) + " as user 'alice'"));
  EXPECT_THAT(wrong, HasSubstr("AUTHENTICATION FAILURE"));
  EXPECT_THAT(wrong, Not(HasSubstr("not-it")));
  const RemoteCheckReport report =
      check_remote(RemoteUrl::parse("memcached://alice:not-it@" + at(mc)), kCheck);
  EXPECT_TRUE(report.refused());

  // No credentials: the server leaves the text protocol unanswered, which must read as
  // "authentication required", not "unreachable" (issue 26).
  // The wait for the unanswered VERSION is the connect deadline: a short one, 2 s.
  RemoteTierOptions bare_options = options("memcached://" + at(mc));
  bare_options.connect_timeout = std::chrono::seconds(2);
  try {
    auto bare_tier = RemoteTier::open(bare_options);
    ADD_FAILURE() << "opened a SASL server's tier without credentials";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPermission) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("authentication required at " + at(mc)));
    EXPECT_THAT(e.what(), HasSubstr("requires SASL"));
    EXPECT_THAT(e.what(), Not(HasSubstr("unreachable")));
  }
  const RemoteCheckReport bare =
      check_remote(RemoteUrl::parse("memcached://" + at(mc)), std::chrono::seconds(2));
  EXPECT_TRUE(bare.refused());
  EXPECT_THAT(bare.problem(), HasSubstr("authentication required"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kvoffload
