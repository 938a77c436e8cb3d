// `kvoffload region create / list / clean`: geometry reported and validated, joiners checking what
// the creator filled, capacity shortfalls, attached counts and stale flags, one holder per rank,
// and clean removing only what is stale (hostile entries included).
//
// The `kvoffload` program as operators and scripts use it (docs/DESIGN.md §10.1): every test execs
// the real binary ($KVOFFLOAD_TEST_BIN_DIR/kvoffload) with a per-test temporary --shm-dir, and
// checks exit codes, JSON keys and values, and what is left in the directory. The suite:
// cli_probe_test.cpp, cli_region_test.cpp, cli_errors_test.cpp; its kit: cli_test_util.hpp.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "cli_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::CliTest;
using kvoffload::test::Holder;
using kvoffload::test::kExitError;
using kvoffload::test::kExitOk;
using kvoffload::test::kExitUsage;
using kvoffload::test::lower;
using kvoffload::test::read_text;
using kvoffload::test::Result;
using kvoffload::test::round_up;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// region create

TEST_F(CliTest, CreateReportsGeometryAndReleases) {
  const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const json j = run_json(create_args(
      "geo", {"--slot-bytes", "6000", "--world-size", "3", "--rank", "1", "--chunks", "8"}));
  EXPECT_EQ(j.value("path", ""), region_file("geo").string());
  EXPECT_EQ(j.value("role", ""), "creator");
  EXPECT_EQ(j.value("rank", 99), 1);
  EXPECT_EQ(j.value("world_size", 0), 3);
  EXPECT_EQ(j.value("chunks", 0), 8);
  EXPECT_EQ(j.value("slot_bytes", 0), 6000);
  const std::uint64_t row = round_up(3 * 6000, page);
  EXPECT_EQ(j.value("row_stride", 0ULL), row);
  EXPECT_EQ(j.value("data_bytes", 0ULL), 8 * row);
  EXPECT_THAT(j.value("populate", ""), ::testing::AnyOf("madvise", "fallback"));
  EXPECT_GT(j.value("populate_bytes", 0ULL), 0ULL);
  EXPECT_LE(j.value("populate_bytes", 0ULL), 8 * row);
  EXPECT_GE(j.value("seconds", -1.0), 0.0);
  // The only process attached left: the file goes with it.
  EXPECT_TRUE(shm_is_empty());
}

// Note [Slot alignment]: --slot-align sets it, the JSON reports it and the slot stride, and a bad
// value is refused naming it.
TEST_F(CliTest, CreateSlotAlignIsReportedAndValidated) {
  const json d =
      run_json(create_args("al", {"--slot-bytes", "1000", "--world-size", "4", "--chunks", "2"}));
  EXPECT_EQ(d.value("slot_align", 0), 256);
  EXPECT_EQ(d.value("slot_stride", 0), 1024);
  const json j = run_json(create_args(
      "al", {"--slot-bytes", "1000", "--world-size", "4", "--chunks", "2", "--slot-align", "2K"}));
  EXPECT_EQ(j.value("slot_align", 0), 2048);
  EXPECT_EQ(j.value("slot_stride", 0), 2048);
  const Result bad = run(create_args("al", {"--slot-align", "100"}));
  EXPECT_EQ(bad.exit_code, kExitUsage);  // an invalid value, refused before anything is touched
  EXPECT_THAT(bad.err, ::testing::AllOf(HasSubstr("slot_align 100 "), HasSubstr("power of two")));
  EXPECT_TRUE(shm_is_empty());
}

TEST_F(CliTest, CreateReplicatedAndUnranked) {
  const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const json rep =
      run_json(create_args("rep", {"--replicated", "--world-size", "4", "--rank", "3"}));
  EXPECT_EQ(rep.value("copies", 0), 1);
  EXPECT_EQ(rep.value("row_stride", 0ULL), round_up(24 * 1024, page));
  const json unr = run_json(create_args("unr", {"--unranked", "--threads", "2"}));
  EXPECT_TRUE(unr["rank"].is_null());
  EXPECT_EQ(unr.value("data_bytes", 0ULL), 16 * round_up(2 * 24 * 1024, page));
  // An unranked mapper populates the whole region.
  EXPECT_EQ(unr.value("populate_bytes", 0ULL), unr.value("data_bytes", 1ULL));
}

