// Bring-up: who allocates the region's pages (every mapper its own columns, never the creator the
// whole file), the capacity race between "no file" and the link election, a tmpfs that fills after
// the capacity check (never a SIGBUS, on both populate paths), and slot alignment in a live region.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/platform.hpp>
#include <kvoffload/region.hpp>

#include "fault_syscalls.hpp"
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

constexpr int kSkip = 77;

std::uint64_t allocated_bytes(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_blocks) * 512;
}

std::vector<std::string> entries(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename());
  return names;
}

// Runs `fn(dir)` in a child with a private mount namespace and a tmpfs of `size` mounted on a
// fresh directory; returns the child's wait status. The child exits kSkip without CAP_SYS_ADMIN.
int in_small_tmpfs(const char* size, const std::function<int(const std::filesystem::path&)>& fn) {
  return test::wait_child(test::fork_child([&] {
    if (::unshare(CLONE_NEWNS) != 0) return kSkip;
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return kSkip;
    const TempDir dir("/tmp");
    const std::string opts = std::string("size=") + size + ",mode=0700";
    if (::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, opts.c_str()) != 0) return kSkip;
    struct Unmount {  // on every way out, so that TempDir can remove the mount point
      const std::filesystem::path& path;
      ~Unmount() { (void)::umount2(path.c_str(), MNT_DETACH); }
    } unmount{dir.path()};
    return fn(dir.path());
  }));
}

#define EXPECT_CHILD_OK(status)                                                               \
  do {                                                                                        \
    const int st_ = (status);                                                                 \
    ASSERT_TRUE(WIFEXITED(st_)) << "child died" << (WIFSIGNALED(st_) ? " with signal " : " ") \
                                << (WIFSIGNALED(st_) ? WTERMSIG(st_) : st_);                  \
    if (WEXITSTATUS(st_) == kSkip)                                                            \
      KVO_SKIP("no-mount-namespace") << "no permission for a private mount namespace";        \
    EXPECT_EQ(WEXITSTATUS(st_), 0);                                                           \
  } while (0)

// Fills `dir`'s tmpfs with a file of `bytes` (allocated), leaving the rest free.
bool fill(const std::filesystem::path& dir, std::uint64_t bytes) {
  const std::string path = (dir / "filler").string();
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0;
  ::close(fd);
  return ok;
}

// Note [Allocation by populate]: the creator never allocates the whole region; every ranked
// mapper allocates exactly its own columns.
TEST(Bringup, EachRankAllocatesOnlyItsOwnColumns) {
  const TempDir dir;
  const std::uint64_t page = platform::page_size();
  auto opts = small_options(dir.path(), "cols", 0);
  // 4 ranks x 2 pages: each rank's slots are whole pages, so the allocations do not overlap.
  opts.layout = {.num_chunks = 8, .slot_bytes = 2 * page, .world_size = 4};
  FaultSyscalls sys;
  opts.syscalls = sys.get();
  Region r0 = Region::create_or_join(opts);
  ASSERT_EQ(r0.role(), RegionRole::kCreator);
  EXPECT_EQ(sys.count(Op::kFallocate), 0);  // no whole-file fallocate
  // The header area (header page, live statistics page) and rank 0's 8 x 2 pages, nothing of the
  // other ranks.
  const std::uint64_t header = 2 * page;
  EXPECT_EQ(allocated_bytes(r0.path()), header + 8 * 2 * page);
  auto o2 = opts;
  o2.syscalls = nullptr;
  o2.rank = 2;
  Region r2 = Region::create_or_join(o2);
  EXPECT_EQ(allocated_bytes(r0.path()), header + 2 * 8 * 2 * page);
  o2.rank = 1;
  Region r1 = Region::create_or_join(o2);
  o2.rank = 3;
  Region r3 = Region::create_or_join(o2);
  EXPECT_EQ(allocated_bytes(r0.path()), header + r0.geometry().data_bytes());
}

