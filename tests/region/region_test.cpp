#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

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
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Region, CreatorAndJoinerShareOneMapping) {
  const TempDir dir;
  Region a = Region::create_or_join(small_options(dir.path(), "eng", 0));
  Region b = Region::create_or_join(small_options(dir.path(), "eng", 1));
  EXPECT_EQ(a.role(), RegionRole::kCreator);
  EXPECT_EQ(b.role(), RegionRole::kJoiner);
  EXPECT_EQ(a.path(), dir.path() / "kvoffload_eng.region");
  EXPECT_EQ(a.geometry(), b.geometry());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % platform::page_size(), 0U);

  std::memset(a.slot(2).data(), 0x11, a.slot(2).size());
  std::memset(b.slot(2).data(), 0x22, b.slot(2).size());
  EXPECT_EQ(b.slot(2, 0)[2999], std::byte{0x11});
  EXPECT_EQ(a.slot(2, 1)[0], std::byte{0x22});
  EXPECT_EQ(a.row(2).size(), a.geometry().row_stride());
  EXPECT_EQ(a.row(2).data() + a.geometry().slot_stride(), a.slot(2, 1).data());

  struct stat st {};
  ASSERT_EQ(::stat(a.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600U);
  // Header page (header + readiness table), live statistics page, data.
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size),
            2 * platform::page_size() + a.geometry().data_bytes());
  EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512,
            a.geometry().data_bytes());  // allocated

  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].engine_id, "eng");
  EXPECT_EQ(listed[0].attached, 2U);
  EXPECT_FALSE(listed[0].stale);
  EXPECT_TRUE(listed[0].complete);
  ASSERT_TRUE(listed[0].geometry.has_value());
  EXPECT_EQ(*listed[0].geometry, a.geometry());

  EXPECT_TRUE(a.close());
  EXPECT_EQ(dir.entries().size(), 1U);  // b is still attached: the file stays
  EXPECT_EQ(b.slot(2, 0)[0], std::byte{0x11});
  EXPECT_TRUE(b.close());
  EXPECT_TRUE(dir.entries().empty());  // the last one out unlinks
  EXPECT_TRUE(b.close());              // idempotent
  EXPECT_FALSE(b.is_open());
  EXPECT_EQ(b.data(), nullptr);
}

TEST(Region, PopulateReportNamesMethodAndBytes) {
  const TempDir dir;
  auto opts = small_options(dir.path(), "pop", 1);
  opts.layout = {.num_chunks = 8, .slot_bytes = 3 * platform::page_size(), .world_size = 2};
  opts.populate_threads = 3;
  Region ranked = Region::create_or_join(opts);
  EXPECT_EQ(ranked.populate_report().method, PopulateMethod::kMadvise);
  EXPECT_EQ(ranked.populate_report().bytes, 8U * 3U * platform::page_size());
  EXPECT_EQ(to_string(ranked.populate_report().method), "madvise");

  auto unranked_opts = opts;
  unranked_opts.rank = std::nullopt;
  FaultSyscalls sys;
  sys.fail(Op::kMadvise, 1, EINVAL);
  unranked_opts.syscalls = sys.get();
  // The peer's bytes survive the fallback touch of a joiner.
  std::memset(ranked.slot(5).data(), 0x7E, ranked.slot(5).size());
  Region unranked = Region::create_or_join(unranked_opts);
  EXPECT_EQ(unranked.populate_report().method, PopulateMethod::kFallback);
  EXPECT_EQ(unranked.populate_report().bytes, unranked.geometry().data_bytes());
  for (const std::byte b : unranked.slot(5, 1)) ASSERT_EQ(b, std::byte{0x7E});
  EXPECT_THAT(expect_error([&] { (void)unranked.slot(0); }).code(), ErrorCode::kState);

  opts.populate = false;
  opts.rank = 0;  // rank 1 is held by `ranked`
  Region none = Region::create_or_join(opts);
  EXPECT_EQ(none.populate_report().method, PopulateMethod::kNone);
}

