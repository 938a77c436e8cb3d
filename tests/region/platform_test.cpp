#include <sys/mman.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/platform.hpp>

#include "fault_syscalls.hpp"
#include "region/proc_locks.hpp"
#include "test_env.hpp"

namespace kvoffload {
namespace {

using test::FaultSyscalls;
using test::Op;
using test::TempDir;
using ::testing::HasSubstr;

// A table whose read_file serves canned file contents (ENOENT for anything else).
struct CannedFiles {
  std::map<std::string, std::string> files;
  Syscalls table = real_syscalls();
  CannedFiles() {
    table.context = this;
    table.read_file = [](void* ctx, const char* path, std::string* out) {
      auto& self = *static_cast<CannedFiles*>(ctx);
      const auto it = self.files.find(path);
      if (it == self.files.end()) {
        errno = ENOENT;
        return -1;
      }
      *out = it->second;
      return 0;
    };
  }
};

TEST(Platform, PageSizeIsTheSystemPage) {
  EXPECT_EQ(platform::page_size(), static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
}

TEST(Platform, FilesystemSpaceOfADirectory) {
  const TempDir dir;
  const auto space = platform::filesystem_space(dir.path());
  EXPECT_GT(space.total_bytes, 0U);
  EXPECT_LE(space.free_bytes, space.total_bytes);
}

TEST(Platform, FilesystemSpaceReportsTheFailingCall) {
  const TempDir dir;
  FaultSyscalls sys;
  sys.fail(Op::kFstatvfs, 1, EIO);
  try {
    (void)platform::filesystem_space(dir.path(), sys.get());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), EIO);
    EXPECT_EQ(e.call(), "fstatvfs");
    EXPECT_THAT(e.what(), HasSubstr(dir.path().string()));
  }
  EXPECT_THROW((void)platform::filesystem_space(dir.path() / "missing"), Error);
}

TEST(Platform, CgroupV2LimitIsTheLowestAlongThePath) {
  CannedFiles c;
  c.files["/proc/self/cgroup"] = "0::/kubepods/pod1/ctr\n";
  c.files["/sys/fs/cgroup/kubepods/pod1/ctr/memory.max"] = "max\n";
  c.files["/sys/fs/cgroup/kubepods/pod1/memory.max"] = "1073741824\n";
  c.files["/sys/fs/cgroup/kubepods/pod1/memory.current"] = "314572800\n";
  c.files["/sys/fs/cgroup/kubepods/pod1/memory.stat"] =
      "anon 1\ninactive_file 104857600\nactive_file 5\n";
  c.files["/sys/fs/cgroup/kubepods/memory.max"] = "4294967296\n";
  EXPECT_EQ(platform::memory_cgroup_limit(&c.table), 1073741824U);
  // 1 GiB − (300 MiB used − 100 MiB inactive file cache)
  EXPECT_EQ(platform::memory_cgroup_available(&c.table), 1073741824U - 209715200U);
}

TEST(Platform, CgroupV1UnlimitedIsNoLimit) {
  CannedFiles c;
  c.files["/proc/self/cgroup"] = "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n";
  c.files["/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"] = "9223372036854771712\n";
  c.files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712\n";
  EXPECT_EQ(platform::memory_cgroup_limit(&c.table), std::nullopt);
  EXPECT_EQ(platform::memory_cgroup_available(&c.table), std::nullopt);
  c.files["/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"] = "536870912\n";
  c.files["/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes"] = "136870912\n";
  c.files["/sys/fs/cgroup/memory/docker/abc/memory.stat"] =
      "cache 9\ntotal_inactive_file 36870912\n";
  EXPECT_EQ(platform::memory_cgroup_limit(&c.table), 536870912U);
  EXPECT_EQ(platform::memory_cgroup_available(&c.table), 536870912U - 100000000U);
}

TEST(Platform, NoCgroupFileMeansNoLimit) {
  CannedFiles c;
  EXPECT_EQ(platform::memory_cgroup_limit(&c.table), std::nullopt);
}

TEST(Platform, NumaNodesAreListed) {
  const auto nodes = platform::numa_nodes();
  ASSERT_FALSE(nodes.empty());
  EXPECT_GE(nodes.front(), 0);
}

TEST(Platform, MadvPopulateWriteProbeAgreesWithTheKernel) {
  // Probe independently: an anonymous page and the raw call.
  const std::size_t page = platform::page_size();
  void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const bool expected = ::madvise(p, page, 23) == 0;
  ::munmap(p, page);
  EXPECT_EQ(platform::madv_populate_write_supported(), expected);
}

TEST(ProcLocks, CountsGrantedFlocksOfOneInodeOnly) {
  const dev_t dev = makedev(0, 0x1a);
  const std::string text =
      "1: OFDLCK ADVISORY  WRITE -1 00:1a:77 0 63\n"
      "2: FLOCK  ADVISORY  READ 8378 00:1a:77 0 EOF\n"
      "2: -> FLOCK  ADVISORY  WRITE 8379 00:1a:77 0 EOF\n"
      "3: FLOCK  ADVISORY  READ 8380 00:1a:77 0 EOF\n"
      "4: FLOCK  ADVISORY  READ 8381 00:1b:77 0 EOF\n"
      "5: FLOCK  ADVISORY  READ 8382 00:1a:770 0 EOF\n"
      "6: POSIX  ADVISORY  WRITE 8383 00:1a:77 0 EOF\n";
  EXPECT_EQ(detail::count_flock_holders(text, dev, 77), 2U);
  EXPECT_EQ(detail::count_flock_holders(text, dev, 770), 1U);
  EXPECT_EQ(detail::count_flock_holders("", dev, 77), 0U);
}

// /proc/locks comes a page per read(), each page found again by position, so a lock taken or
// dropped elsewhere between two pages can repeat or drop another line: one read can count a
// holder twice. The holders are counted from a listing two whole reads agree on.
TEST(ProcLocks, HoldersAreCountedFromAListingTwoReadsAgreeOn) {
  struct Listings {
    std::vector<std::string> texts;
    std::size_t next = 0;
  } listings;
  const std::string torn =
      "1: FLOCK  ADVISORY  READ 8378 00:1a:77 0 EOF\n"
      "1: FLOCK  ADVISORY  READ 8378 00:1a:77 0 EOF\n";  // the page boundary repeated a line
  const std::string whole = "1: FLOCK  ADVISORY  READ 8378 00:1a:77 0 EOF\n";
  listings.texts = {torn, whole, whole};
  Syscalls sys = real_syscalls();
  sys.context = &listings;
  sys.read_file = [](void* c, const char* path, std::string* out) {
    auto& l = *static_cast<Listings*>(c);
    if (std::string(path) != "/proc/locks" || l.next >= l.texts.size()) {
      errno = EIO;
      return -1;
    }
    *out = l.texts[l.next++];
    return 0;
  };
  EXPECT_EQ(detail::flock_holders(sys, makedev(0, 0x1a), 77), 1U);
  EXPECT_EQ(listings.next, 3U);  // torn, whole, whole: the second and third agree

  listings.next = 0;
  listings.texts = {whole};  // the second read fails: an error, not a guess
  EXPECT_THROW(detail::flock_holders(sys, makedev(0, 0x1a), 77), Error);
}

}  // namespace
}  // namespace kvoffload