TEST_F(CliTest, CreateHumanText) {
  const Result r = run(create_args("human", {"--fill", "7", "--check", "0x07"}));
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("creator"));
  EXPECT_THAT(r.out, HasSubstr("check 0x07: ok"));
}

TEST_F(CliTest, JoinerChecksWhatTheCreatorFilled) {
  // The creator holds rank 1; rank 0 is filled by one process and checked by the next ones (a
  // rank slot has one holder at a time, so they take turns).
  Holder creator;
  const json c = start_holder(create_args("fill", {"--rank", "1", "--fill", "0x5B"}), &creator);
  EXPECT_EQ(c.value("role", ""), "creator");
  EXPECT_EQ(c.value("filled_bytes", 0ULL), 16ULL * 24 * 1024);
  const json f = run_json(create_args("fill", {"--rank", "0", "--fill", "0xA5"}));
  EXPECT_EQ(f.value("role", ""), "joiner");

  // Rank 0's slots hold the byte, in hex or decimal.
  const json j = run_json(create_args("fill", {"--rank", "0", "--check", "0xa5"}));
  EXPECT_EQ(j.value("role", ""), "joiner");
  EXPECT_EQ(j.value("path", ""), c.value("path", "?"));
  EXPECT_EQ(j.value("checked_bytes", 0ULL), 16ULL * 24 * 1024);
  EXPECT_EQ(run_json(create_args("fill", {"--rank", "0", "--check", "165", "--threads", "3"}))
                .value("role", ""),
            "joiner");
  // Rank 1's slots hold the creator's byte, not rank 0's: an unranked check sees both.
  const Result both = run(create_args("fill", {"--unranked", "--check", "0x5B"}));
  EXPECT_EQ(both.exit_code, kExitError);
  EXPECT_THAT(both.err, HasSubstr("chunk 0, slot 0, byte offset 0"));
  EXPECT_THAT(both.err, HasSubstr("holds 0xa5"));

  // A wrong byte fails with exit 1 and names where and what.
  const Result bad = run(create_args("fill", {"--rank", "0", "--check", "0x5A", "--json"}));
  EXPECT_EQ(bad.exit_code, kExitError);
  EXPECT_THAT(bad.err, HasSubstr("chunk 0"));
  EXPECT_THAT(bad.err, HasSubstr("0xa5"));
  EXPECT_THAT(bad.err, HasSubstr("0x5a"));
  // --json: the same error as one JSON object on stdout.
  EXPECT_EQ(json::parse(bad.out)["error"]["code"], "mismatch") << bad.out;

  // SIGTERM ends the hold; the last process out removes the file.
  EXPECT_EQ(stop_holder(creator.pid, SIGTERM), kExitOk) << read_text(creator.err_file);
  EXPECT_TRUE(shm_is_empty());
}

TEST_F(CliTest, CheckFindsTheFirstBadByteOfAPartlyFilledRegion) {
  // An unranked command fills everything; a rank-1 joiner then overwrites its slot of every chunk
  // so an unranked check must point at rank 1's slot of chunk 0.
  // A rank-0 holder keeps the region; the scheduler role is free for each unranked command.
  Holder creator;
  start_holder(create_args("part", {"--rank", "0"}), &creator);
  run_json(create_args("part", {"--unranked", "--fill", "0x11"}));
  run_json(create_args("part", {"--rank", "1", "--fill", "0x22"}));
  const Result bad = run(create_args("part", {"--unranked", "--check", "0x11"}));
  EXPECT_EQ(bad.exit_code, kExitError);
  EXPECT_THAT(bad.err, HasSubstr("chunk 0, slot 1, byte offset 0"));
  EXPECT_THAT(bad.err, HasSubstr("holds 0x22"));
  EXPECT_EQ(stop_holder(creator.pid, SIGINT), kExitOk);
  EXPECT_TRUE(shm_is_empty());
}

