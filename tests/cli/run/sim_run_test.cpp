// `kvoffload run` on a simulated two-GPU machine in EXCLUSIVE_PROCESS compute mode (N1 of
// issue 16): each rank creates a context on its own device and nowhere else. A rank that first
// built a runtime on device 0 (to learn the device count) left a context there, which on a real
// GPU costs hundreds of MiB per rank and, in this compute mode, makes the second process that
// asks for device 0 fail ("busy or unavailable"), as the simulator does here.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"

namespace {

namespace fs = std::filesystem;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::read_text;

// Runs `kvoffload run ...` with `env` added; returns the exit status, stdout and stderr in files.
int run_kvoffload(const fs::path& dir, std::vector<std::string> args,
                  const std::map<std::string, std::string>& env) {
  ChildSpec spec;
  args.insert(args.begin(), "run");
  spec.args = std::move(args);
  spec.out_file = dir / "out";
  spec.err_file = dir / "err";
  spec.env = env;
  return ChildProcess(spec).wait();
}

TEST(SimRun, EachRankCreatesAContextOnItsOwnDeviceOnly) {
  std::string tmpl = (fs::path(::testing::TempDir()) / "kvoffload_simrun_XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
  const fs::path dir = tmpl;
  fs::create_directory(dir / "shm");
  fs::create_directory(dir / "locks");
  const fs::path log = dir / "contexts.log";
  const int rc = run_kvoffload(dir,
                               {"--backend",
                                "sim",
                                "--world-size",
                                "2",
                                "--layers",
                                "2",
                                "--block-bytes",
                                "4K",
                                "--blocks-per-chunk",
                                "2",
                                "--gpu-blocks",
                                "32",
                                "--host-pool",
                                "256K",
                                "--prefixes",
                                "4",
                                "--prefix-chunks",
                                "2",
                                "--requests",
                                "12",
                                "--duration",
                                "0",
                                "--bringup",
                                "blocking",
                                "--shm-dir",
                                (dir / "shm").string(),
                                "--json"},
                               {{"KVOFFLOAD_SIM_DEVICES", "2"},
                                {"KVOFFLOAD_SIM_COMPUTE_MODE", "exclusive_process"},
                                {"KVOFFLOAD_SIM_LOCK_DIR", (dir / "locks").string()},
                                {"KVOFFLOAD_SIM_CONTEXT_LOG", log.string()}});
  const std::string err = read_text(dir / "err");
  EXPECT_EQ(rc, 0) << err;
  EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr("busy or unavailable")));
  // One context per device, each made by a different process (its rank).
  std::map<int, std::set<long>> pids_by_device;
  std::istringstream lines(read_text(log));
  std::string word;
  long pid = 0;
  int device = 0;
  while (lines >> word >> pid >> word >> device) pids_by_device[device].insert(pid);
  ASSERT_EQ(pids_by_device.size(), 2u) << read_text(log);
  EXPECT_EQ(pids_by_device[0].size(), 1u) << "processes with a context on device 0:\n"
                                          << read_text(log);
  EXPECT_EQ(pids_by_device[1].size(), 1u) << read_text(log);
  EXPECT_NE(*pids_by_device[0].begin(), *pids_by_device[1].begin());
  if (rc == 0) {
    const nlohmann::json r = nlohmann::json::parse(read_text(dir / "out"));
    EXPECT_TRUE(r["all_verified"].get<bool>());
    ASSERT_EQ(r["ranks"].size(), 2u);
    EXPECT_EQ(r["ranks"][0]["device"], 0);
    EXPECT_EQ(r["ranks"][1]["device"], 1);
  }
  fs::remove_all(dir);
}

}  // namespace
