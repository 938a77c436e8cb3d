// The `kvoffload` program as operators and scripts use it (docs/DESIGN.md §10.1): every test execs
// the real binary ($KVOFFLOAD_TEST_BIN_DIR/kvoffload) with a per-test temporary --shm-dir, and
// checks exit codes, JSON keys and values, and what is left in the directory.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::read_text;
using ::testing::HasSubstr;

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
  return (v + to - 1) / to * to;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Result {
  int exit_code = -1;  // as ChildProcess::wait gives it (-N: killed by signal N)
  std::string out;
  std::string err;
};

// A background `kvoffload region create ... --hold` whose first stdout line is its result.
struct Holder {
  pid_t pid = -1;
  fs::path err_file;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "kvoffload_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    shm_ = dir_ / "shm";
    logs_ = dir_ / "logs";
    fs::create_directory(shm_);
    fs::create_directory(logs_);
  }

  void TearDown() override {
    holders_.clear();  // kills the holders still running
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  Result run(const std::vector<std::string>& args,
             const std::map<std::string, std::string>& env = {}) {
    ChildSpec spec;
    spec.args = args;
    spec.out_file = logs_ / ("out" + std::to_string(counter_));
    spec.err_file = logs_ / ("err" + std::to_string(counter_++));
    spec.env = env;
    ChildProcess child(spec);
    Result r;
    r.exit_code = child.wait(run_timeout_);
    r.out = child.out();
    r.err = child.err();
    return r;
  }

  // Runs and parses stdout as one JSON object; fails the test on a non-zero exit.
  json run_json(std::vector<std::string> args, const std::map<std::string, std::string>& env = {}) {
    args.push_back("--json");
    const Result r = run(args, env);
    EXPECT_EQ(r.exit_code, kExitOk) << "stderr: " << r.err;
    try {
      return json::parse(r.out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "stdout is not one JSON object: " << e.what() << "\n" << r.out;
      return json::object();
    }
  }

  std::vector<std::string> create_args(const std::string& engine,
                                       std::vector<std::string> more = {}) {
    // Defaults: 16 chunks of 24 KiB slots for 2 ranks; a flag in `more` replaces its default.
    std::vector<std::string> args{"region", "create",    "--engine-id",
                                  engine,   "--shm-dir", shm_.string()};
    for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
             {"--chunks", "16"}, {"--slot-bytes", "24K"}, {"--world-size", "2"}}) {
      if (std::find(more.begin(), more.end(), flag) == more.end())
        args.insert(args.end(), {flag, value});
    }
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  // Starts a holder and waits for its result line (printed after populate and fill).
  json start_holder(std::vector<std::string> args, Holder* out = nullptr) {
    args.insert(args.end(), {"--hold", "120", "--json"});
    ChildSpec spec;
    spec.args = std::move(args);
    spec.pipe_stdout = true;
    spec.err_file = logs_ / ("holder_err" + std::to_string(counter_++));
    ChildProcess& child = *holders_.emplace_back(std::make_unique<ChildProcess>(spec));
    if (out != nullptr) *out = Holder{child.pid(), spec.err_file};
    const auto line = child.read_line();
    if (!line) {
      ADD_FAILURE() << "holder printed no result line (in time, or before it exited); stderr: "
                    << child.err();
      return json::object();
    }
    return json::parse(*line);
  }

  // Ends a holder with `sig` and returns its exit status (-sig when the signal killed it).
  int stop_holder(pid_t pid, int sig) {
    for (auto& h : holders_) {
      if (h->pid() == pid) {
        h->signal(sig);
        return h->wait();
      }
    }
    ADD_FAILURE() << "no holder has pid " << pid;
    return ChildProcess::kTimedOut;
  }

  fs::path region_file(const std::string& engine) const {
    return shm_ / ("kvoffload_" + engine + ".region");
  }

  bool shm_is_empty() const { return fs::is_empty(shm_); }

  fs::path dir_;
  fs::path shm_;
  fs::path logs_;
  std::vector<std::unique_ptr<ChildProcess>> holders_;
  int counter_ = 0;
  std::chrono::seconds run_timeout_{120};  // a command still running then is killed (test fails)
};