TEST(Region, InvalidInputIsRefusedBeforeAnySyscall) {
  const TempDir dir;
  FaultSyscalls sys;
  auto opts = small_options(dir.path(), "ok");
  opts.syscalls = sys.get();
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "a/b", "a b", "x\n", std::string(129, 'a')}) {
    opts.engine_id = bad;
    EXPECT_EQ(expect_error([&] { (void)Region::create_or_join(opts); }).code(),
              ErrorCode::kInvalidArgument)
        << bad;
  }
  opts.engine_id = std::string(128, 'a');
  opts.rank = 2;  // world_size is 2
  EXPECT_THAT(expect_error([&] { (void)Region::create_or_join(opts); }).what(),
              HasSubstr("rank 2"));
  opts.rank = 0;
  opts.layout.slot_bytes = 0;
  EXPECT_THAT(expect_error([&] { (void)Region::create_or_join(opts); }).what(),
              HasSubstr("slot_bytes is 0"));
  opts.layout.slot_bytes = 1;
  opts.populate_threads = 0;
  EXPECT_THAT(expect_error([&] { (void)Region::create_or_join(opts); }).what(),
              HasSubstr("populate_threads"));
  EXPECT_TRUE(sys.calls().empty());
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_THAT(expect_error([] { (void)region_path("/dev/shm", "a/../b"); }).what(),
              HasSubstr("'/'"));
}

TEST(Region, ShmDirMustBeADirectory) {
  const TempDir dir;
  { std::ofstream(dir.path() / "file") << "x"; }
  const Error e =
      expect_error([&] { (void)Region::create_or_join(small_options(dir.path() / "file", "e")); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("is not a directory"));
  EXPECT_EQ(expect_error([&] {
              (void)Region::create_or_join(small_options(dir.path() / "nope", "e"));
            }).code(),
            ErrorCode::kInvalidArgument);
}

TEST(Region, DefaultShmDirComesFromTheEnvironment) {
  const TempDir dir;
  ::setenv("KVOFFLOAD_SHM_DIR", dir.path().c_str(), 1);
  EXPECT_EQ(default_shm_dir(), dir.path());
  auto opts = small_options({}, "envdir");
  Region r = Region::create_or_join(opts);
  EXPECT_EQ(r.path().parent_path(), dir.path());
  ::unsetenv("KVOFFLOAD_SHM_DIR");
  EXPECT_EQ(default_shm_dir(), "/dev/shm");
}

TEST(Region, GeometryMismatchNamesBothValues) {
  const TempDir dir;
  Region a = Region::create_or_join(small_options(dir.path(), "geo"));
  auto other = small_options(dir.path(), "geo", 1);
  other.layout.slot_bytes = 4000;
  const auto before_fds = test::fd_snapshot();
  const Error e = expect_error([&] { (void)Region::create_or_join(other); });
  EXPECT_EQ(e.code(), ErrorCode::kMismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("slot_bytes=3000"), HasSubstr("slot_bytes=4000"),
                              HasSubstr(a.path().string())));
  EXPECT_EQ(test::fd_snapshot(), before_fds);
  other.layout.slot_bytes = 3000;
  other.layout.replicated = true;
  EXPECT_THAT(expect_error([&] { (void)Region::create_or_join(other); }).what(),
              HasSubstr("replicated=true"));
}

TEST(Region, StaleRegionIsReclaimedOnCreate) {
  const TempDir dir;
  const auto opts = small_options(dir.path(), "stale");
  test::make_stale_region(opts);
  auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_TRUE(listed[0].stale);
  EXPECT_EQ(listed[0].attached, 0U);
  Region r = Region::create_or_join(opts);
  EXPECT_EQ(r.role(), RegionRole::kCreator);
  r.close();
  EXPECT_TRUE(dir.entries().empty());
}

// Allocation apart from populate: with populate off, nothing touches the pages, so the blocks
// the file holds are what bring-up allocated. An unranked mapper may touch every page, so every
// page of the file must be allocated before the region is ready (docs/DESIGN.md §3.3).
TEST(Region, BringUpAllocatesEveryPageWithoutPopulate) {
  const TempDir dir;
  auto opts = small_options(dir.path(), "alloc", std::nullopt);
  opts.populate = false;
  Region r = Region::create_or_join(opts);
  EXPECT_EQ(r.populate_report().method, PopulateMethod::kNone);
  struct stat st {};
  ASSERT_EQ(::stat(r.path().c_str(), &st), 0);
  const std::uint64_t file_bytes = 2 * platform::page_size() + r.geometry().data_bytes();
  ASSERT_EQ(static_cast<std::uint64_t>(st.st_size), file_bytes);
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_blocks) * 512, file_bytes);  // tmpfs: whole pages
}

