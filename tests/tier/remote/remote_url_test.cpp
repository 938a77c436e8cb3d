// Remote URLs with credentials and TLS (no server): where the password comes from, what each
// mistake says, and that no printed form -- to_string(), any parse error, redact_remote_url() --
// ever holds the password.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_url.hpp>

namespace kvoffload {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kSecret = "s3cr%t-Pw";  // the decoded form of s3cr%25t-Pw

std::string url_parse_error(const std::string& text) {
  try {
    (void)RemoteUrl::parse(text);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "accepted a URL that should have been refused";
  return {};
}

class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvo-url-XXXXXX").string();
    const int fd = ::mkstemp(tmpl.data());
    EXPECT_GE(fd, 0);
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  [[nodiscard]] std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST(RemoteUrlAuth, PasswordAndAclUserFromTheUrl) {
  const RemoteUrl p = RemoteUrl::parse("redis://:s3cr%25t-Pw@127.0.0.1:6379/2");
  EXPECT_TRUE(p.authenticates());
  EXPECT_EQ(p.user, "");
  EXPECT_EQ(p.password.reveal(), kSecret);
  EXPECT_EQ(p.password_source(), "the URL");
  EXPECT_EQ(p.db, 2u);
  EXPECT_EQ(p.to_string(), "redis://:***@127.0.0.1:6379/2");

  const RemoteUrl u = RemoteUrl::parse("redis-cluster://app%40x:pa:ss/w@a:7000,b:7001");
  EXPECT_EQ(u.user, "app@x");
  EXPECT_EQ(u.password.reveal(), "pa:ss/w");  // ':' and '/' after the first ':' are the password's
  EXPECT_EQ(u.nodes.size(), 2u);
  EXPECT_EQ(u.to_string(), "redis-cluster://app@x:***@a:7000,b:7001");

  const RemoteUrl m = RemoteUrl::parse("memcached://alice:pw@h:11211");
  EXPECT_EQ(m.user, "alice");
  EXPECT_EQ(m.password.reveal(), "pw");

  const RemoteUrl none = RemoteUrl::parse("redis://h:1");
  EXPECT_FALSE(none.authenticates());
  EXPECT_EQ(none.password_source(), "");
}

TEST(RemoteUrlAuth, PasswordFromAFileOrTheEnvironment) {
  const TempFile file(std::string(kSecret) + "\r\nsecond line ignored\n");
  const RemoteUrl f = RemoteUrl::parse("redis://bob@h:1?password_file=" + file.path());
  EXPECT_EQ(f.user, "bob");
  EXPECT_EQ(f.password.reveal(), kSecret);
  EXPECT_EQ(f.password_source(), "password_file " + file.path());
  EXPECT_EQ(f.to_string(), "redis://bob@h:1?password_file=" + file.path());
  // The printed form parses back to the same URL.
  EXPECT_EQ(RemoteUrl::parse(f.to_string()).password.reveal(), kSecret);

  ::setenv("KVO_URL_TEST_PW", kSecret, 1);
  const RemoteUrl e = RemoteUrl::parse("redis://h:1?password_env=KVO_URL_TEST_PW");
  EXPECT_EQ(e.password.reveal(), kSecret);
  EXPECT_EQ(e.password_source(), "password_env KVO_URL_TEST_PW");
  EXPECT_EQ(e.to_string(), "redis://h:1?password_env=KVO_URL_TEST_PW");
  ::unsetenv("KVO_URL_TEST_PW");

  EXPECT_THAT(url_parse_error("redis://h:1?password_env=KVO_URL_TEST_PW"),
              HasSubstr("password_env KVO_URL_TEST_PW: the environment variable is not set"));
  ::setenv("KVO_URL_TEST_PW", "", 1);
  EXPECT_THAT(url_parse_error("redis://h:1?password_env=KVO_URL_TEST_PW"),
              HasSubstr("the environment variable is empty"));
  ::unsetenv("KVO_URL_TEST_PW");
  EXPECT_THAT(url_parse_error("redis://h:1?password_file=/nonexistent/kvo-pw"),
              HasSubstr("password_file open /nonexistent/kvo-pw: No such file or directory"));
  const TempFile empty("\n");
  EXPECT_THAT(url_parse_error("redis://h:1?password_file=" + empty.path()), HasSubstr("is empty"));
  EXPECT_THAT(url_parse_error("redis://:pw@h:1?password_file=" + file.path()),
              HasSubstr("the password is given twice: in the URL and in password_file"));
  ::setenv("KVO_URL_TEST_PW", "x", 1);
  EXPECT_THAT(
      url_parse_error("redis://h:1?password_file=" + file.path() + "&password_env=KVO_URL_TEST_PW"),
      HasSubstr("password_file and password_env"));
  ::unsetenv("KVO_URL_TEST_PW");
}

TEST(RemoteUrlAuth, TlsSchemesAndOptions) {
  const TempFile ca("not a real CA, parse only checks that it is readable");
  const RemoteUrl s = RemoteUrl::parse("rediss://h:6380?tls_ca=" + ca.path());
  EXPECT_EQ(s.kind, RemoteKind::kRedis);
  EXPECT_TRUE(s.tls.enabled);
  EXPECT_EQ(s.tls.ca_file, ca.path());
  EXPECT_EQ(s.to_string(), "rediss://h:6380?tls_ca=" + ca.path());
  EXPECT_FALSE(RemoteUrl::parse("redis://h:1").tls.enabled);

  const RemoteUrl c = RemoteUrl::parse("rediss-cluster://:pw@a:1,b:2?tls_cert=" + ca.path() +
                                       "&tls_key=" + ca.path() + "&tls_server_name=redis.local");
  EXPECT_EQ(c.kind, RemoteKind::kRedisCluster);
  EXPECT_TRUE(c.tls.enabled);
  EXPECT_EQ(c.tls.cert_file, ca.path());
  EXPECT_EQ(c.tls.key_file, ca.path());
  EXPECT_EQ(c.tls.server_name, "redis.local");
  EXPECT_EQ(c.to_string(), "rediss-cluster://:***@a:1,b:2?tls_cert=" + ca.path() +
                               "&tls_key=" + ca.path() + "&tls_server_name=redis.local");

  EXPECT_THAT(url_parse_error("redis://h:1?tls_ca=" + ca.path()),
              HasSubstr("apply to rediss:// and rediss-cluster:// only"));
  EXPECT_THAT(url_parse_error("memcached://h:1?tls_ca=" + ca.path()),
              HasSubstr("apply to rediss:// and rediss-cluster:// only"));
  EXPECT_THAT(url_parse_error("rediss://h:1?tls_cert=" + ca.path()),
              HasSubstr("tls_cert and tls_key go together"));
  EXPECT_THAT(url_parse_error("rediss://h:1?tls_ca=/nonexistent/ca.pem"),
              HasSubstr("tls_ca access /nonexistent/ca.pem: No such file or directory"));
  EXPECT_THAT(url_parse_error("rediss://h:1?tls_ca=" + ca.path() + "&tls_ca=" + ca.path()),
              HasSubstr("'tls_ca' is given twice"));
}

TEST(RemoteUrlAuth, MistakesAreNamed) {
  EXPECT_THAT(url_parse_error("redis://h:1?nosuch=1"),
              HasSubstr("unknown option 'nosuch'; allowed: password_file, password_env"));
  EXPECT_THAT(url_parse_error("redis://h:1?tls_ca"), HasSubstr("option 'tls_ca' has no value"));
  EXPECT_THAT(url_parse_error("redis://h:1?password_env="), HasSubstr("has an empty value"));
  EXPECT_THAT(url_parse_error("redis://h:1?"), HasSubstr("an empty option"));
  EXPECT_THAT(url_parse_error("redis://user:@h:1"), HasSubstr("the password after ':' is empty"));
  EXPECT_THAT(url_parse_error("redis://@h:1"), HasSubstr("nothing before '@'"));
  EXPECT_THAT(url_parse_error("redis://alice@h:1"), HasSubstr("a user name without a password"));
  EXPECT_THAT(url_parse_error("memcached://:pw@h:1"),
              HasSubstr("memcached SASL needs a user name"));
  EXPECT_THAT(url_parse_error("redis://:p%zz@h:1"),
              HasSubstr("a '%' not followed by two hex digits"));
  EXPECT_THAT(url_parse_error("redis://:p%2@h:1"),
              HasSubstr("a '%' not followed by two hex digits"));
  EXPECT_THAT(url_parse_error("rediss://h:1?tls_ca=/a@b"), HasSubstr("an '@' after '?'"));
}

// Every refusal of a URL that holds the secret: none may repeat it, or any piece of it.
TEST(RemoteUrlAuth, NoErrorRepeatsThePassword) {
  const std::string pw = "Zq7-unguessable";
  const std::vector<std::string> bad = {
      "redis://:" + pw + "@host",                 // no port
      "redis://:" + pw + "@::1:6379",             // IPv6 without brackets (the case)
      "redis://:" + pw + "@h:70000",              // port out of range
      "redis://:" + pw + "@h:1/99",               // bad db
      "redis://:" + pw + "@a:1,b:2",              // two nodes on redis://
      "redis://" + pw + "@h:1",                   // a password without its ':'
      "redis://u:" + pw + "?x@h:1",               // an unencoded '?' in the password
      "redis://u:" + pw + "@h:1?password=" + pw,  // a password in an unknown option
      "redis://u:" + pw + "@h:1?password_env=NOPE_KVO_UNSET",
      "redis://u:" + pw + "@h:1?tls_ca=/x",  // TLS option without TLS
      "redisx://:" + pw + "@h:1",            // unknown scheme
      "rediss://:" + pw + "@h:1?tls_ca=/nonexistent",
      "memcached://:" + pw + "@h:1",
      "redis://:" + pw + "%zz@h:1",
  };
  for (const auto& url : bad) {
    const std::string error = url_parse_error(url);
    EXPECT_THAT(error, Not(HasSubstr(pw.substr(0, 6)))) << error;
    EXPECT_THAT(error, Not(HasSubstr(pw.substr(pw.size() - 6)))) << error;
  }
}

TEST(RemoteUrlAuth, RedactionHidesWhateverPrecedesTheLastAt) {
  EXPECT_EQ(redact_remote_url("redis://:pw@h:1"), "redis://:***@h:1");
  EXPECT_EQ(redact_remote_url("redis://alice:p@w/x@h:1/2"), "redis://alice:***@h:1/2");
  EXPECT_EQ(redact_remote_url("redis://secret@h:1"), "redis://***@h:1");
  EXPECT_EQ(redact_remote_url("user:pw@h:1"), "user:***@h:1");  // no scheme
  EXPECT_EQ(redact_remote_url("redis://h:1/0"), "redis://h:1/0");
  // Values of options that are not known to be public are hidden too.
  EXPECT_EQ(redact_remote_url("redis://h:1?password=pw&tls_ca=/ca.pem&x"),
            "redis://h:1?password=***&tls_ca=/ca.pem&x");
  EXPECT_EQ(redact_remote_url("rediss://:pw@h:1?password_env=PW"),
            "rediss://:***@h:1?password_env=PW");
}

}  // namespace
}  // namespace kvoffload