// ---------------------------------------------------------------------------------------------
// probe

TEST_F(CliTest, ProbeJsonHasEveryKey) {
  const json j = run_json({"probe", "--shm-dir", shm_.string()});
  for (const char* key :
       {"shm_dir", "shm_free_bytes", "shm_total_bytes", "page_size", "madv_populate_write",
        "cgroup_memory_limit", "cgroup_memory_available", "numa_nodes", "backends"}) {
    EXPECT_TRUE(j.contains(key)) << key << " missing from " << j.dump();
  }
  EXPECT_EQ(j.value("shm_dir", ""), shm_.string());
  EXPECT_EQ(j.value("page_size", 0UL), static_cast<unsigned long>(sysconf(_SC_PAGESIZE)));
  EXPECT_GT(j.value("shm_total_bytes", 0ULL), 0ULL);
  EXPECT_LE(j.value("shm_free_bytes", 0ULL), j.value("shm_total_bytes", 0ULL));
  EXPECT_TRUE(j["madv_populate_write"].is_boolean());
  EXPECT_TRUE(j["cgroup_memory_limit"].is_null() || j["cgroup_memory_limit"].is_number_unsigned());
  EXPECT_TRUE(j["numa_nodes"].is_array());
  ASSERT_TRUE(j["backends"].is_array());
  bool host_seen = false;
  bool sim_seen = false;
  for (const json& b : j["backends"]) {
    EXPECT_TRUE(b.contains("name") && b.contains("built") && b.contains("device_count"))
        << b.dump();
    if (b.value("name", "") == "host") host_seen = b.value("built", false);
    if (b.value("name", "") == "sim")
      sim_seen = b.value("built", false) && b.value("device_count", 0) == 1;
  }
  EXPECT_TRUE(host_seen) << "the host backend is always built: " << j["backends"].dump();
  EXPECT_TRUE(sim_seen) << "the simulated device is always built, with one device: "
                        << j["backends"].dump();
}

TEST_F(CliTest, ProbeUsesShmDirFromEnvironment) {
  const json j = run_json({"probe"}, {{"KVOFFLOAD_SHM_DIR", shm_.string()}});
  EXPECT_EQ(j.value("shm_dir", ""), shm_.string());
}

TEST_F(CliTest, ProbeHumanText) {
  const Result r = run({"probe", "--shm-dir", shm_.string()});
  EXPECT_EQ(r.exit_code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr(shm_.string()));
  EXPECT_THAT(r.out, HasSubstr("page size"));
  EXPECT_FALSE(json::accept(r.out)) << "human output should not be JSON";
}

TEST_F(CliTest, ProbeOfMissingDirectoryFails) {
  const Result r = run({"probe", "--shm-dir", (dir_ / "does-not-exist").string()});
  EXPECT_NE(r.exit_code, kExitOk);
  EXPECT_THAT(r.err, HasSubstr("does-not-exist"));
}

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

// ---------------------------------------------------------------------------------------------
// errors as scripts see them: --json gives one JSON object on stdout on every exit

// The error object of a failed command, checked against its exit code and stderr.
void expect_error_object(const Result& r, int exit_code, const std::string& code,
                         const std::string& mentions) {
  EXPECT_EQ(r.exit_code, exit_code) << "stderr: " << r.err << "\nstdout: " << r.out;
  EXPECT_THAT(r.err, HasSubstr(mentions));
  json j;
  try {
    j = json::parse(r.out);  // exactly one JSON value, nothing else on stdout
  } catch (const std::exception& e) {
    ADD_FAILURE() << "stdout is not one JSON object: " << e.what() << "\n" << r.out;
    return;
  }
  ASSERT_TRUE(j.contains("error")) << j.dump();
  EXPECT_EQ(j["error"]["code"], code) << j.dump();
  EXPECT_EQ(j["error"]["exit_code"], exit_code);
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(mentions));
}