// A mapper that does not pre-fault still allocates its columns (fallocate, one call per row), so a
// later first touch cannot meet a full tmpfs.
TEST(Bringup, MapperWithoutPopulateAllocatesItsColumns) {
  const TempDir dir;
  const std::uint64_t page = platform::page_size();
  auto opts = small_options(dir.path(), "nopop", 1);
  opts.layout = {.num_chunks = 6, .slot_bytes = page, .world_size = 2};
  opts.populate = false;
  FaultSyscalls sys;
  opts.syscalls = sys.get();
  Region r = Region::create_or_join(opts);
  EXPECT_EQ(sys.count(Op::kMadvise), 0);
  EXPECT_EQ(sys.count(Op::kFallocate), 6);
  EXPECT_EQ(allocated_bytes(r.path()), 2 * page + 6 * page);  // header area + 6 slots
  EXPECT_EQ(r.populate_report().method, PopulateMethod::kNone);
}

TEST(Bringup, AllocationFailureWithoutPopulateIsACapacityErrorAndLeavesNothing) {
  const TempDir dir;
  auto opts = small_options(dir.path(), "nopop-fail", 0);
  opts.populate = false;
  FaultSyscalls sys;
  sys.fail(Op::kFallocate, 3, ENOSPC);
  opts.syscalls = sys.get();
  const auto fds = test::fd_snapshot();
  const Error e = expect_error([&] { (void)Region::create_or_join(opts); });
  EXPECT_EQ(e.code(), ErrorCode::kCapacity) << e.what();
  EXPECT_EQ(e.call(), "fallocate");
  EXPECT_THAT(e.what(),
              AllOf(HasSubstr("ran out of space after the creator's capacity check"),
                    HasSubstr("still needed"), HasSubstr("shortfall"), HasSubstr("--shm-size")));
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(test::fd_snapshot(), fds);
}

// MADV_POPULATE_WRITE reports a page it could not allocate as EFAULT (the fault's SIGBUS) or
// ENOMEM (a cgroup limit): both are the capacity error, with the shortfall, never kSystem.
TEST(Bringup, PopulateAllocationFailureIsACapacityError) {
  for (const int err : {EFAULT, ENOMEM}) {
    SCOPED_TRACE(errno_name(err));
    const TempDir dir;
    auto opts = small_options(dir.path(), "popfail", 0);
    FaultSyscalls sys;
    sys.fail(Op::kMadvise, 2, err);  // the first row after the probe
    opts.syscalls = sys.get();
    const Error e = expect_error([&] { (void)Region::create_or_join(opts); });
    EXPECT_EQ(e.code(), ErrorCode::kCapacity) << e.what();
    EXPECT_EQ(e.sys_errno(), err);
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr("madvise could not allocate"), HasSubstr(dir.path().string()),
                      HasSubstr("still needed"), HasSubstr("shortfall")));
    EXPECT_TRUE(dir.entries().empty());
  }
}

// The race of issue 9: a candidate saw no file, and before its capacity check the winner
// published and allocated the region, leaving too little space for a second copy. The loser must
// join, not fail with a capacity error.
TEST(Bringup, LoserOfTheCapacityRaceJoinsACompleteRegion) {
  EXPECT_CHILD_OK(in_small_tmpfs("4m", [](const std::filesystem::path& dir) {
    auto opts = small_options(dir, "race", 0);
    opts.layout = {.num_chunks = 192, .slot_bytes = 8192, .world_size = 2};  // 3 MiB of data
    std::optional<Region> winner;
    FaultSyscalls sys;
    sys.before(Op::kFstatvfs, 1, [&] {
      auto w = opts;
      w.rank = std::nullopt;  // unranked: populates (allocates) the whole region
      winner.emplace(Region::create_or_join(w));
    });
    auto loser_opts = opts;
    loser_opts.rank = 1;
    loser_opts.syscalls = sys.get();
    try {
      Region loser = Region::create_or_join(loser_opts);
      if (!winner || winner->role() != RegionRole::kCreator) return 2;
      if (loser.role() != RegionRole::kJoiner) return 3;
      if (sys.count(Op::kFstatvfs) != 1) return 4;  // the check ran, and failed, after the winner
      loser.slot(5)[0] = std::byte{7};
      if (winner->slot(5, 1)[0] != std::byte{7}) return 5;
    } catch (const Error& e) {
      (void)std::fprintf(stderr, "loser failed: %s\n", e.what());
      return 1;
    }
    winner.reset();
    return entries(dir).empty() ? 0 : 6;
  }));
}