// The last process out unlinks the path only while it still names the inode it holds.
TEST(Region, CloseNeverRemovesANewerFileAtThePath) {
  const TempDir dir;
  Region r = Region::create_or_join(small_options(dir.path(), "swapclose"));
  const auto tmp = dir.path() / "newer";
  { std::ofstream(tmp) << "newer"; }
  std::filesystem::rename(tmp, r.path());
  EXPECT_TRUE(r.close());
  std::ifstream in(dir.path() / "kvoffload_swapclose.region");
  std::string content;
  in >> content;
  EXPECT_EQ(content, "newer");
}

// Stale reclaim: between the winning LOCK_EX on the stale file and its unlink, a live region
// replaces it at the path. The reclaim must leave it, and the caller joins the live one.
TEST(Region, StaleReclaimNeverRemovesANewerRegionAtThePath) {
  const TempDir dir;
  const TempDir elsewhere;
  const auto opts = small_options(dir.path(), "swapstale");
  test::make_stale_region(opts);
  const auto path = dir.path() / "kvoffload_swapstale.region";
  std::optional<Region> live;
  struct stat live_st {};
  FaultSyscalls sys;
  sys.before(Op::kFlock, 1, [&] {
    live.emplace(Region::create_or_join(small_options(elsewhere.path(), "swapstale")));
    ASSERT_EQ(::stat(live->path().c_str(), &live_st), 0);
    std::filesystem::rename(live->path(), path);
  });
  auto joiner_opts = small_options(dir.path(), "swapstale", 1);
  joiner_opts.syscalls = sys.get();
  Region r = Region::create_or_join(joiner_opts);
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(r.role(), RegionRole::kJoiner);
  struct stat now {};
  ASSERT_EQ(::stat(path.c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, live_st.st_ino);
  // One memory: what the live region writes, the joiner reads.
  std::memset(live->slot(1).data(), 0x6B, live->slot(1).size());
  EXPECT_EQ(r.slot(1, 0)[0], std::byte{0x6B});
  r.close();
  live->close();
}

TEST(Region, CleanRemovesOnlyStaleRegions) {
  const TempDir dir;
  test::make_stale_region(small_options(dir.path(), "dead1"));
  test::make_stale_region(small_options(dir.path(), "dead2"));
  Region live = Region::create_or_join(small_options(dir.path(), "live"));
  { std::ofstream(dir.path() / "unrelated.txt") << "x"; }

  FaultSyscalls sys;
  (void)list_regions(dir.path(), sys.get());
  EXPECT_EQ(sys.count(Op::kFlock), 0);  // list never locks

  auto one = clean_regions(dir.path(), std::string("dead2"));
  EXPECT_THAT(one.removed, ElementsAre(dir.path() / "kvoffload_dead2.region"));
  auto all = clean_regions(dir.path());
  EXPECT_THAT(all.removed, ElementsAre(dir.path() / "kvoffload_dead1.region"));
  EXPECT_THAT(all.kept, ElementsAre(live.path()));
  EXPECT_THAT(dir.entries(), ElementsAre("kvoffload_live.region", "unrelated.txt"));
  EXPECT_THAT(live.slot(0).size(), 3000U);
}

TEST(Region, CleanNeverRemovesANewerFileAtThePath) {
  const TempDir dir;
  const auto opts = small_options(dir.path(), "swap");
  test::make_stale_region(opts);
  const auto path = dir.path() / "kvoffload_swap.region";
  FaultSyscalls sys;
  // Between clean's open and its lock, the stale file is replaced by a newer one.
  sys.before(Op::kFlock, 1, [&] {
    const auto tmp = dir.path() / "newer";
    { std::ofstream(tmp) << "newer"; }
    ::chmod(tmp.c_str(), 0600);
    std::filesystem::rename(tmp, path);
  });
  const auto result = clean_regions(dir.path(), std::nullopt, sys.get());
  EXPECT_TRUE(result.removed.empty());
  std::ifstream in(path);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "newer");
}