TEST_F(CliTest, JsonOnErrorPrintsOneErrorObjectOnStdout) {
  const std::string missing = (dir_ / "missing").string();
  const fs::path trace = dir_ / "trace.txt";
  std::ofstream(trace) << "0a 0b\n";
  // Every subcommand, through each way a command fails: a refused command line, a bad value found
  // by the command, a failing operation.
  expect_error_object(run({"probe", "--shm-dir", missing, "--json"}), kExitError, "system",
                      missing);
  expect_error_object(run({"region", "list", "--shm-dir", missing, "--json"}), kExitUsage,
                      "invalid_argument", missing + " does not exist");
  expect_error_object(
      run({"region", "clean", "--shm-dir", shm_.string(), "--engine-id", "a b", "--json"}),
      kExitUsage, "invalid_argument", "a b");
  expect_error_object(run({"region", "create", "--shm-dir", shm_.string(), "--engine-id", "e",
                           "--chunks", "4", "--slot-bytes", "4K", "--threads", "0", "--json"}),
                      kExitUsage, "usage", "--threads: 0 is out of range");
  expect_error_object(run({"simulate", "--trace", trace.string(), "--chunks", "0", "--json"}),
                      kExitUsage, "usage", "--chunks: 0 is out of range");
  expect_error_object(run({"simulate", "--trace", missing, "--chunks", "4", "--json"}), kExitError,
                      "not_found", missing);
  expect_error_object(run({"remote", "check", "mongodb://h:1", "--json"}), kExitUsage,
                      "invalid_argument", "unknown scheme 'mongodb'");
  expect_error_object(run({"run", "--shm-dir", shm_.string(), "--host-pool", "1K", "--json"}),
                      kExitUsage, "invalid_argument", "--host-pool");
  expect_error_object(run({"version", "--json", "--bogus"}), kExitUsage, "usage", "--bogus");
  // Without --json stdout stays empty on error.
  const Result plain = run({"probe", "--shm-dir", missing});
  EXPECT_EQ(plain.exit_code, kExitError);
  EXPECT_TRUE(plain.out.empty()) << plain.out;
  EXPECT_TRUE(shm_is_empty());
}

// `simulate --trace DIR` used to read a directory as a 2^63-byte file (std::bad_alloc).
TEST_F(CliTest, SimulateTraceThatIsADirectoryIsAClearError) {
  const Result r = run({"simulate", "--trace", dir_.string(), "--chunks", "4"});
  EXPECT_EQ(r.exit_code, kExitUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr("trace '" + dir_.string() + "' is a directory"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("bad_alloc")));
  // A pipe has no size to ask for, and is read to its end.
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::thread writer([&] { std::ofstream(fifo) << "0a 0b\n0a 0c\n"; });
  const Result f = run({"simulate", "--trace", fifo.string(), "--chunks", "4", "--json"});
  writer.join();
  ASSERT_EQ(f.exit_code, kExitOk) << f.err;
  EXPECT_EQ(json::parse(f.out)["requests"], 2);
  EXPECT_EQ(json::parse(f.out)["hits"], 1);
}

// Bytes of a bad trace that a terminal would act on are shown escaped, in text and in JSON;
// well-formed UTF-8 is kept.
TEST_F(CliTest, BinaryBytesOfABadTraceAreEscaped) {
  const fs::path trace = dir_ / "binary.trace";
  std::ofstream(trace, std::ios::binary) << "0a \xc3\xa9\x80\x1b[2J\x07\xc2\x9b\n";
  const Result r = run({"simulate", "--trace", trace.string(), "--chunks", "4"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("line 1"));
  EXPECT_THAT(r.err, HasSubstr("\xc3\xa9\\x80\\x1b[2J\\x07\\xc2\\x9b")) << r.err;
  for (const char raw : {'\x80', '\x1b', '\x07', '\x9b'}) {
    EXPECT_EQ(r.err.find(raw), std::string::npos) << "a raw byte " << int(raw) << ": " << r.err;
  }
  const Result j = run({"simulate", "--trace", trace.string(), "--chunks", "4", "--json"});
  EXPECT_EQ(j.exit_code, kExitUsage);
  const json e = json::parse(j.out);  // valid JSON although the input was not UTF-8
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("\xc3\xa9\\x80\\x1b"));
}

