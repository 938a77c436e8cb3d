#pragma once
// Skips that name their reason (Note [Skips in CI] in tests/support/gtest_main.cpp). A test that
// cannot run here skips with a reason tag and a detail:
//
//   KVO_SKIP("no-servers") << "redis-server is not installed";
//
// The message reads "[no-servers] redis-server is not installed". When CI runs the suites
// (KVOFFLOAD_CI_NO_SKIPS=1, exported by .ci/run), a skip whose tag is not listed in
// tests/accepted_skips.txt fails the suite, and so does a bare GTEST_SKIP() without a tag.

#include <gtest/gtest.h>

#define KVO_SKIP(reason) GTEST_SKIP() << "[" reason "] "
