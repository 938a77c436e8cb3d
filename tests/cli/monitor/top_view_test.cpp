// top's frames as cli/monitor/top_view.cpp draws them (pure: no terminal). The STORE and LOAD
// GB/s columns are the bytes a rank moved between two frames over the time between them; the
// (COPY) columns are its bytes over its copy time; "-" only where no rate is known yet.
#include "monitor/top_view.hpp"

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/live_stats.hpp>

namespace kvoffload::cli {
namespace {

using namespace std::chrono_literals;

// One engine with one rank whose engine moved these bytes (copy time 0.5 s each way).
std::vector<EngineSnapshot> engine(std::uint64_t store_bytes, std::uint64_t load_bytes) {
  EngineSnapshot e;
  e.region.engine_id = "e1";
  e.region.complete = true;
  LiveStats live;
  LiveRank r;
  r.rank = 0;
  r.engine_attached = true;
  r.pid = 4242;
  r.store.bytes = store_bytes;
  r.store.copy_seconds = 0.5;
  r.load.bytes = load_bytes;
  r.load.copy_seconds = 0.5;
  live.ranks.push_back(r);
  e.live = live;
  return {e};
}

// The words of rank 0's line: RANK PID BRING-UP STORE (COPY) LOAD (COPY) ...
std::vector<std::string> rank_columns(const std::vector<EngineSnapshot>& engines,
                                      const RateTracker& rates) {
  const std::vector<std::string> lines = render_top(engines, rates, TopHeader{});
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    if (lines[i].find("STORE GB/s") == std::string::npos) continue;
    std::istringstream words(lines[i + 1]);
    std::vector<std::string> out;
    for (std::string w; words >> w;) out.push_back(w);
    return out;
  }
  ADD_FAILURE() << "no rank table in the frame";
  return {};
}

TEST(TopView, TransferRatesAreTheBytesBetweenTwoFramesOverTheirTime) {
  RateTracker rates;
  const auto t0 = RateTracker::Clock::now();
  std::vector<EngineSnapshot> frame = engine(1'000'000'000, 500'000'000);
  rates.update(frame, t0);
  std::vector<std::string> c = rank_columns(frame, rates);
  ASSERT_GE(c.size(), 7U);
  EXPECT_EQ(c[0], "0");
  EXPECT_EQ(c[1], "4242");
  EXPECT_EQ(c[3], "-") << "no rate before a second frame";
  EXPECT_EQ(c[4], "(2.00)") << "1 GB in 0.5 s of copy time";
  EXPECT_EQ(c[5], "-");
  EXPECT_EQ(c[6], "(1.00)");

  // 2 s later: 6 GB more stored, 3 GB more loaded.
  frame = engine(7'000'000'000, 3'500'000'000);
  rates.update(frame, t0 + 2s);
  EXPECT_DOUBLE_EQ(rates.rate("e1", 0, true), 3.0);
  EXPECT_DOUBLE_EQ(rates.rate("e1", 0, false), 1.5);
  c = rank_columns(frame, rates);
  ASSERT_GE(c.size(), 7U);
  EXPECT_EQ(c[3], "3.00");
  EXPECT_EQ(c[4], "(14.00)");
  EXPECT_EQ(c[5], "1.50");
  EXPECT_EQ(c[6], "(7.00)");

  // Nothing moved in the next 4 s: 0, not "-".
  rates.update(frame, t0 + 6s);
  c = rank_columns(frame, rates);
  ASSERT_GE(c.size(), 7U);
  EXPECT_EQ(c[3], "0.00");
  EXPECT_EQ(c[5], "0.00");
}

TEST(TopView, ARestartedRankHasNoRateUntilItsNextFrame) {
  RateTracker rates;
  const auto t0 = RateTracker::Clock::now();
  rates.update(engine(8'000'000'000, 8'000'000'000), t0);
  // Its counters started again from zero (a restarted rank): no negative rate.
  rates.update(engine(1'000'000'000, 8'000'000'000), t0 + 1s);
  EXPECT_LT(rates.rate("e1", 0, true), 0.0);
  EXPECT_LT(rates.rate("e1", 0, false), 0.0);
  rates.update(engine(3'000'000'000, 9'000'000'000), t0 + 2s);
  EXPECT_DOUBLE_EQ(rates.rate("e1", 0, true), 2.0);
  EXPECT_DOUBLE_EQ(rates.rate("e1", 0, false), 1.0);
  EXPECT_LT(rates.rate("e2", 0, true), 0.0) << "an engine never seen";
}

}  // namespace
}  // namespace kvoffload::cli