// `version` lists the backends its help promises: every backend, built or not.
TEST_F(CliTest, VersionListsTheBackends) {
  const json v = run_json({"version"});
  EXPECT_FALSE(v["version"].get<std::string>().empty());
  std::vector<std::string> names;
  for (const auto& b : v["backends"]) {
    names.push_back(b["name"]);
    EXPECT_TRUE(b.contains("built") && b.contains("device_count") && b.contains("detail"));
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("cuda", "hip", "host", "sim"));
  const Result text = run({"version"});
  EXPECT_EQ(text.exit_code, kExitOk);
  EXPECT_THAT(text.out, HasSubstr("backends:\n"));
  EXPECT_THAT(text.out, HasSubstr("  host: 1 device"));
  EXPECT_THAT(text.out, HasSubstr("  sim: "));
  // probe lists the same backends, the same way.
  const json p = run_json({"probe", "--shm-dir", shm_.string()});
  EXPECT_EQ(p["backends"].size(), v["backends"].size());
}

// ---------------------------------------------------------------------------------------------
// usage errors: exit 2, a message naming the problem, nothing created

struct UsageCase {
  const char* name;
  std::vector<std::string> args;  // after `region create --shm-dir DIR` unless `raw`
  const char* message;            // a substring stderr must contain
  bool raw = false;               // args are the whole command line (except --shm-dir)
};

class CliUsageTest : public CliTest, public ::testing::WithParamInterface<UsageCase> {};