TEST(Region, ListAndCleanReportFailingCalls) {
  const TempDir dir;
  test::make_stale_region(small_options(dir.path(), "lc"));
  FaultSyscalls list_sys;
  list_sys.fail(Op::kReadFile, 1, EACCES);  // /proc/locks
  const Error le = expect_error([&] { (void)list_regions(dir.path(), list_sys.get()); });
  EXPECT_EQ(le.call(), "read");
  EXPECT_THAT(le.what(), HasSubstr("/proc/locks"));
  FaultSyscalls clean_sys;
  clean_sys.fail(Op::kFlock, 1, ENOLCK);
  const Error ce =
      expect_error([&] { (void)clean_regions(dir.path(), std::nullopt, clean_sys.get()); });
  EXPECT_EQ(ce.call(), "flock");
  EXPECT_EQ(ce.sys_errno(), ENOLCK);
  EXPECT_EQ(dir.entries().size(), 1U);  // nothing removed on an unanswered question
  EXPECT_EQ(clean_regions(dir.path()).removed.size(), 1U);
}

// Note [Hostile entries] in listing.cpp: a FIFO, a directory, a symbolic link and a file without
// a region header, all named like regions, next to one real stale region. list and clean run in a
// child under alarm() first, so a blocking open fails the test in seconds instead of hanging it.
TEST(Region, HostileEntriesAreListedWithTheirReasonAndNeverRemoved) {
  const TempDir dir;
  test::make_stale_region(small_options(dir.path(), "real"));
  const auto p = [&](const std::string& id) {
    return dir.path() / ("kvoffload_" + id + ".region");
  };
  ASSERT_EQ(::mkfifo(p("fifo").c_str(), 0600), 0);
  std::filesystem::create_directory(p("dir"));
  { std::ofstream(dir.path() / "target") << "keep"; }
  std::filesystem::create_symlink(dir.path() / "target", p("link"));
  { std::ofstream(p("junk")) << std::string(8192, 'j'); }
  ASSERT_EQ(::chmod(p("junk").c_str(), 0600), 0);

  const pid_t child = test::fork_child([&] {
    ::alarm(30);  // a blocking open() of the FIFO would otherwise hang here
    (void)list_regions(dir.path());
    (void)clean_regions(dir.path(), std::string("fifo"));
    return 0;
  });
  const int status = test::wait_child(child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "list/clean did not finish (status " << status << ", signal "
      << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";

  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 5U);
  std::map<std::string, RegionInfo> by_id;
  for (const auto& info : listed) by_id[info.engine_id] = info;
  EXPECT_EQ(by_id["dir"].problem, "a directory, not a region file");
  EXPECT_EQ(by_id["fifo"].problem, "a FIFO, not a region file");
  EXPECT_EQ(by_id["link"].problem, "a symbolic link, not a region file");
  EXPECT_EQ(by_id["junk"].problem, "no region header (bad magic or version); not a region file");
  EXPECT_EQ(by_id["junk"].file_bytes, 8192U);
  EXPECT_FALSE(by_id["junk"].geometry.has_value());
  EXPECT_EQ(by_id["real"].problem, "");
  EXPECT_TRUE(by_id["real"].stale);
  EXPECT_TRUE(by_id["real"].complete);
  EXPECT_TRUE(by_id["real"].geometry.has_value());
  for (const char* id : {"dir", "fifo", "link"}) {
    EXPECT_FALSE(by_id[id].stale) << id;  // nothing clean would act on
    EXPECT_EQ(by_id[id].file_bytes, 0U) << id;
  }

  const CleanResult cleaned = clean_regions(dir.path());
  EXPECT_THAT(cleaned.removed, ElementsAre(p("real")));
  EXPECT_TRUE(cleaned.kept.empty());
  std::vector<std::string> skipped;
  for (const auto& s : cleaned.skipped)
    skipped.push_back(s.path.filename().string() + ": " + s.reason);
  EXPECT_THAT(
      skipped,
      ElementsAre(
          "kvoffload_dir.region: a directory, not a region file",
          "kvoffload_fifo.region: a FIFO, not a region file",
          "kvoffload_junk.region: no region header (bad magic or version); not a region file",
          "kvoffload_link.region: a symbolic link, not a region file"));
  EXPECT_THAT(dir.entries(),
              ElementsAre("kvoffload_dir.region", "kvoffload_fifo.region", "kvoffload_junk.region",
                          "kvoffload_link.region", "target"));
  EXPECT_EQ(std::filesystem::file_size(dir.path() / "target"), 4U);
}

