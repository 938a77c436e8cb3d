// A one-test suite for tests/cmake/skip_policy_test.cmake, which runs it with the CI skip policy
// on and off (Note [Skips in CI] in gtest_main.cpp). KVO_PROBE_SKIP says what the test does:
// unset, it passes; "" (empty), it skips without a reason tag; "tag", it skips with that tag.
#include <cstdlib>

#include <gtest/gtest.h>

TEST(SkipPolicyProbe, DoesWhatItIsTold) {
  const char* tag = std::getenv("KVO_PROBE_SKIP");
  if (tag == nullptr) return;
  if (*tag == '\0') GTEST_SKIP() << "a skip that names no reason";
  GTEST_SKIP() << "[" << tag << "] the probe was told to skip";
}