TEST_F(CliTest, CapacityShortfallNamesRequiredAvailableAndFix) {
  // 2^40 chunks of a 4 KiB row: 4 PiB, more than any filesystem here has free.
  const Result r = run({"region", "create", "--engine-id", "huge", "--shm-dir", shm_.string(),
                        "--chunks", "1099511627776", "--slot-bytes", "4K"});
  EXPECT_EQ(r.exit_code, kExitError) << r.err;
  EXPECT_THAT(lower(r.err), ::testing::ContainsRegex("requir|need"));
  EXPECT_THAT(lower(r.err), HasSubstr("availab"));
  EXPECT_THAT(r.err, HasSubstr("--shm-size"));
  EXPECT_THAT(r.err, HasSubstr(region_file("huge").string()));
  EXPECT_TRUE(shm_is_empty());
}

// ---------------------------------------------------------------------------------------------
// region list / clean

TEST_F(CliTest, ListShowsAttachedCountAndStaleFlag) {
  EXPECT_EQ(run_json({"region", "list", "--shm-dir", shm_.string()})["regions"], json::array());

  Holder a, b;
  start_holder(create_args("listed", {"--rank", "0"}), &a);
  start_holder(create_args("listed", {"--rank", "1"}), &b);
  json l = run_json({"region", "list", "--shm-dir", shm_.string()});
  ASSERT_EQ(l["regions"].size(), 1U) << l.dump();
  json r = l["regions"][0];
  EXPECT_EQ(r.value("path", ""), region_file("listed").string());
  EXPECT_EQ(r.value("engine_id", ""), "listed");
  EXPECT_EQ(r.value("attached", 0), 2);
  EXPECT_FALSE(r.value("stale", true));
  EXPECT_EQ(r.value("bytes", 0ULL),
            r.value("data_bytes", 0ULL) +
                2 * static_cast<std::uint64_t>(
                        sysconf(_SC_PAGESIZE)));  // header page + live statistics page + data

  // Killed without a chance to clean up: the file stays, with nobody attached.
  stop_holder(a.pid, SIGKILL);
  stop_holder(b.pid, SIGKILL);
  l = run_json({"region", "list", "--shm-dir", shm_.string()});
  ASSERT_EQ(l["regions"].size(), 1U) << l.dump();
  r = l["regions"][0];
  EXPECT_EQ(r.value("attached", 99), 0);
  EXPECT_TRUE(r.value("stale", false));

  const Result human = run({"region", "list", "--shm-dir", shm_.string()});
  EXPECT_EQ(human.exit_code, kExitOk);
  EXPECT_THAT(human.out, HasSubstr("stale"));
}

// One holder per rank and one scheduler (--unranked): a second is refused with exit 1 and a message
// naming the engine, the role and the holder's PID; `region list` shows the holders (and takes no
// role); kill -9 frees a role for the next claimant at once.
TEST_F(CliTest, ASecondHolderOfARankOrTheSchedulerIsRefusedNamingThePid) {
  Holder rank0, scheduler;
  start_holder(create_args("dup", {"--rank", "0"}), &rank0);
  start_holder(create_args("dup", {"--unranked"}), &scheduler);

  const Result again = run(create_args("dup", {"--rank", "0", "--json"}));
  EXPECT_EQ(again.exit_code, kExitError) << again.err;
  EXPECT_THAT(again.err, HasSubstr("rank 0 of engine 'dup' is held by PID " +
                                   std::to_string(rank0.pid) + "."));
  EXPECT_THAT(again.err, HasSubstr("its own engine id"));
  const Result twice = run(create_args("dup", {"--unranked"}));
  EXPECT_EQ(twice.exit_code, kExitError) << twice.err;
  EXPECT_THAT(twice.err, HasSubstr("the scheduler role of engine 'dup' is held by PID " +
                                   std::to_string(scheduler.pid) + "."));

  const json l = run_json({"region", "list", "--shm-dir", shm_.string()});
  ASSERT_EQ(l["regions"].size(), 1U) << l.dump();
  EXPECT_EQ(l["regions"][0].value("attached", 0), 2) << "refused claimants left nothing attached";
  EXPECT_EQ(l["regions"][0]["owners"],
            json::parse(R"([{"role": "rank", "rank": 0, "pid": )" + std::to_string(rank0.pid) +
                        R"(}, {"role": "scheduler", "rank": null, "pid": )" +
                        std::to_string(scheduler.pid) + "}]"));
  const Result human = run({"region", "list", "--shm-dir", shm_.string()});
  EXPECT_THAT(human.out, HasSubstr("held by: rank 0 pid " + std::to_string(rank0.pid) +
                                   ", scheduler pid " + std::to_string(scheduler.pid)));

  stop_holder(rank0.pid, SIGKILL);
  EXPECT_EQ(run_json(create_args("dup", {"--rank", "0", "--join-timeout", "0"})).value("role", ""),
            "joiner");
  EXPECT_EQ(stop_holder(scheduler.pid, SIGTERM), kExitOk);
  EXPECT_TRUE(shm_is_empty());
}

