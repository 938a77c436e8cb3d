// `kvoffload simulate` end to end: runs the built binary from $KVOFFLOAD_TEST_BIN_DIR on small
// traces whose results were computed by hand (see the comments), and checks usage errors.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "skip.hpp"

namespace {

namespace fs = std::filesystem;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class Simulate : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("KVOFFLOAD_TEST_BIN_DIR");
    if (dir == nullptr)
      KVO_SKIP("no-bin-dir") << "KVOFFLOAD_TEST_BIN_DIR is not set (run through ctest)";
    binary_ = fs::path(dir) / "kvoffload";
    ASSERT_TRUE(fs::exists(binary_)) << binary_;
    tmp_ = fs::temp_directory_path() / ("kvoffload_simulate_test_" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!tmp_.empty()) fs::remove_all(tmp_, ec);
  }

  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = tmp_ / name;  // not const: returned by move
    std::ofstream(p) << text;
    return p;
  }

  // `args` are the command line's words separated by spaces (no argument here has one).
  RunResult run(const std::string& args) {
    ChildSpec spec;
    spec.program = binary_.string();
    std::istringstream words(args);
    for (std::string w; words >> w;) spec.args.push_back(w);
    spec.out_file = tmp_ / "stdout.txt";
    spec.err_file = tmp_ / "stderr.txt";
    ChildProcess child(spec);
    RunResult r;
    r.exit_code = child.wait();
    r.out = child.out();
    r.err = child.err();
    return r;
  }

  fs::path binary_;
  fs::path tmp_;
};

// Four chunk slots. Hand-computed (MRU first):
//   LRU: r1 stores 1 2 3 -> [1 2 3]. r2 hits 1 2, stores 4 -> [4 1 2 3]. r3 evicts 3, 2 for 5 6
//        -> [5 6 4 1]. r4 hits 1 (2 is gone), touch -> [1 5 6 4], stores 2 3 evicting 4, 6.
//        hits 0+2+0+1 = 3 of 11, evictions 4.
//   ARC: r2's touch promotes 1 2 to T2; r3 evicts T1's 3 then 4 (|T1| > p = 0) into B1;
//        r4 hits 1 2 (T2), stores 3 evicting T1's LRU 6; 3 is a B1 ghost hit.
//        hits 0+2+0+2 = 4 of 11, evictions 3.
constexpr const char* kTrace =
    "# hand-computed trace\n"
    "1 2 3\n"
    "\n"
    "  1 2\t4\n"
    "5 6\n"
    "# another comment\n"
    "0000000000000000000000000000001 2 00003\n";