TEST_P(CliUsageTest, ExitsWithUsageError) {
  const UsageCase& c = GetParam();
  std::vector<std::string> args;
  if (c.raw) {
    args = c.args;
    if (args.size() > 1) args.insert(args.end(), {"--shm-dir", shm_.string()});
  } else {
    args = {"region", "create", "--shm-dir", shm_.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
  }
  const Result r = run(args);
  EXPECT_EQ(r.exit_code, kExitUsage) << "stderr: " << r.err << "\nstdout: " << r.out;
  EXPECT_THAT(r.err, HasSubstr(c.message));
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(shm_is_empty());
}

// The hidden `run-worker` subcommand (the scheduler starts it) checks its one number too.
TEST_F(CliTest, RunWorkerFdOutOfRange) {
  const Result r = run({"run-worker", "--fd", "-1"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--fd: -1 is out of range; allowed 0 to 2^31-1"));
}

// Sizes take K/M/G/T (powers of two) in any case, with an optional B or iB.
TEST_F(CliTest, SizeSuffixesArePowersOfTwo) {
  int n = 0;
  for (const auto& [text, bytes] : std::vector<std::pair<std::string, std::uint64_t>>{
           {"8192", 8192}, {"8k", 8192}, {"8KiB", 8192}, {"8kb", 8192}, {"1M", 1U << 20}}) {
    const json j = run_json({"region", "create", "--shm-dir", shm_.string(), "--engine-id",
                             "size" + std::to_string(n++), "--chunks", "1", "--slot-bytes", text});
    EXPECT_EQ(j.value("slot_bytes", 0UL), bytes) << text << ": " << j.dump();
  }
}

const std::vector<std::string> kOk{"--engine-id", "e", "--chunks", "4", "--slot-bytes", "4K"};

std::vector<std::string> with(std::vector<std::string> more) {
  std::vector<std::string> args = kOk;
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, CliUsageTest,
    ::testing::Values(
        UsageCase{
            "bad_size_suffix", {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "4X"}, "'4X'"},
        UsageCase{"rank_not_below_world_size", with({"--world-size", "2", "--rank", "2"}),
                  "--rank 2"},
        UsageCase{"rank_and_unranked", with({"--rank", "1", "--unranked"}), "--unranked"},
        UsageCase{"missing_engine_id", {"--chunks", "4", "--slot-bytes", "4K"}, "--engine-id"},
        UsageCase{
            "bad_engine_id", {"--engine-id", "a/b", "--chunks", "4", "--slot-bytes", "4K"}, "a/b"},
        UsageCase{
            "dotdot_engine_id", {"--engine-id", "..", "--chunks", "4", "--slot-bytes", "4K"}, ".."},
        UsageCase{"zero_chunks",
                  {"--engine-id", "e", "--chunks", "0", "--slot-bytes", "4K"},
                  "--chunks: 0 is out of range; allowed 1 to 2^64-1"},
        UsageCase{"too_many_chunks",
                  {"--engine-id", "e", "--chunks", "18446744073709551616", "--slot-bytes", "4K"},
                  "--chunks: 18446744073709551616 is out of range; allowed 1 to 2^64-1"},
        UsageCase{"chunks_not_a_number",
                  {"--engine-id", "e", "--chunks", "1e3", "--slot-bytes", "4K"},
                  "--chunks: '1e3' is not a whole number; allowed 1 to 2^64-1"},
        UsageCase{"zero_slot_bytes",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "0"},
                  "--slot-bytes: 0 is out of range; allowed 1 to 1T bytes"},
        UsageCase{"slot_bytes_too_big",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "2T"},
                  "--slot-bytes: 2T is out of range; allowed 1 to 1T bytes"},
        UsageCase{"slot_bytes_overflow",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "16777216T"},
                  "--slot-bytes '16777216T': too large"},
        UsageCase{"slot_bytes_digits_overflow",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "99999999999999999999"},
                  "--slot-bytes '99999999999999999999': too large"},
        UsageCase{"slot_bytes_not_a_number",
                  {"--engine-id", "e", "--chunks", "4", "--slot-bytes", "K"},
                  "--slot-bytes 'K': not a number"},
        UsageCase{"zero_world_size", with({"--world-size", "0"}),
                  "--world-size: 0 is out of range; allowed 1 to 2^32-1"},
        UsageCase{"negative_rank", with({"--rank", "-1"}),
                  "--rank: -1 is out of range; allowed 0 to 4294967294"},
        UsageCase{"negative_join_timeout", with({"--join-timeout", "-1"}),
                  "--join-timeout: -1 is out of range; allowed 0 to 1000000000 seconds"},
        UsageCase{"join_timeout_not_a_number", with({"--join-timeout", "later"}),
                  "--join-timeout: 'later' is not a number; allowed 0 to 1000000000 seconds"},
        UsageCase{"too_many_threads", with({"--threads", "1025"}),
                  "--threads: 1025 is out of range; allowed 1 to 1024"},
        UsageCase{"fill_too_big", with({"--fill", "256"}), "'256'"},
        UsageCase{"check_not_hex", with({"--check", "0xZZ"}), "'0xZZ'"},
        UsageCase{"zero_threads", with({"--threads", "0"}),
                  "--threads: 0 is out of range; allowed 1 to 1024"},
        UsageCase{"negative_hold", with({"--hold", "-1"}),
                  "--hold: -1 is out of range; allowed 0 to 1000000000 seconds"},
        UsageCase{"nan_hold", with({"--hold", "nan"}),
                  "--hold: 'nan' is not a number; allowed 0 to 1000000000 seconds"},
        UsageCase{"unknown_flag", with({"--bogus"}), "--bogus"},
        UsageCase{"region_without_subcommand", {"region"}, "subcommand", true},
        UsageCase{"clean_bad_engine_id", {"region", "clean", "--engine-id", "x y"}, "x y", true}),
    [](const ::testing::TestParamInfo<UsageCase>& p) { return std::string(p.param.name); });

}  // namespace