TEST_F(CliTest, CleanRemovesStaleAndKeepsInUse) {
  Holder busy, dead;
  start_holder(create_args("busy"), &busy);
  start_holder(create_args("dead"), &dead);
  stop_holder(dead.pid, SIGKILL);
  ASSERT_TRUE(fs::exists(region_file("dead")));

  // Filtered by engine id: the busy one is reported kept, nothing removed.
  json j = run_json({"region", "clean", "--shm-dir", shm_.string(), "--engine-id", "busy"});
  EXPECT_EQ(j["removed"], json::array());
  EXPECT_EQ(j["kept"], json::array({region_file("busy").string()}));

  j = run_json({"region", "clean", "--shm-dir", shm_.string()});
  EXPECT_EQ(j["removed"], json::array({region_file("dead").string()}));
  EXPECT_EQ(j["kept"], json::array({region_file("busy").string()}));
  EXPECT_FALSE(fs::exists(region_file("dead")));
  EXPECT_TRUE(fs::exists(region_file("busy")));

  // A crashed creator's id can be used again right away (the stale file is reclaimed).
  start_holder(create_args("dead2"), &dead);
  stop_holder(dead.pid, SIGKILL);
  EXPECT_EQ(run_json(create_args("dead2")).value("role", ""), "creator");

  EXPECT_EQ(stop_holder(busy.pid, SIGTERM), kExitOk);
  EXPECT_TRUE(shm_is_empty());
}

// A FIFO, a directory and a symbolic link named like regions: list and clean used to hang on the
// FIFO and fail as a whole on the directory. They finish (in seconds: run_timeout_), list each
// with its reason, and clean removes only the real stale region.
TEST_F(CliTest, HostileEntriesDoNotHangOrFailListAndClean) {
  run_timeout_ = std::chrono::seconds(30);
  Holder dead;
  start_holder(create_args("real"), &dead);
  stop_holder(dead.pid, SIGKILL);
  ASSERT_EQ(mkfifo(region_file("fifo").c_str(), 0600), 0);
  fs::create_directory(region_file("dir"));
  fs::create_symlink(region_file("real"), region_file("link"));

  json l = run_json({"region", "list", "--shm-dir", shm_.string()});
  ASSERT_EQ(l["regions"].size(), 4U) << l.dump();
  std::map<std::string, std::string> problems;
  for (const json& r : l["regions"]) problems[r.value("engine_id", "")] = r.value("problem", "");
  EXPECT_EQ(problems,
            (std::map<std::string, std::string>{{"dir", "a directory, not a region file"},
                                                {"fifo", "a FIFO, not a region file"},
                                                {"link", "a symbolic link, not a region file"},
                                                {"real", ""}}));
  const Result human = run({"region", "list", "--shm-dir", shm_.string()});
  EXPECT_EQ(human.exit_code, kExitOk) << human.err;
  EXPECT_THAT(human.out, HasSubstr("fifo  not a region: a FIFO, not a region file  " +
                                   region_file("fifo").string()));

  const json c = run_json({"region", "clean", "--shm-dir", shm_.string()});
  EXPECT_EQ(c["removed"], json::array({region_file("real").string()}));
  EXPECT_EQ(c["kept"], json::array());
  EXPECT_EQ(c["skipped"], json::parse(R"([{"path":")" + region_file("dir").string() +
                                      R"(","reason":"a directory, not a region file"},{"path":")" +
                                      region_file("fifo").string() +
                                      R"(","reason":"a FIFO, not a region file"},{"path":")" +
                                      region_file("link").string() +
                                      R"(","reason":"a symbolic link, not a region file"}])"));
  EXPECT_TRUE(fs::is_fifo(region_file("fifo")));
  EXPECT_TRUE(fs::is_directory(region_file("dir")));
  EXPECT_TRUE(fs::is_symlink(region_file("link")));
  EXPECT_FALSE(fs::exists(region_file("real")));
}

}  // namespace