TEST_F(Simulate, LruHandComputed) {
  const fs::path trace = write("t.trace", kTrace);
  const RunResult r = run("simulate --trace " + trace.string() + " --policy lru --chunks 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("requests"), 4);
  EXPECT_EQ(j.at("chunks_looked_up"), 11);
  EXPECT_EQ(j.at("hits"), 3);
  EXPECT_EQ(j.at("misses"), 8);
  EXPECT_DOUBLE_EQ(j.at("hit_rate").get<double>(), 3.0 / 11.0);
  EXPECT_EQ(j.at("evictions"), 4);
  EXPECT_GT(j.at("ops_per_second").get<double>(), 0.0);
}

TEST_F(Simulate, ArcHandComputed) {
  const fs::path trace = write("t.trace", kTrace);
  const RunResult r = run("simulate --trace " + trace.string() + " --policy arc --chunks 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("requests"), 4);
  EXPECT_EQ(j.at("chunks_looked_up"), 11);
  EXPECT_EQ(j.at("hits"), 4);
  EXPECT_EQ(j.at("misses"), 7);
  EXPECT_EQ(j.at("evictions"), 3);
}

TEST_F(Simulate, StoreThreshold) {
  // Threshold 2: a chunk is stored on its second lookup. r1 stores nothing; r2 stores 1 2;
  // r3 hits 1 2 and stores 3.
  const fs::path trace = write("t.trace", "1 2 3\n1 2\n1 2 3\n");
  const RunResult r = run("simulate --trace " + trace.string() +
                          " --policy lru --chunks 8 --store-threshold 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("hits"), 2);
  EXPECT_EQ(j.at("stored"), 3);
}

TEST_F(Simulate, HumanOutput) {
  const fs::path trace = write("t.trace", kTrace);
  const RunResult r = run("simulate --trace " + trace.string() + " --chunks 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("hits 3, misses 8"), std::string::npos) << r.out;
}

TEST_F(Simulate, BadTraceNamesLineAndToken) {
  const fs::path trace = write("bad.trace", "# ok\n1 2\n3 xyz 4\n");
  const RunResult r = run("simulate --trace " + trace.string() + " --policy lru --chunks 4 --json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("line 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'xyz'"), std::string::npos) << r.err;
  // --json: the error as one JSON object on stdout (kvoffload's contract for every command).
  EXPECT_EQ(nlohmann::json::parse(r.out).at("error").at("code"), "usage") << r.out;
  const fs::path long_key = write("long.trace", "1\n" + std::string(33, 'a') + "\n");
  const RunResult r2 = run("simulate --trace " + long_key.string() + " --chunks 4");
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_NE(r2.err.find("line 2"), std::string::npos) << r2.err;
}

TEST_F(Simulate, TraceLayoutVariants) {
  // CRLF endings, blank and whitespace-only lines, a trailing comment, no final newline.
  const fs::path trace = write("crlf.trace", "1 2\r\n\r\n \t \n# c\n\t1  2 3\r\n# last");
  const RunResult r = run("simulate --trace " + trace.string() + " --policy lru --chunks 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("requests"), 2);
  EXPECT_EQ(j.at("chunks_looked_up"), 5);
  EXPECT_EQ(j.at("hits"), 2);
  const fs::path tail = write("tail.trace", "1 2\n3");  // the last request has no newline
  const RunResult r2 = run("simulate --trace " + tail.string() + " --chunks 8 --json");
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(nlohmann::json::parse(r2.out).at("chunks_looked_up"), 3);
  const fs::path bad = write("bad2.trace", "\n\n1 zz\n");  // blank lines count toward line numbers
  const RunResult r3 = run("simulate --trace " + bad.string() + " --chunks 8");
  EXPECT_EQ(r3.exit_code, 2);
  EXPECT_NE(r3.err.find("line 3"), std::string::npos) << r3.err;
}

TEST_F(Simulate, UsageErrors) {
  const fs::path trace = write("t.trace", kTrace);
  RunResult r = run("simulate --policy lru --chunks 4");  // no --trace
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--trace"), std::string::npos) << r.err;
  r = run("simulate --trace " + trace.string() + " --policy lfu --chunks 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("lfu"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("expected lru or arc"), std::string::npos) << r.err;  // the allowed kinds
  r = run("simulate --help");
  EXPECT_NE(r.out.find("Eviction policy: lru or arc (default lru)"), std::string::npos) << r.out;
  // Numeric options: the message names the flag, the value and the range.
  r = run("simulate --trace " + trace.string() + " --chunks 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--chunks: 0 is out of range; allowed 1 to 4294967294"), std::string::npos)
      << r.err;
  r = run("simulate --trace " + trace.string() + " --chunks 4294967295");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--chunks: 4294967295 is out of range; allowed 1 to 4294967294"),
            std::string::npos)
      << r.err;
  r = run("simulate --trace " + trace.string() + " --chunks many");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--chunks: 'many' is not a whole number; allowed 1 to 4294967294"),
            std::string::npos)
      << r.err;
  r = run("simulate --trace " + trace.string() + " --chunks 4 --store-threshold -1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--store-threshold: -1 is out of range; allowed 0 to 2^32-1"),
            std::string::npos)
      << r.err;
  r = run("simulate --trace " + (tmp_ / "missing.trace").string() + " --chunks 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.trace"), std::string::npos) << r.err;
}

}  // namespace
