#pragma once
// The kit of the `kvoffload` program suites (cli_probe_test.cpp, cli_region_test.cpp,
// cli_errors_test.cpp): CliTest runs the real binary with a per-test temporary --shm-dir and
// collects exit code, stdout and stderr, parses --json output, and starts and stops background
// `region create --hold` holders; the exit codes a script sees.

#include <sys/types.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"

namespace kvoffload::test {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

inline std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
  return (v + to - 1) / to * to;
}

inline std::string lower(std::string s) {
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
  std::filesystem::path err_file;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (std::filesystem::path(::testing::TempDir()) / "kvoffload_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    shm_ = dir_ / "shm";
    logs_ = dir_ / "logs";
    std::filesystem::create_directory(shm_);
    std::filesystem::create_directory(logs_);
  }

  void TearDown() override {
    holders_.clear();  // kills the holders still running
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
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
  nlohmann::json run_json(std::vector<std::string> args,
                          const std::map<std::string, std::string>& env = {}) {
    args.push_back("--json");
    const Result r = run(args, env);
    EXPECT_EQ(r.exit_code, kExitOk) << "stderr: " << r.err;
    try {
      return nlohmann::json::parse(r.out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "stdout is not one JSON object: " << e.what() << "\n" << r.out;
      return nlohmann::json::object();
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
  nlohmann::json start_holder(std::vector<std::string> args, Holder* out = nullptr) {
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
      return nlohmann::json::object();
    }
    return nlohmann::json::parse(*line);
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

  std::filesystem::path region_file(const std::string& engine) const {
    return shm_ / ("kvoffload_" + engine + ".region");
  }

  bool shm_is_empty() const { return std::filesystem::is_empty(shm_); }

  std::filesystem::path dir_;
  std::filesystem::path shm_;
  std::filesystem::path logs_;
  std::vector<std::unique_ptr<ChildProcess>> holders_;
  int counter_ = 0;
  std::chrono::seconds run_timeout_{120};  // a command still running then is killed (test fails)
};

}  // namespace kvoffload::test
