// A library built without the remote tier (-DKVOFFLOAD_REMOTE_TIER=OFF, Note [Built without the
// remote tier]): this suite links the library's objects with remote_tier_absent.cpp in place of
// the store clients, as such a build does, and no store library. That it links at all shows that
// nothing outside the store clients needs hiredis, libmemcached, libxxhash or OpenSSL; the cases
// check that none of them is loaded, that every way a remote URL reaches the library is refused
// with the one documented sentence (naming the URL without its secret), and that the
// configuration side still works.
#include <unistd.h>

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/kvoffload.h>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/remote_tier.hpp>

#include "tiered_store_test_util.hpp"

namespace kvoffload {
namespace {

using test::TieredFixture;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kRefusal =
    "this build has no remote tier; rebuild with -DKVOFFLOAD_REMOTE_TIER=ON";

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no kvoffload::Error was thrown";
  return Error(ErrorCode::kOk, "");
}

TEST(RemoteAbsent, NoStoreLibraryIsLoaded) {
  EXPECT_FALSE(remote_tier_built());
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps.good());
  std::string line;
  while (std::getline(maps, line)) {
    for (const char* lib : {"libhiredis", "libmemcached", "libxxhash", "libssl", "libsasl2"}) {
      EXPECT_THAT(line, Not(HasSubstr(lib))) << "a build without the remote tier loaded " << lib;
    }
  }
}

TEST(RemoteAbsent, OpeningARemoteTierIsRefusedNamingTheUrlWithoutItsSecret) {
  RemoteTierOptions o;
  o.url = RemoteUrl::parse("redis://:hunter2@127.0.0.1:6379/3");
  o.geometry.slot_bytes = 4096;
  o.name = "shared";
  const Error e = error_of([&] { (void)RemoteTier::open(o); });
  EXPECT_EQ(e.code(), ErrorCode::kNotAvailable);
  EXPECT_THAT(e.what(), HasSubstr(kRefusal));
  EXPECT_THAT(e.what(), HasSubstr("remote tier shared at redis://"));
  EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:6379"));
  EXPECT_THAT(e.what(), Not(HasSubstr("hunter2")));
  // Refused before the options are looked at: the build, not the option, is what to change.
  o.geometry.slot_bytes = 0;
  EXPECT_THAT(error_of([&] { (void)RemoteTier::open(o); }).what(), HasSubstr(kRefusal));
}

TEST(RemoteAbsent, CheckAndFingerprintAreRefused) {
  const RemoteUrl url = RemoteUrl::parse("memcached://127.0.0.1:11211,127.0.0.1:11212");
  const Error check = error_of([&] { (void)check_remote(url, std::chrono::milliseconds(100)); });
  EXPECT_EQ(check.code(), ErrorCode::kNotAvailable);
  EXPECT_THAT(check.what(), HasSubstr("remote check of memcached://"));
  EXPECT_THAT(check.what(), HasSubstr(kRefusal));
  RemoteGeometry g;
  g.slot_bytes = 4096;
  const Error fp = error_of([&] { (void)g.fingerprint(); });
  EXPECT_EQ(fp.code(), ErrorCode::kNotAvailable);
  EXPECT_THAT(fp.what(), HasSubstr(kRefusal));
}

TEST(RemoteAbsent, TheConfigurationStillParsesAndValidates) {
  RemoteTierOptions o;
  o.url = RemoteUrl::parse("redis-cluster://10.0.0.1:7000,10.0.0.2:7000");
  EXPECT_EQ(o.url.nodes.size(), 2u);
  o.geometry.slot_bytes = 4096;
  EXPECT_NO_THROW(o.validate());
  o.connections_per_node = 0;
  EXPECT_THAT(error_of([&] { o.validate(); }).what(), HasSubstr("connections_per_node 0"));
  EXPECT_EQ(remote_value_bytes(4096), 4096u + 64u);
  EXPECT_THAT(error_of([] { (void)RemoteUrl::parse("mongodb://h:1"); }).what(),
              HasSubstr("mongodb"));
  RemoteCheckReport report;
  report.url = RemoteUrl::parse("redis://127.0.0.1:1");
  report.nodes.push_back({.endpoint = report.url.nodes[0], .error = "connect refused"});
  EXPECT_FALSE(report.reachable());
  EXPECT_THAT(report.problem(), HasSubstr("the server is unreachable"));
}

// The C API's fingerprint: the error status and the same sentence, through
// kvo_last_error_message().
TEST(RemoteAbsent, TheCApisFingerprintIsRefused) {
  kvo_remote_tier_options o;
  ASSERT_EQ(kvo_remote_tier_options_init(&o), KVO_OK);
  o.url = "redis://127.0.0.1:6379";
  o.slot_bytes = 4096;
  EXPECT_EQ(kvo_remote_tier_options_validate(&o), KVO_OK);
  std::uint64_t fp = 0;
  EXPECT_EQ(kvo_remote_tier_fingerprint(&o, &fp), KVO_NOT_AVAILABLE);
  EXPECT_THAT(kvo_last_error_message(), HasSubstr(kRefusal));
}

// A stack with a remote tier (what `kvoffload run --remote-tier` and the vLLM worker build): the
// refusal surfaces as thrown, and the region and file tier made before it are released.
TEST_F(TieredFixture, AStackWithARemoteTierIsRefusedAndLeavesNothing) {
  StackConfig c = config(1);
  c.remote_tiers.push_back(remote_tier());
  const Error e = error_of([&] { (void)OffloadStack::build(c); });
  EXPECT_EQ(e.code(), ErrorCode::kNotAvailable);
  EXPECT_THAT(e.what(), HasSubstr(kRefusal));
  EXPECT_TRUE(test::files_under(shm_.path()).empty());
  // Without one, the same stack builds.
  c.remote_tiers.clear();
  auto s = OffloadStack::build(c);
  EXPECT_TRUE(s->close());
}

}  // namespace
}  // namespace kvoffload