TEST(Region, SymlinkAtThePathIsRefused) {
  const TempDir dir;
  { std::ofstream(dir.path() / "target") << "keep"; }
  std::filesystem::create_symlink(dir.path() / "target", dir.path() / "kvoffload_sym.region");
  const Error e =
      expect_error([&] { (void)Region::create_or_join(small_options(dir.path(), "sym")); });
  EXPECT_EQ(e.code(), ErrorCode::kPermission);
  EXPECT_THAT(e.what(), HasSubstr("symbolic link"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir.path() / "kvoffload_sym.region"));
  EXPECT_EQ(std::filesystem::file_size(dir.path() / "target"), 4U);
  EXPECT_TRUE(clean_regions(dir.path()).removed.empty());
}

TEST(Region, WiderPermissionsAreRefused) {
  const TempDir dir;
  Region a = Region::create_or_join(small_options(dir.path(), "mode"));
  ASSERT_EQ(::chmod(a.path().c_str(), 0644), 0);
  const Error e =
      expect_error([&] { (void)Region::create_or_join(small_options(dir.path(), "mode", 1)); });
  EXPECT_EQ(e.code(), ErrorCode::kPermission);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("mode 0644"), HasSubstr("0600")));
}

TEST(Region, AnotherUsersRegionIsRefusedAndNeverReclaimed) {
  if (::geteuid() != 0) KVO_SKIP("not-root") << "needs root to chown a file to another uid";
  const TempDir dir;
  const auto opts = small_options(dir.path(), "other");
  test::make_stale_region(opts);  // stale: root would reclaim it if it skipped the owner check
  const auto path = dir.path() / "kvoffload_other.region";
  ASSERT_EQ(::chown(path.c_str(), 12345, 12345), 0);
  const Error e = expect_error([&] { (void)Region::create_or_join(opts); });
  EXPECT_EQ(e.code(), ErrorCode::kPermission);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("uid 12345"), HasSubstr(path.string())));
  const auto cleaned = clean_regions(dir.path());
  EXPECT_TRUE(cleaned.removed.empty());
  EXPECT_TRUE(cleaned.kept.empty());  // kept means in use; this one is not ours (skipped)
  ASSERT_EQ(cleaned.skipped.size(), 1U);
  EXPECT_EQ(cleaned.skipped[0].path, path);
  EXPECT_THAT(cleaned.skipped[0].reason, HasSubstr("uid 12345"));
  EXPECT_TRUE(std::filesystem::exists(path));
}

TEST(Region, TeardownHooksRunInReverseBeforeMunmap) {
  const TempDir dir;
  FaultSyscalls sys;
  auto opts = small_options(dir.path(), "hooks");
  opts.syscalls = sys.get();
  Region r = Region::create_or_join(opts);
  std::vector<std::string> order;
  std::byte* data = r.data();
  r.add_teardown_hook([&] {
    order.push_back("first-registered");
    EXPECT_EQ(sys.count(Op::kMunmap), 0);
  });
  r.add_teardown_hook([&] {
    order.push_back("second-registered");
    data[0] = std::byte{1};                    // still mapped
    throw std::runtime_error("hook failure");  // must not stop the teardown
  });
  EXPECT_FALSE(r.close());
  EXPECT_THAT(order, ElementsAre("second-registered", "first-registered"));
  EXPECT_EQ(sys.count(Op::kMunmap), 1);
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(expect_error([&] { r.add_teardown_hook([] {}); }).code(), ErrorCode::kState);
}

TEST(Region, MovedRegionKeepsItsMapping) {
  const TempDir dir;
  Region a = Region::create_or_join(small_options(dir.path(), "move"));
  std::byte* data = a.data();
  Region b = std::move(a);
  EXPECT_FALSE(a.is_open());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.data(), data);
  Region c = Region::create_or_join(small_options(dir.path(), "move2"));
  c = std::move(b);  // closes move2
  EXPECT_THAT(dir.entries(), ElementsAre("kvoffload_move.region"));
}

}  // namespace
}  // namespace kvoffload
