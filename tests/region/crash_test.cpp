// Creators that die (SIGKILL) or stall at chosen points of creation and population, joiners that
// wait for them, and a real small tmpfs.
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <future>
#include <regex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "fault_syscalls.hpp"
#include "private_tmpfs.hpp"
#include "region_helpers.hpp"
#include "skip.hpp"
#include "test_env.hpp"

namespace kvoffload {
namespace {

using test::expect_error;
using test::FaultSyscalls;
using test::Op;
using test::small_options;
using test::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct KillPoint {
  const char* name;
  Op op;
  int nth;
  bool before;       // before or after the real call
  bool leaves_file;  // whether a (stale) file is expected afterwards
};

class CreatorKilled : public ::testing::TestWithParam<KillPoint> {};

void run_creator_killed_at(const KillPoint& k, const RegionOptions& opts) {
  const pid_t pid = test::fork_child([&] {
    FaultSyscalls sys;
    auto hook = [] { (void)::raise(SIGKILL); };
    if (k.before) {
      sys.before(k.op, k.nth, hook);
    } else {
      sys.after(k.op, k.nth, hook);
    }
    auto o = opts;
    o.syscalls = sys.get();
    Region r = Region::create_or_join(o);
    return 50;  // the kill point was never reached
  });
  const int status = test::wait_child(pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
}

TEST_P(CreatorKilled, CleanRemovesTheLeftoverAndALaterCreateSucceeds) {
  const KillPoint k = GetParam();
  const TempDir dir;
  auto opts = small_options(dir.path(), "killed", 0);
  opts.layout.num_chunks = 6;

  // 1. Killed; `clean` removes what is left.
  run_creator_killed_at(k, opts);
  EXPECT_EQ(dir.entries().size(), k.leaves_file ? 1U : 0U);
  if (k.leaves_file) {
    const auto listed = list_regions(dir.path());
    ASSERT_EQ(listed.size(), 1U);
    EXPECT_TRUE(listed[0].stale);
    const auto cleaned = clean_regions(dir.path());
    EXPECT_EQ(cleaned.removed.size(), 1U);
    EXPECT_TRUE(dir.entries().empty());
  }

  // 2. Killed again; the next create with the same id reclaims and succeeds.
  run_creator_killed_at(k, opts);
  auto joiner_opts = opts;
  joiner_opts.rank = 1;
  Region r = Region::create_or_join(joiner_opts);
  EXPECT_EQ(r.role(), RegionRole::kCreator);
  r.slot(5)[0] = std::byte{1};
  r.close();
  EXPECT_TRUE(dir.entries().empty());
}

INSTANTIATE_TEST_SUITE_P(
    Points, CreatorKilled,
    ::testing::Values(KillPoint{"unnamed_file_built", Op::kLinkat, 1, true, false},
                      KillPoint{"just_published", Op::kLinkat, 1, false, true},
                      KillPoint{"just_mapped", Op::kMmap, 1, false, true},
                      KillPoint{"before_ready", Op::kPwrite, 3, true, true},
                      KillPoint{"populate_probe", Op::kMadvise, 1, true, true},
                      KillPoint{"populate_rows", Op::kMadvise, 4, true, true},
                      KillPoint{"before_teardown", Op::kMunmap, 1, true, true}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

// A child creator that stops after publishing, just before mapping (the header still says
// "creating"); the parent decides what happens to it.
struct StalledCreator {
  pid_t pid = -1;
  explicit StalledCreator(const RegionOptions& opts) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    pid = test::fork_child([&] {
      ::close(fds[0]);
      FaultSyscalls sys;
      sys.before(Op::kMmap, 1, [&] {
        const char c = 'x';
        (void)!::write(fds[1], &c, 1);
        for (;;) ::pause();
      });
      auto o = opts;
      o.syscalls = sys.get();
      Region r = Region::create_or_join(o);
      return 0;
    });
    ::close(fds[1]);
    char c = 0;
    const bool stalled = ::read(fds[0], &c, 1) == 1;
    ::close(fds[0]);
    if (!stalled) throw std::runtime_error("creator did not reach mmap");
  }
  void kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      test::wait_child(pid);
      pid = -1;
    }
  }
  ~StalledCreator() { kill(); }
};

TEST(JoinerWait, TimesOutNamingPathStateAndSeconds) {
  const TempDir dir;
  auto opts = small_options(dir.path(), "slow");
  StalledCreator creator(opts);
  auto joiner = opts;
  joiner.rank = 1;
  joiner.join_timeout = std::chrono::milliseconds(300);
  const auto fds = test::fd_snapshot();
  const auto maps = test::maps_snapshot();
  const auto t0 = std::chrono::steady_clock::now();
  const Error e = expect_error([&] { (void)Region::create_or_join(joiner); });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e.code(), ErrorCode::kTimeout);
  EXPECT_THAT(e.what(), AllOf(HasSubstr((dir.path() / "kvoffload_slow.region").string()),
                              HasSubstr("'ready'"), HasSubstr("'creating'"), HasSubstr(" s ")));
  // It waited the whole join_timeout, not less (a lower bound no machine can break), and not
  // without end (10 s is 33 times the timeout); the seconds it reports are the ones it waited.
  EXPECT_GE(took, 0.3) << "gave up before join_timeout";
  EXPECT_LT(took, 10.0) << "waited far past join_timeout";
  std::smatch m;
  const std::string what = e.what();
  ASSERT_TRUE(std::regex_search(what, m, std::regex(R"(after ([0-9.]+) s \(join_timeout\))")))
      << what;
  const double reported = std::stod(m[1]);
  EXPECT_GE(reported, 0.3);
  EXPECT_LE(reported, took + 0.001);
  EXPECT_EQ(test::fd_snapshot(), fds);
  EXPECT_EQ(test::maps_snapshot(), maps);
  // The stalled stub is in use: clean keeps it.
  EXPECT_EQ(clean_regions(dir.path()).kept.size(), 1U);
  creator.kill();
  Region r = Region::create_or_join(joiner);
  EXPECT_EQ(r.role(), RegionRole::kCreator);
}

TEST(JoinerWait, DeadCreatorIsDetectedAndTheJoinerTakesOver) {
  const TempDir dir;
  auto opts = small_options(dir.path(), "dies");
  StalledCreator creator(opts);
  auto joiner = opts;
  joiner.rank = 1;
  joiner.join_timeout = std::chrono::seconds(120);  // far longer than the test's own timeout
  auto result = std::async(std::launch::async, [&] { return Region::create_or_join(joiner); });
  EXPECT_EQ(result.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout);  // waiting
  creator.kill();
  Region r = result.get();
  EXPECT_EQ(r.role(), RegionRole::kCreator);
}

TEST(JoinerWait, FailedCreatorProbeIsReportedAndReleasesEverything) {
  const TempDir dir;
  auto opts = small_options(dir.path(), "probe");
  StalledCreator creator(opts);
  FaultSyscalls sys;
  sys.fail(Op::kFcntlLock, 1, ENOLCK);
  auto joiner = opts;
  joiner.rank = 1;
  joiner.syscalls = sys.get();
  const auto fds = test::fd_snapshot();
  const Error e = expect_error([&] { (void)Region::create_or_join(joiner); });
  EXPECT_EQ(e.call(), "fcntl");
  EXPECT_EQ(e.sys_errno(), ENOLCK);
  EXPECT_EQ(test::fd_snapshot(), fds);
}

// A real tmpfs of 4 MiB in a private mount namespace (needs CAP_SYS_ADMIN; skipped, with the
// failing step and errno, otherwise).
TEST(SmallTmpfs, OversizedRegionFailsAtCreationWithTheCapacityMessage) {
  const auto result = test::run_on_private_tmpfs("4m", [](const std::filesystem::path& mnt) {
    auto opts = small_options(mnt, "big", 0);
    opts.layout = {.num_chunks = 256, .slot_bytes = 16384, .world_size = 2};  // 8 MiB
    try {
      (void)Region::create_or_join(opts);
      return 1;
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (e.code() != ErrorCode::kCapacity) return 2;
      for (const char* s :
           {"--shm-size", "--ipc=host", "smaller region", "num_chunks=256", "slot_bytes=16384",
            "world_size", "free space of", "kvoffload_big.region"}) {
        if (msg.find(s) == std::string::npos) {
          (void)std::fprintf(stderr, "missing '%s' in: %s\n", s, msg.c_str());
          return 3;
        }
      }
    }
    if (!std::filesystem::is_empty(mnt)) return 4;
    // One that fits is created.
    opts.layout.num_chunks = 16;
    Region ok = Region::create_or_join(opts);
    if (ok.role() != RegionRole::kCreator) return 5;
    ok.close();
    if (!std::filesystem::is_empty(mnt)) return 6;
    return 0;
  });
  if (!result.skip_reason.empty()) KVO_SKIP("no-mount-namespace") << result.skip_reason;
  ASSERT_TRUE(WIFEXITED(result.wait_status)) << result.wait_status;
  EXPECT_EQ(result.exit_code, 0);
}

}  // namespace
}  // namespace kvoffload
