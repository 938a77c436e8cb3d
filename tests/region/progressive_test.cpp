// Progressive bring-up (Note [Progressive bring-up] in core/src/region/bringup.cpp): pieces in row
// order, readiness published per rank in the header, failures in the middle (capacity shortfall at
// piece k, registration failing at piece k, a rank killed halfway) that leave a clear state,
// nothing leaked and a region that can be reclaimed.
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/platform.hpp>
#include <kvoffload/region.hpp>

#include "fault_syscalls.hpp"
#include "region_helpers.hpp"
#include "runtime/fault_runtime.hpp"
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

// Holds a thread at a chosen point until the test releases it.
class Gate {
 public:
  void hold() {
    std::unique_lock lock(mu_);
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void wait_reached() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void release() {
    const std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false;
  bool open_ = false;
};

struct Piece {
  std::uint64_t first;
  std::uint64_t rows;
  std::byte* data;
  std::size_t bytes;
  bool operator==(const Piece&) const = default;
};

// 8 rows of 2 ranks x one page; pieces of 2 rows. Populating a piece takes 3 madvise calls (the
// probe and one per row), so madvise call 3k+1 starts piece k.
RegionOptions progressive_options(const std::filesystem::path& dir, const std::string& id,
                                  std::optional<std::uint32_t> rank) {
  auto o = small_options(dir, id, rank);
  const std::uint64_t page = platform::page_size();
  o.layout = {.num_chunks = 8, .slot_bytes = page, .world_size = 2};
  o.bringup = BringupMode::kBackground;
  o.bringup_piece_bytes = 2 * (2 * page);  // two rows
  return o;
}
constexpr int first_madvise_of_piece(int k) {
  return 3 * k + 1;
}

TEST(Progressive, BackgroundComesUpPieceByPieceAndPublishesReadiness) {
  const TempDir dir;
  FaultSyscalls sys;
  Gate gate;
  sys.before(Op::kMadvise, first_madvise_of_piece(2), [&] { gate.hold(); });
  std::mutex mu;
  std::vector<Piece> pieces;
  auto opts = progressive_options(dir.path(), "prog", 0);
  opts.syscalls = sys.get();
  opts.on_piece_ready = [&](std::span<std::byte> rows, std::uint64_t first, std::uint64_t n) {
    const std::lock_guard lock(mu);
    pieces.push_back({first, n, rows.data(), rows.size()});
  };
  Region r = Region::create_or_join(opts);  // returns while the bring-up is held at piece 2
  gate.wait_reached();
  const std::uint64_t row = r.geometry().row_stride();
  BringupStatus st = r.bringup_status();
  EXPECT_EQ(st.state, BringupState::kRunning);
  EXPECT_EQ(st.ready_chunks, 4U);
  EXPECT_EQ(st.num_chunks, 8U);
  RankBringup mine = r.rank_bringup(0);
  EXPECT_EQ(mine.state, BringupState::kRunning);
  EXPECT_EQ(mine.ready_chunks, 4U);
  EXPECT_EQ(r.rank_bringup(1).state, BringupState::kPending);
  EXPECT_EQ(r.chunks_ready_on_all_ranks(), 0U);  // rank 1 has not started
  {
    const std::lock_guard lock(mu);
    EXPECT_EQ(pieces, (std::vector<Piece>{{0, 2, r.row(0).data(), 2 * row},
                                          {2, 2, r.row(2).data(), 2 * row}}));
  }
  // Rank 1 comes up blocking while rank 0 is held: the rows ready on every rank are rank 0's 4.
  auto o1 = progressive_options(dir.path(), "prog", 1);
  o1.bringup = BringupMode::kBlocking;
  std::optional<Region> r1(Region::create_or_join(o1));
  EXPECT_EQ(r.rank_bringup(1).state, BringupState::kReady);
  EXPECT_EQ(r.rank_bringup(1).ready_chunks, 8U);
  EXPECT_EQ(r.chunks_ready_on_all_ranks(), 4U);

  gate.release();
  r.wait_bringup();
  st = r.bringup_status();
  EXPECT_EQ(st.state, BringupState::kReady);
  EXPECT_EQ(st.ready_chunks, 8U);
  EXPECT_FALSE(st.error.has_value());
  EXPECT_EQ(pieces.size(), 4U);
  EXPECT_EQ(pieces.back(), (Piece{6, 2, r.row(6).data(), 2 * row}));
  EXPECT_EQ(r.populate_report().bytes, 8U * platform::page_size());

  EXPECT_EQ(r.chunks_ready_on_all_ranks(), 8U);
  // A rank that detaches serves nothing any more.
  r1.reset();
  EXPECT_EQ(r.rank_bringup(1).state, BringupState::kStopped);
  EXPECT_EQ(r.chunks_ready_on_all_ranks(), 0U);
  EXPECT_THAT(expect_error([&] { (void)r.rank_bringup(2); }).what(), HasSubstr("rank 2"));
}

TEST(Progressive, PieceSizeIsValidatedAndAtLeastOneRow) {
  const TempDir dir;
  auto opts = progressive_options(dir.path(), "piece", 0);
  opts.bringup_piece_bytes = 0;
  EXPECT_THAT(expect_error([&] { (void)Region::create_or_join(opts); }).what(),
              HasSubstr("bringup_piece_bytes is 0"));
  EXPECT_TRUE(dir.entries().empty());
  opts.bringup_piece_bytes = 1;  // less than a row: one row per piece
  opts.bringup = BringupMode::kBlocking;
  int calls = 0;
  opts.on_piece_ready = [&](std::span<std::byte>, std::uint64_t, std::uint64_t n) {
    EXPECT_EQ(n, 1U);
    ++calls;
  };
  Region r = Region::create_or_join(opts);
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(r.bringup_status().state, BringupState::kReady);
  EXPECT_EQ(parse_bringup_mode("background"), BringupMode::kBackground);
  EXPECT_EQ(parse_bringup_mode("blocking"), BringupMode::kBlocking);
  EXPECT_THAT(expect_error([] { (void)parse_bringup_mode("lazy"); }).what(),
              AllOf(HasSubstr("'lazy'"), HasSubstr("background"), HasSubstr("blocking")));
}

// The tmpfs fills while piece 2 is populated: the rank fails with the capacity error, keeps the
// rows it made ready, and the failure is visible to every process in the header.
TEST(Progressive, CapacityShortfallAtPieceKIsAFailedStateNotACrash) {
  const TempDir dir;
  const auto fds = test::fd_snapshot();
  const auto maps = test::maps_snapshot();
  {
    FaultSyscalls sys;
    sys.fail(Op::kMadvise, first_madvise_of_piece(2) + 1, EFAULT);  // piece 2's first row
    auto opts = progressive_options(dir.path(), "short", 0);
    opts.syscalls = sys.get();
    Region r = Region::create_or_join(opts);
    const Error e = expect_error([&] { r.wait_bringup(); });
    EXPECT_EQ(e.code(), ErrorCode::kCapacity) << e.what();
    EXPECT_THAT(e.what(), AllOf(HasSubstr("shortfall"), HasSubstr("--shm-size")));
    const BringupStatus st = r.bringup_status();
    EXPECT_EQ(st.state, BringupState::kFailed);
    EXPECT_EQ(st.ready_chunks, 4U);
    EXPECT_EQ(st.failed_chunk, 4U);
    ASSERT_TRUE(st.error.has_value());
    EXPECT_EQ(st.error->code(), ErrorCode::kCapacity);
    const RankBringup seen = r.rank_bringup(0);
    EXPECT_EQ(seen.state, BringupState::kFailed);
    EXPECT_EQ(seen.ready_chunks, 4U);
    EXPECT_EQ(seen.sys_errno, EFAULT);
    r.slot(3)[0] = std::byte{1};  // the ready rows still serve
    EXPECT_TRUE(r.close());
  }
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(test::fd_snapshot(), fds);
  EXPECT_EQ(test::maps_snapshot(), maps);
  // Reclaimable: the same engine id comes up again.
  Region again = Region::create_or_join(progressive_options(dir.path(), "short", 0));
  again.wait_bringup();
  EXPECT_EQ(again.role(), RegionRole::kCreator);
}

// Registration (the on_piece_ready hook of a GPU rank) refused at piece 2 by the fault-injecting
// runtime: a failed state with the runtime's error; the pieces registered before are released at
// close, before the unmap.
TEST(Progressive, RegistrationFailingAtPieceKIsAFailedStateAndReleasesThePieces) {
  const TempDir dir;
  auto host = make_runtime("host");
  FaultInjectingRuntime fault(*host);
  std::mutex mu;
  std::vector<HostRegistration> registered;
  auto opts = progressive_options(dir.path(), "reg", 0);
  opts.on_piece_ready = [&](std::span<std::byte> rows, std::uint64_t first, std::uint64_t) {
    if (first == 4) fault.set_plan({.fail_registrations = 1});
    HostRegistration reg = fault.register_host(rows.data(), rows.size());
    const std::lock_guard lock(mu);
    registered.push_back(std::move(reg));
  };
  const auto maps = test::maps_snapshot();
  {
    Region r = Region::create_or_join(opts);
    bool released_before_unmap = false;
    r.add_teardown_hook([&] {
      const std::lock_guard lock(mu);
      for (auto& reg : registered) EXPECT_TRUE(reg.reset());
      released_before_unmap = true;
    });
    const Error e = expect_error([&] { r.wait_bringup(); });
    EXPECT_EQ(e.code(), ErrorCode::kDevice) << e.what();
    EXPECT_EQ(e.call(), "register_host");
    EXPECT_EQ(fault.injected_registration_failures(), 1U);
    const BringupStatus st = r.bringup_status();
    EXPECT_EQ(st.state, BringupState::kFailed);
    EXPECT_EQ(st.ready_chunks, 4U);  // pieces 0 and 1
    EXPECT_EQ(st.failed_chunk, 4U);
    EXPECT_EQ(r.rank_bringup(0).state, BringupState::kFailed);
    EXPECT_EQ(r.rank_bringup(0).ready_chunks, 4U);
    {
      const std::lock_guard lock(mu);
      EXPECT_EQ(registered.size(), 2U);
    }
    EXPECT_TRUE(r.close());
    EXPECT_TRUE(released_before_unmap);
  }
  for (const auto& reg : registered) EXPECT_FALSE(static_cast<bool>(reg));
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(test::maps_snapshot(), maps);
}

// Note [Growing pieces]: the first piece is bringup_first_piece_bytes, each next one doubles up to
// bringup_piece_bytes (in rows), and the last takes what is left. 20 rows of one row each: 1, 2,
// 4, 4, 4, 4, then the 1 left. By default (64 MiB, then up to 1 GiB) a small pool comes up as one
// piece of the largest size the pool allows: here the whole 20 rows.
TEST(Progressive, PiecesGrowFromTheFirstPieceByDoublingUpToTheLargest) {
  const TempDir dir;
  const std::uint64_t page = platform::page_size();
  auto opts = progressive_options(dir.path(), "grow", 0);
  opts.layout = {.num_chunks = 20, .slot_bytes = page, .world_size = 1};
  opts.bringup = BringupMode::kBlocking;
  std::vector<std::uint64_t> rows;
  std::vector<std::uint64_t> firsts;
  opts.on_piece_ready = [&](std::span<std::byte> piece, std::uint64_t first, std::uint64_t n) {
    EXPECT_EQ(piece.size(), n * page);
    firsts.push_back(first);
    rows.push_back(n);
  };
  opts.bringup_first_piece_bytes = page;
  opts.bringup_piece_bytes = 4 * page + page / 2;  // rounds down to 4 rows
  {
    Region r = Region::create_or_join(opts);
    EXPECT_EQ(rows, (std::vector<std::uint64_t>{1, 2, 4, 4, 4, 4, 1}));
    EXPECT_EQ(firsts, (std::vector<std::uint64_t>{0, 1, 3, 7, 11, 15, 19}));
    EXPECT_EQ(r.bringup_status().ready_chunks, 20U);
  }
  // A first piece larger than the largest is the largest.
  rows.clear();
  firsts.clear();
  opts.bringup_first_piece_bytes = 64 * page;
  opts.bringup_piece_bytes = 8 * page;
  { Region r = Region::create_or_join(opts); }
  EXPECT_EQ(rows, (std::vector<std::uint64_t>{8, 8, 4}));
  rows.clear();
  firsts.clear();
  opts.bringup_first_piece_bytes = kDefaultBringupFirstPieceBytes;
  opts.bringup_piece_bytes = kDefaultBringupPieceBytes;
  { Region r = Region::create_or_join(opts); }
  EXPECT_EQ(rows, (std::vector<std::uint64_t>{20}));
  opts.bringup_first_piece_bytes = 0;
  EXPECT_THAT(expect_error([&] { (void)Region::create_or_join(opts); }).what(),
              HasSubstr("bringup_first_piece_bytes is 0"));
  EXPECT_TRUE(dir.entries().empty());
}

// RegionOptions::on_teardown is in place before the first piece: a blocking bring-up whose
// registration fails at piece 2 throws from create_or_join, and the two pieces registered before
// are unregistered by on_teardown while their pages are still mapped (the region then unmaps).
TEST(Progressive, OnTeardownReleasesThePiecesOfAFailedBlockingBringupBeforeTheUnmap) {
  const TempDir dir;
  auto host = make_runtime("host");
  std::vector<std::string> events;
  FaultPlan plan{.fail_registration_at = 2};
  plan.on_registration = [&](bool registered, const void* p, std::size_t) {
    events.push_back(std::string(registered ? "register" : "unregister") +
                     (test::is_mapped(p) ? "" : " (unmapped!)"));
  };
  FaultInjectingRuntime fault(*host, plan);
  std::vector<HostRegistration> registered;
  auto opts = progressive_options(dir.path(), "blockfail", 0);
  opts.bringup = BringupMode::kBlocking;
  opts.on_piece_ready = [&](std::span<std::byte> rows, std::uint64_t, std::uint64_t) {
    registered.push_back(fault.register_host(rows.data(), rows.size()));
  };
  opts.on_teardown = [&] {
    events.emplace_back("on_teardown");
    for (auto& reg : registered) EXPECT_TRUE(reg.reset());
  };
  const auto maps = test::maps_snapshot();
  const Error e = expect_error([&] { (void)Region::create_or_join(opts); });
  EXPECT_EQ(e.call(), "register_host") << e.what();
  EXPECT_EQ(events, (std::vector<std::string>{"register", "register", "on_teardown", "unregister",
                                              "unregister"}));
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_EQ(test::maps_snapshot(), maps);
}

// A rank killed while it brings up piece 2: the header keeps what it published (running, 4 rows);
// with another process attached the file goes when that one leaves; alone, the file is stale and
// the next create reclaims it.
TEST(Progressive, RankKilledHalfwayLeavesAClearStateAndTheRegionIsReclaimed) {
  const TempDir dir;
  auto run_killed_rank = [&] {
    const pid_t pid = test::fork_child([&] {
      FaultSyscalls sys;
      sys.before(Op::kMadvise, first_madvise_of_piece(2), [] { ::raise(SIGKILL); });
      auto o = progressive_options(dir.path(), "killed", 0);
      o.syscalls = sys.get();
      Region r = Region::create_or_join(o);
      try {
        r.wait_bringup();
      } catch (...) {
      }
      return 50;  // never reached: killed in piece 2
    });
    const int status = test::wait_child(pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  };

  {
    // The scheduler's unranked mapper is attached throughout.
    Region sched = Region::create_or_join(progressive_options(dir.path(), "killed", std::nullopt));
    EXPECT_EQ(sched.bringup_status().state, BringupState::kReady);  // it populates nothing
    EXPECT_EQ(sched.populate_report().bytes, 0U);
    run_killed_rank();
    const RankBringup dead = sched.rank_bringup(0);
    EXPECT_EQ(dead.state, BringupState::kRunning);
    EXPECT_EQ(dead.ready_chunks, 4U);
    EXPECT_EQ(sched.chunks_ready_on_all_ranks(), 0U);
    EXPECT_EQ(list_regions(dir.path()).at(0).attached, 1U);
    EXPECT_TRUE(sched.close());
  }
  EXPECT_TRUE(dir.entries().empty());

  run_killed_rank();  // alone: a stale file
  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_TRUE(listed[0].stale);
  Region again = Region::create_or_join(progressive_options(dir.path(), "killed", 0));
  EXPECT_EQ(again.role(), RegionRole::kCreator);
  again.wait_bringup();
  EXPECT_EQ(again.rank_bringup(0).ready_chunks, 8U);
}

// close() during a background bring-up: the thread is stopped and joined before the teardown
// hooks run (they unregister what the pieces registered), and the rank is marked stopped.
TEST(Progressive, CloseStopsTheBringupBeforeTheTeardownHooks) {
  const TempDir dir;
  Gate gate;
  std::atomic<bool> in_piece{false};
  std::atomic<int> pieces{0};
  auto opts = progressive_options(dir.path(), "stop", 0);
  opts.on_piece_ready = [&](std::span<std::byte>, std::uint64_t first, std::uint64_t) {
    in_piece = true;
    if (first == 0) gate.hold();
    ++pieces;
    in_piece = false;
  };
  Region r = Region::create_or_join(opts);
  bool hook_saw_piece_running = true;
  r.add_teardown_hook([&] { hook_saw_piece_running = in_piece.load(); });
  gate.wait_reached();
  std::thread closer([&] { EXPECT_TRUE(r.close()); });
  gate.release();
  closer.join();
  EXPECT_FALSE(hook_saw_piece_running);
  const BringupStatus st = r.bringup_status();
  EXPECT_TRUE(st.state == BringupState::kStopped || st.state == BringupState::kReady)
      << to_string(st.state);
  EXPECT_LE(pieces.load(), 4);
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace kvoffload
