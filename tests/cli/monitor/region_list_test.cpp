// `kvoffload region list`: each engine's occupancy, in text and in JSON.
//
// Watching engines from outside, as an operator does; every test uses its own shm dir, and the
// engines are forked children of the test that publish a scripted state (or a real `kvoffload
// run`). The suite: region_list_test.cpp, top_test.cpp, exporter_test.cpp; its kit:
// monitor_test_util.hpp.

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "monitor_test_util.hpp"
#include "test_env.hpp"

namespace {

using json = nlohmann::json;
using kvoffload::test::ScriptedEngine;
using kvoffload::test::spawn;
using kvoffload::test::TempDir;
using kvoffload::test::unique_id;

// ---- region list ----

TEST(RegionList, ShowsEachEnginesOccupancyInTextAndJson) {
  TempDir shm;
  TempDir work;
  ScriptedEngine engine(shm.path(), unique_id("list"));
  auto p = spawn({"region", "list", "--shm-dir", shm.path().string(), "--json"}, work.path());
  ASSERT_EQ(p->wait(), 0) << p->err();
  const json j = json::parse(p->out());
  ASSERT_EQ(j["regions"].size(), 1U);
  const json& live = j["regions"][0]["live"];
  const json& s = live["scheduler"];
  EXPECT_TRUE(s["attached"].get<bool>());
  EXPECT_EQ(s["pid"], engine.pid());
  EXPECT_EQ(s["chunks"], 8);
  EXPECT_EQ(s["used"], 5);
  EXPECT_EQ(s["pinned"], 2);
  EXPECT_EQ(s["write_pending"], 0);
  EXPECT_EQ(s["misses"], 5);
  EXPECT_EQ(s["stores_completed"], 5);
  EXPECT_EQ(live["ranks"].size(), 2U);
  EXPECT_EQ(live["ranks"][0]["bringup"]["state"], "pending");

  auto text = spawn({"region", "list", "--shm-dir", shm.path().string()}, work.path());
  ASSERT_EQ(text->wait(), 0) << text->err();
  EXPECT_NE(text->out().find("used 5 of 8 chunks (62.5 %), 0 write-pending, 2 pinned, 8 "
                             "ready; hits 3, misses 5 (37.5 % hit); 0 evictions; bring-up "
                             "0 of 2 ranks ready"),
            std::string::npos)
      << text->out();
}

}  // namespace
