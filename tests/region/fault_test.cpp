// Fault injection through the Syscalls seam on the create, join, populate and teardown paths.
// Each case checks that the caller sees the original error and that afterwards the directory holds
// no file and the process has the same open descriptors and file-backed mappings as before.
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "fault_syscalls.hpp"
#include "region_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload {
namespace {

using test::expect_error;
using test::FaultSyscalls;
using test::fd_snapshot;
using test::maps_snapshot;
using test::Op;
using test::small_options;
using test::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct CreateFault {
  Op op;
  int nth;
  int err;
  ErrorCode code;
};

std::string fault_name(const CreateFault& f) {
  return std::string(test::op_name(f.op)) + "_" + std::to_string(f.nth) + "_" + errno_name(f.err);
}

class CreatePathFault : public ::testing::TestWithParam<CreateFault> {};

TEST_P(CreatePathFault, CallerSeesTheOriginalErrorAndNothingIsLeft) {
  const CreateFault f = GetParam();
  const TempDir dir;
  FaultSyscalls sys;
  sys.fail(f.op, f.nth, f.err);
  auto opts = small_options(dir.path(), "fault", 1);
  opts.syscalls = sys.get();
  const auto fds = fd_snapshot();
  const auto maps = maps_snapshot();
  const Error e = expect_error([&] { (void)Region::create_or_join(opts); });
  EXPECT_EQ(sys.faults_fired(), 1);
  EXPECT_EQ(e.code(), f.code) << e.what();
  EXPECT_EQ(e.sys_errno(), f.err) << e.what();
  EXPECT_EQ(e.call(), test::op_name(f.op)) << e.what();
  EXPECT_THAT(e.what(), HasSubstr(errno_name(f.err)));
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(fd_snapshot(), fds);
  EXPECT_EQ(maps_snapshot(), maps);
}

// Call order on the create path: open(shm dir), open(path: ENOENT), fstatvfs, open(O_TMPFILE),
// fchmod, flock(SH), fcntl(OFD creator lock), pwrite(header), fcntl(role lock), pwrite(owner
// record), fcntl("recorded" lock), ftruncate, fstat, linkat, mmap, pwrite(state), fcntl(unlock),
// madvise(probe), madvise(rows)..., then teardown. There is no fallocate: populate allocates (Note
// [Allocation by populate]).
INSTANTIATE_TEST_SUITE_P(
    EachStep, CreatePathFault,
    ::testing::Values(CreateFault{Op::kOpenat, 1, EACCES, ErrorCode::kSystem},
                      CreateFault{Op::kOpenat, 2, EIO, ErrorCode::kSystem},
                      CreateFault{Op::kFstatvfs, 1, EIO, ErrorCode::kSystem},  // capacity query
                      CreateFault{Op::kOpenat, 3, EOPNOTSUPP, ErrorCode::kSystem},  // O_TMPFILE
                      CreateFault{Op::kFchmod, 1, EPERM, ErrorCode::kSystem},
                      CreateFault{Op::kFlock, 1, ENOLCK, ErrorCode::kSystem},
                      CreateFault{Op::kFcntlLock, 1, ENOLCK, ErrorCode::kSystem},
                      CreateFault{Op::kPwrite, 1, EIO, ErrorCode::kSystem},        // header
                      CreateFault{Op::kFcntlLock, 2, ENOLCK, ErrorCode::kSystem},  // role
                      CreateFault{Op::kPwrite, 2, EIO, ErrorCode::kSystem},        // owner record
                      CreateFault{Op::kFcntlLock, 3, ENOLCK, ErrorCode::kSystem},  // "recorded"
                      CreateFault{Op::kFtruncate, 1, EFBIG, ErrorCode::kSystem},
                      CreateFault{Op::kFstat, 1, EIO, ErrorCode::kSystem},
                      CreateFault{Op::kLinkat, 1, EACCES, ErrorCode::kSystem},  // publish
                      CreateFault{Op::kMmap, 1, ENOMEM, ErrorCode::kSystem},
                      CreateFault{Op::kPwrite, 3, EIO, ErrorCode::kSystem},        // state "ready"
                      CreateFault{Op::kMadvise, 1, EIO, ErrorCode::kSystem},       // probe
                      CreateFault{Op::kMadvise, 1, EFAULT, ErrorCode::kCapacity},  // probe: full
                      CreateFault{Op::kMadvise, 3, EIO, ErrorCode::kSystem},       // a later row
                      CreateFault{Op::kMadvise, 3, EFAULT, ErrorCode::kCapacity}
                      // a later row: full
                      ),
    [](const auto& param_info) { return fault_name(param_info.param); });

TEST(CreatePathFault, CleanupFailureDoesNotMaskTheOriginalError) {
  const TempDir dir;
  FaultSyscalls sys;
  sys.fail(Op::kMmap, 1, ENOMEM);
  sys.fail(Op::kUnlinkat, 1, EIO, /*after_real=*/true);
  sys.fail(Op::kClose, 1, EBADF, /*after_real=*/true);
  auto opts = small_options(dir.path(), "mask");
  opts.syscalls = sys.get();
  const auto fds = fd_snapshot();
  const Error e = expect_error([&] { (void)Region::create_or_join(opts); });
  EXPECT_EQ(e.call(), "mmap");
  EXPECT_EQ(e.sys_errno(), ENOMEM);
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(fd_snapshot(), fds);
}

TEST(CreatePathFault, LosingThePublishRaceJoinsTheWinner) {
  const TempDir dir;
  FaultSyscalls sys;
  std::optional<Region> winner;
  // Someone else publishes between our capacity check and our linkat.
  sys.before(Op::kLinkat, 1,
             [&] { winner.emplace(Region::create_or_join(small_options(dir.path(), "race", 0))); });
  auto opts = small_options(dir.path(), "race", 1);
  opts.syscalls = sys.get();
  Region loser = Region::create_or_join(opts);
  EXPECT_EQ(winner->role(), RegionRole::kCreator);
  EXPECT_EQ(loser.role(), RegionRole::kJoiner);
  EXPECT_EQ(sys.count(Op::kFallocate), 0);  // the loser never allocated
  winner->slot(3)[0] = std::byte{9};
  EXPECT_EQ(loser.slot(3, 0)[0], std::byte{9});
}

// Every call of a create_or_join, failed in turn (EIO): either the call tolerates it (a failed
// creator-lock release, an unreadable cgroup file) and the region works, or the caller gets that
// EIO; either way nothing is left behind.
TEST(CreatePathFault, EveryCallFailedInTurn) {
  const TempDir dir;
  int total = 0;
  {
    FaultSyscalls probe;
    auto opts = small_options(dir.path(), "sweep", 1);
    opts.layout.num_chunks = 2;
    opts.syscalls = probe.get();
    Region r = Region::create_or_join(opts);
    total = static_cast<int>(probe.calls().size());
  }
  ASSERT_TRUE(dir.entries().empty());
  ASSERT_GT(total, 10);
  const auto fds = fd_snapshot();
  const auto maps = maps_snapshot();
  for (int i = 1; i <= total; ++i) {
    SCOPED_TRACE("failing call " + std::to_string(i));
    FaultSyscalls sys;
    sys.fail_call(i, EIO);
    auto opts = small_options(dir.path(), "sweep", 1);
    opts.layout.num_chunks = 2;
    opts.syscalls = sys.get();
    try {
      Region r = Region::create_or_join(opts);
      const Op op = sys.calls()[static_cast<std::size_t>(i - 1)];
      EXPECT_TRUE(op == Op::kFcntlLock || op == Op::kReadFile) << test::op_name(op);
      EXPECT_TRUE(r.close());
    } catch (const Error& e) {
      EXPECT_EQ(e.sys_errno(), EIO) << e.what();
    }
    EXPECT_TRUE(dir.entries().empty());
    EXPECT_EQ(fd_snapshot(), fds);
    EXPECT_EQ(maps_snapshot(), maps);
  }
}

// The join path: a region created (and held) by this process; a joiner failed at each call.
TEST(JoinPathFault, EveryCallFailedInTurn) {
  const TempDir dir;
  Region owner = Region::create_or_join(small_options(dir.path(), "join", 0));
  int total = 0;
  {
    FaultSyscalls probe;
    auto opts = small_options(dir.path(), "join", 1);
    opts.syscalls = probe.get();
    Region r = Region::create_or_join(opts);
    EXPECT_EQ(r.role(), RegionRole::kJoiner);
    total = static_cast<int>(probe.calls().size());
  }
  const auto fds = fd_snapshot();
  const auto maps = maps_snapshot();
  std::map<Op, int> failed_ops;
  for (int i = 1; i <= total; ++i) {
    SCOPED_TRACE("failing call " + std::to_string(i));
    FaultSyscalls sys;
    sys.fail_call(i, EIO);
    auto opts = small_options(dir.path(), "join", 1);
    opts.syscalls = sys.get();
    const Op op = [&] {
      try {
        Region r = Region::create_or_join(opts);
        ADD_FAILURE() << "joined despite a failed call";
      } catch (const Error& e) {
        EXPECT_EQ(e.sys_errno(), EIO) << e.what();
      }
      return sys.calls()[static_cast<std::size_t>(i - 1)];
    }();
    ++failed_ops[op];
    EXPECT_EQ(fd_snapshot(), fds);
    EXPECT_EQ(maps_snapshot(), maps);
    EXPECT_EQ(dir.entries().size(), 1U);  // the owner's region is untouched
  }
  // The sweep covered the join path's system calls.
  for (Op op : {Op::kOpenat, Op::kFstat, Op::kFlock, Op::kFstatat, Op::kPread, Op::kFcntlLock,
                Op::kPwrite, Op::kMmap, Op::kMadvise}) {
    EXPECT_GT(failed_ops[op], 0) << test::op_name(op);
  }
  EXPECT_EQ(owner.role(), RegionRole::kCreator);
  owner.close();
  EXPECT_TRUE(dir.entries().empty());
}

struct TeardownFault {
  Op op;
  bool file_stays;  // the step that failed was the unlink decision itself
};

class TeardownPathFault : public ::testing::TestWithParam<TeardownFault> {};

// A failed teardown step is reported (close() returns false) and every later step still runs.
TEST_P(TeardownPathFault, EveryStepStillRuns) {
  const TeardownFault f = GetParam();
  const TempDir dir;
  const auto fds = fd_snapshot();
  const auto maps = maps_snapshot();
  FaultSyscalls sys;
  auto opts = small_options(dir.path(), "down");
  opts.syscalls = sys.get();
  Region r = Region::create_or_join(opts);
  // The failure is reported after the real call ran (a close that closes and says EIO), so a
  // later leak can only come from a skipped step.
  sys.fail(f.op, sys.count(f.op) + 1, EIO, /*after_real=*/true);
  EXPECT_FALSE(r.close());
  EXPECT_EQ(sys.faults_fired(), 1);
  EXPECT_EQ(fd_snapshot(), fds);
  EXPECT_EQ(maps_snapshot(), maps);
  if (f.file_stays) {
    // A failed "am I last?" answer never unlinks; the file is stale and clean removes it.
    const auto listed = list_regions(dir.path());
    ASSERT_EQ(listed.size(), 1U);
    EXPECT_TRUE(listed[0].stale);
    EXPECT_EQ(clean_regions(dir.path()).removed.size(), 1U);
  }
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_TRUE(r.close());
}

INSTANTIATE_TEST_SUITE_P(
    EachStep, TeardownPathFault,
    ::testing::Values(TeardownFault{Op::kMunmap, false},
                      TeardownFault{Op::kFcntlLock, false},  // releasing the role
                      TeardownFault{Op::kPwrite, false},     // clearing the owner record
                      TeardownFault{Op::kFlock, true}, TeardownFault{Op::kFstatat, true},
                      TeardownFault{Op::kUnlinkat, false}, TeardownFault{Op::kClose, false}),
    [](const auto& param_info) { return std::string(test::op_name(param_info.param.op)); });

TEST(TeardownPathFault, UnlinkFailureLeavesAStaleFileThatTheNextCreateReclaims) {
  const TempDir dir;
  FaultSyscalls sys;
  auto opts = small_options(dir.path(), "unl");
  opts.syscalls = sys.get();
  Region r = Region::create_or_join(opts);
  sys.fail(Op::kUnlinkat, 1, EROFS);  // before the real call: the file stays
  EXPECT_FALSE(r.close());
  ASSERT_EQ(dir.entries().size(), 1U);
  Region again = Region::create_or_join(small_options(dir.path(), "unl"));
  EXPECT_EQ(again.role(), RegionRole::kCreator);
}

// A capacity shortfall is refused before anything is visible; a memory cgroup limit lower than
// the free space is what the check uses, and the message says so.
TEST(Capacity, CgroupLimitLowerThanFreeSpaceIsUsedAndNamed) {
  const TempDir dir;
  struct Canned {
    Syscalls table = real_syscalls();
  } canned;
  canned.table.read_file = [](void*, const char* path, std::string* out) {
    const std::string p = path;
    if (p == "/proc/self/cgroup") {
      *out = "0::/ctr\n";
      return 0;
    }
    if (p == "/sys/fs/cgroup/ctr/memory.max") {
      *out = "65536\n";
      return 0;
    }
    if (p == "/sys/fs/cgroup/ctr/memory.current") {
      *out = "0\n";
      return 0;
    }
    if (p.rfind("/sys/fs/cgroup", 0) == 0) {
      errno = ENOENT;
      return -1;
    }
    return real_syscalls().read_file(nullptr, path, out);
  };
  auto opts = small_options(dir.path(), "cg");
  opts.layout = {.num_chunks = 64, .slot_bytes = 4096, .world_size = 1};
  opts.syscalls = &canned.table;
  const auto fds = fd_snapshot();
  const Error e = expect_error([&] { (void)Region::create_or_join(opts); });
  EXPECT_EQ(e.code(), ErrorCode::kCapacity);
  EXPECT_THAT(e.what(),
              AllOf(HasSubstr("memory cgroup limit"), HasSubstr("65536 bytes are available"),
                    HasSubstr(std::to_string(2 * 4096 + 64 * 4096)),  // header + live stats + data
                    HasSubstr("num_chunks=64"), HasSubstr("slot_bytes=4096"),
                    HasSubstr("--shm-size"), HasSubstr("--ipc=host"), HasSubstr("smaller region"),
                    HasSubstr((dir.path() / "kvoffload_cg.region").string())));
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(fd_snapshot(), fds);
  // A region that fits under the limit is created.
  opts.layout.num_chunks = 8;
  EXPECT_EQ(Region::create_or_join(opts).role(), RegionRole::kCreator);
}

TEST(Capacity, JoinersDoNotCheckCapacity) {
  const TempDir dir;
  Region owner = Region::create_or_join(small_options(dir.path(), "cap"));
  FaultSyscalls sys;
  sys.fail(Op::kFstatvfs, 1, EIO);
  auto opts = small_options(dir.path(), "cap", 1);
  opts.syscalls = sys.get();
  Region joiner = Region::create_or_join(opts);
  EXPECT_EQ(joiner.role(), RegionRole::kJoiner);
  EXPECT_EQ(sys.count(Op::kFstatvfs), 0);
}

}  // namespace
}  // namespace kvoffload
