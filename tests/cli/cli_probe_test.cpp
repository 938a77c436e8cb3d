// `kvoffload probe`: every JSON key, the shm dir from the environment, the human text, and a
// missing directory.
//
// The `kvoffload` program as operators and scripts use it (docs/DESIGN.md §10.1): every test execs
// the real binary ($KVOFFLOAD_TEST_BIN_DIR/kvoffload) with a per-test temporary --shm-dir, and
// checks exit codes, JSON keys and values, and what is left in the directory. The suite:
// cli_probe_test.cpp, cli_region_test.cpp, cli_errors_test.cpp; its kit: cli_test_util.hpp.

#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "cli_test_util.hpp"

namespace {

using json = nlohmann::json;
using kvoffload::test::CliTest;
using kvoffload::test::kExitOk;
using kvoffload::test::Result;
using ::testing::HasSubstr;

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

}  // namespace

// probe names the shm dir's filesystem (statfs), and a region made on one that is not in memory
// is made with a warning: its pages would be written back to that disk (issue 26).
TEST_F(CliTest, ProbeShowsTheFilesystemAndADiskShmDirIsWarnedAbout) {
  struct statfs here {};
  ASSERT_EQ(::statfs(shm_.c_str(), &here), 0);
  const bool on_tmpfs = here.f_type == 0x01021994;  // TMPFS_MAGIC
  const json j = run_json({"probe", "--shm-dir", shm_.string()});
  EXPECT_EQ(j["shm_in_memory"].get<bool>(), on_tmpfs) << j.dump();
  EXPECT_EQ(j["shm_filesystem"] == "tmpfs", on_tmpfs) << j.dump();
  const json m = run_json({"probe", "--shm-dir", "/dev/shm"});
  EXPECT_EQ(m["shm_filesystem"], "tmpfs");
  EXPECT_TRUE(m["shm_in_memory"].get<bool>());
  EXPECT_THAT(run({"probe", "--shm-dir", "/dev/shm"}).out,
              HasSubstr("shm filesystem:       tmpfs (in memory)"));

  // A directory on a disk filesystem: this test's own when it is not on tmpfs, else one in the
  // working directory (the build tree).
  const std::string disk = on_tmpfs ? std::filesystem::current_path().string() : shm_.string();
  struct statfs d {};
  ASSERT_EQ(::statfs(disk.c_str(), &d), 0);
  if (d.f_type != 0x01021994) {  // a machine without any disk filesystem checks the rest only
    std::string disk_dir = disk;
    if (on_tmpfs) {
      disk_dir =
          (std::filesystem::path(disk) / ("kvo_disk_" + std::to_string(::getpid()))).string();
      std::filesystem::create_directory(disk_dir);
    }
    const Result c = run({"region", "create", "--shm-dir", disk_dir, "--engine-id", "disk",
                          "--chunks", "2", "--slot-bytes", "4K", "--world-size", "1"});
    EXPECT_EQ(c.exit_code, kExitOk) << c.err;
    EXPECT_THAT(c.err, HasSubstr("shm dir " + disk_dir + " is on a "));
    EXPECT_THAT(c.err, HasSubstr("not in memory (tmpfs, hugetlbfs)"));
    if (on_tmpfs) std::filesystem::remove_all(disk_dir);
  }
  // On tmpfs no warning.
  const std::string mem_dir = "/dev/shm/kvo_probe_" + std::to_string(::getpid());
  std::filesystem::create_directory(mem_dir);
  const Result t = run({"region", "create", "--shm-dir", mem_dir, "--engine-id", "mem", "--chunks",
                        "2", "--slot-bytes", "4K", "--world-size", "1"});
  std::filesystem::remove_all(mem_dir);
  EXPECT_EQ(t.exit_code, kExitOk) << t.err;
  EXPECT_THAT(t.err, ::testing::Not(HasSubstr("not in memory")));
}