// The tmpfs fills after the creator's check, while this rank populates: a capacity error naming
// the shortfall, no SIGBUS, nothing left, and the region can be created once there is space.
// `fallback`: MADV_POPULATE_WRITE refused (EINVAL, kernels < 5.14): the page-touch fallback must
// allocate each range before touching it, or it would die of SIGBUS here.
class FillsAfterCheck : public ::testing::TestWithParam<bool> {};

TEST_P(FillsAfterCheck, CapacityErrorNamesTheShortfallAndNoSignal) {
  const bool fallback = GetParam();
  EXPECT_CHILD_OK(in_small_tmpfs("4m", [fallback](const std::filesystem::path& dir) {
    auto opts = small_options(dir, "fill", std::nullopt);
    opts.layout = {.num_chunks = 96, .slot_bytes = 32768, .world_size = 1};  // 3 MiB
    FaultSyscalls sys;
    if (fallback) sys.fail(Op::kMadvise, 1, EINVAL);
    // Someone takes 2 MiB after the check passed: our populate runs into a full tmpfs.
    sys.after(Op::kLinkat, 1, [&] { (void)fill(dir, 2 << 20); });
    opts.syscalls = sys.get();
    try {
      (void)Region::create_or_join(opts);
      return 1;
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (e.code() != ErrorCode::kCapacity) {
        (void)std::fprintf(stderr, "wrong code: %s\n", msg.c_str());
        return 2;
      }
      if (e.call() != (fallback ? "fallocate" : "madvise")) return 3;
      for (const char* s : {"ran out of space after the creator's capacity check", "still needed",
                            "shortfall", "bytes free", "--shm-size", "--ipc=host"}) {
        if (msg.find(s) == std::string::npos) {
          (void)std::fprintf(stderr, "missing '%s' in: %s\n", s, msg.c_str());
          return 4;
        }
      }
      if (msg.find(dir.string()) == std::string::npos) return 5;
    }
    const auto left = entries(dir);
    if (left.size() != 1 || left[0] != "filler") return 6;  // the region is gone
    std::filesystem::remove(dir / "filler");
    opts.syscalls = nullptr;
    Region ok = Region::create_or_join(opts);  // reclaimable: nothing stands in the way
    return ok.role() == RegionRole::kCreator ? 0 : 7;
  }));
}

INSTANTIATE_TEST_SUITE_P(Paths, FillsAfterCheck, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "fallback" : "madvise"; });

// Note [Slot alignment] in a live region: every slot of every rank is aligned, and a joiner with
// another alignment is refused naming both values.
TEST(Bringup, EverySlotOfALiveRegionIsAligned) {
  const TempDir dir;
  auto opts = small_options(dir.path(), "align", 0);
  opts.layout = {.num_chunks = 6, .slot_bytes = 1000, .world_size = 4};
  {
    Region r = Region::create_or_join(opts);  // the default alignment
    EXPECT_EQ(r.geometry().slot_align(), 256U);
    for (std::uint64_t c = 0; c < 6; ++c) {
      for (std::uint32_t k = 0; k < 4; ++k) {
        const auto s = r.slot(c, k);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s.data()) % 256, 0U) << c << "/" << k;
        EXPECT_EQ(s.size(), 1000U);
      }
    }
  }
  // A region created with another alignment refuses a joiner with the default, naming both.
  opts.layout.slot_align = 1024;
  Region r = Region::create_or_join(opts);
  EXPECT_EQ(r.geometry().slot_stride(), 1024U);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r.slot(5, 3).data()) % 1024, 0U);
  auto other = opts;
  other.rank = 1;
  other.layout.slot_align = 256;
  const Error e = expect_error([&] { (void)Region::create_or_join(other); });
  EXPECT_EQ(e.code(), ErrorCode::kMismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("created with slot_align=1024"),
                              HasSubstr("asks for slot_align=256"), HasSubstr(r.path().string())));
}

}  // namespace
}  // namespace kvoffload
