// One owner per role (Note [Owners] in core/src/region/owners.hpp): a rank slot and the scheduler
// role each have one holder at a time; a second claimant is refused naming the engine id, the role
// and the holder's PID; the role dies with its holder (close, kill -9) and the next claimant takes
// it at once; `list_regions` shows the holders and never takes or drops a role.
// Over 500 lines on purpose: one idea seen from threads, children and kill -9 over shared helpers.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "fault_syscalls.hpp"
#include "region/header.hpp"
#include "region/owners.hpp"
#include "region_helpers.hpp"
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
using ::testing::Not;

// The role a test parameter names: rank 0, or the scheduler (unranked).
using RoleParam = std::optional<std::uint32_t>;

std::string role_param_name(const ::testing::TestParamInfo<RoleParam>& info) {
  return info.param ? "Rank" + std::to_string(*info.param) : std::string("Scheduler");
}

std::string pid_text(pid_t pid) {
  return "PID " + std::to_string(pid) + ".";
}

// A pipe whose ends close with the object.
struct Pipe {
  int read_end = -1;
  int write_end = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    read_end = fds[0];
    write_end = fds[1];
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  ~Pipe() {
    close_read();
    close_write();
  }
  void close_read() {
    if (read_end >= 0) ::close(std::exchange(read_end, -1));
  }
  void close_write() {
    if (write_end >= 0) ::close(std::exchange(write_end, -1));
  }
  void put(const std::string& s) const {
    const char* p = s.data();
    std::size_t left = s.size();
    while (left > 0) {
      const ssize_t n = ::write(write_end, p, left);
      if (n <= 0) return;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  // Everything until EOF (or `max` bytes).
  [[nodiscard]] std::string take(std::size_t max = 1 << 16) const {
    std::string out;
    char buf[4096];
    while (out.size() < max) {
      const ssize_t n = ::read(read_end, buf, std::min(sizeof buf, max - out.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
  }
};

// A one-way gate between threads. wait() gives up after a minute so that a broken protocol fails
// the test's assertions instead of hanging it; open() may be called more than once.
class OwnerGate {
 public:
  void open() {
    const std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::minutes(1), [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// create_or_join(options) on a thread of its own (its syscall table pauses it where a test says);
// after join(), `region` is the result or `error` says why there is none.
struct HolderThread {
  std::optional<Region> region;
  std::string error;
  std::thread thread;

  explicit HolderThread(const RegionOptions& options)
      : thread([this, options] {
          try {
            region.emplace(Region::create_or_join(options));
          } catch (const Error& e) {
            error = e.what();
          }
        }) {}
  void join() { thread.join(); }
};

// A child that takes `role` and holds it until the test ends it (SIGKILL or its release pipe
// closes). start() returns once the child holds the role.
class HoldingChild {
 public:
  HoldingChild(const RegionOptions& options) {
    pid_ = test::fork_child([&] {
      ready_.close_read();
      release_.close_write();
      Region r = Region::create_or_join(options);
      ready_.put("held");
      ready_.close_write();
      (void)release_.take();  // until the parent closes its end
      return r.close() ? 0 : 1;
    });
    ready_.close_write();
    release_.close_read();
    held_ = ready_.take(4) == "held";
  }
  HoldingChild(const HoldingChild&) = delete;
  HoldingChild& operator=(const HoldingChild&) = delete;
  ~HoldingChild() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      (void)test::wait_child(pid_);
    }
  }
  [[nodiscard]] bool held() const { return held_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  // Closes the region normally; returns the child's wait status.
  int release() {
    release_.close_write();
    return test::wait_child(std::exchange(pid_, -1));
  }
  void kill9() {
    ::kill(pid_, SIGKILL);
    const int status = test::wait_child(std::exchange(pid_, -1));
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  }

 private:
  Pipe ready_;
  Pipe release_;
  pid_t pid_ = -1;
  bool held_ = false;
};

TEST(Owners, ASecondHolderOfARankOrTheSchedulerIsRefusedNamingEngineRoleAndPid) {
  const TempDir dir;
  const std::string id = test::unique_id("own");
  Region rank0 = Region::create_or_join(small_options(dir.path(), id, 0));
  Region rank1 = Region::create_or_join(small_options(dir.path(), id, 1));
  Region scheduler = Region::create_or_join(small_options(dir.path(), id, std::nullopt));

  const Error again =
      expect_error([&] { (void)Region::create_or_join(small_options(dir.path(), id, 0)); });
  EXPECT_EQ(again.code(), ErrorCode::kInUse) << again.what();
  EXPECT_THAT(again.what(),
              AllOf(HasSubstr("rank 0 of engine '" + id + "'"), HasSubstr(pid_text(::getpid())),
                    HasSubstr(rank0.path().string()), HasSubstr("its own engine id"),
                    HasSubstr("stop PID " + std::to_string(::getpid()))));
  EXPECT_EQ(to_string(again.code()), "in_use");

  const Error twice = expect_error(
      [&] { (void)Region::create_or_join(small_options(dir.path(), id, std::nullopt)); });
  EXPECT_EQ(twice.code(), ErrorCode::kInUse) << twice.what();
  EXPECT_THAT(twice.what(), AllOf(HasSubstr("the scheduler role of engine '" + id + "'"),
                                  HasSubstr(pid_text(::getpid())), HasSubstr("hands out slots")));

  // A freed role is taken at once by the next claimant.
  ASSERT_TRUE(rank0.close());
  Region next = Region::create_or_join(small_options(dir.path(), id, 0));
  EXPECT_EQ(next.role(), RegionRole::kJoiner);
  ASSERT_TRUE(scheduler.close());
  Region next_scheduler = Region::create_or_join(small_options(dir.path(), id, std::nullopt));
  EXPECT_EQ(next_scheduler.rank(), std::nullopt);
}

// A refused claimant leaves the holder's bytes, its bring-up entry, the file and the attached
// count exactly as they were, and holds nothing afterwards (no descriptor, no mapping).
TEST(Owners, ARefusedClaimantDisturbsNothing) {
  const TempDir dir;
  const std::string id = test::unique_id("calm");
  Region holder = Region::create_or_join(small_options(dir.path(), id, 0));
  Region other = Region::create_or_join(small_options(dir.path(), id, 1));
  for (std::uint64_t c = 0; c < holder.geometry().num_chunks(); ++c) {
    std::memset(holder.slot(c).data(), 0x5A, holder.slot(c).size());
  }
  const RankBringup before = holder.rank_bringup(0);
  ASSERT_EQ(before.state, BringupState::kReady);
  const auto fds = test::fd_snapshot();
  const auto maps = test::maps_snapshot();

  for (int i = 0; i < 3; ++i) {
    const Error e =
        expect_error([&] { (void)Region::create_or_join(small_options(dir.path(), id, 0)); });
    EXPECT_EQ(e.code(), ErrorCode::kInUse) << e.what();
  }

  EXPECT_EQ(test::fd_snapshot(), fds);
  EXPECT_EQ(test::maps_snapshot(), maps);
  const RankBringup after = holder.rank_bringup(0);
  EXPECT_EQ(after.state, before.state);
  EXPECT_EQ(after.ready_chunks, before.ready_chunks);
  EXPECT_EQ(other.chunks_ready_on_all_ranks(), holder.geometry().num_chunks());
  for (std::uint64_t c = 0; c < holder.geometry().num_chunks(); ++c) {
    const auto s = other.slot(c, 0);
    for (const std::byte b : s) ASSERT_EQ(b, std::byte{0x5A}) << "chunk " << c;
  }
  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].attached, 2U);
  ASSERT_TRUE(holder.close());
  ASSERT_TRUE(other.close());
  EXPECT_TRUE(dir.entries().empty()) << "the last one out still unlinks";
}

// The holder leaves while a refused claimant is on its way out: the holder's "am I last?" fails
// (the claimant is attached), so the claimant must ask too, or the file stays behind as stale.
TEST(Owners, ARefusedClaimantThatIsTheLastOneOutRemovesTheFile) {
  const TempDir dir;
  const std::string id = test::unique_id("last");
  std::optional<Region> holder(Region::create_or_join(small_options(dir.path(), id, 0)));
  FaultSyscalls sys;
  // flock calls of the claimant: the stale probe (LOCK_EX|LOCK_NB), LOCK_SH, then its way out.
  sys.before(Op::kFlock, 3, [&] { EXPECT_TRUE(holder->close()); });
  auto o = small_options(dir.path(), id, 0);
  o.syscalls = sys.get();
  const Error e = expect_error([&] { (void)Region::create_or_join(o); });
  EXPECT_EQ(e.code(), ErrorCode::kInUse) << e.what();
  EXPECT_EQ(sys.count(Op::kFlock), 3);
  EXPECT_TRUE(dir.entries().empty()) << "the refused claimant was the last one out";
}

class OwnerKilled : public ::testing::TestWithParam<RoleParam> {};

// kill -9 frees the role at once: the next claimant succeeds without waiting (join_timeout 0), and
// the record then names it, not the dead holder.
TEST_P(OwnerKilled, TheNextClaimantTakesTheRoleAtOnce) {
  const TempDir dir;
  const std::string id = test::unique_id("kill");
  Region keeper = Region::create_or_join(small_options(dir.path(), id, 1));  // keeps the file
  auto opts = small_options(dir.path(), id, GetParam());
  opts.join_timeout = std::chrono::milliseconds(0);

  HoldingChild first(opts);
  ASSERT_TRUE(first.held());
  const Error refused = expect_error([&] { (void)Region::create_or_join(opts); });
  EXPECT_EQ(refused.code(), ErrorCode::kInUse) << refused.what();
  EXPECT_THAT(refused.what(), HasSubstr(pid_text(first.pid())));

  first.kill9();
  Region restarted = Region::create_or_join(opts);
  EXPECT_EQ(restarted.role(), RegionRole::kJoiner);

  // A third claimant is refused naming the restarted holder (the dead one's PID is gone).
  const pid_t third = test::fork_child([&] {
    try {
      (void)Region::create_or_join(opts);
    } catch (const Error& e) {
      const std::string what = e.what();
      return e.code() == ErrorCode::kInUse && what.find(pid_text(::getppid())) != std::string::npos
                 ? 0
                 : 2;
    }
    return 3;  // it was not refused
  });
  const int status = test::wait_child(third);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;

  ASSERT_TRUE(restarted.close());
  ASSERT_TRUE(keeper.close());
  EXPECT_TRUE(dir.entries().empty());
}

INSTANTIATE_TEST_SUITE_P(EachRole, OwnerKilled,
                         ::testing::Values(RoleParam{0}, RoleParam{std::nullopt}), role_param_name);

class OwnerRace : public ::testing::TestWithParam<RoleParam> {};

// Two processes and two threads claim one role at the same moment, 8 rounds: exactly one wins and
// every loser names the winner's PID. Odd rounds race over creation too (no file yet); even rounds
// join a region another rank keeps.
TEST_P(OwnerRace, ClaimantsStartedTogetherExactlyOneWins) {
  const TempDir dir;
  const std::string id = test::unique_id("race");
  constexpr int kRounds = 8;
  constexpr int kProcesses = 2;
  constexpr int kThreads = 2;
  for (int round = 1; round <= kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::optional<Region> keeper;
    if (round % 2 == 0) keeper.emplace(Region::create_or_join(small_options(dir.path(), id, 1)));
    const auto opts = small_options(dir.path(), id, GetParam());

    // Processes first (forked while this process has one thread), each waiting for "go".
    Pipe go;
    Pipe release;
    std::vector<std::unique_ptr<Pipe>> results;
    std::vector<pid_t> children;
    for (int p = 0; p < kProcesses; ++p) {
      results.push_back(std::make_unique<Pipe>());
      Pipe& result = *results.back();
      children.push_back(test::fork_child([&] {
        go.close_write();
        release.close_write();
        result.close_read();
        (void)go.take(1);
        try {
          Region r = Region::create_or_join(opts);
          result.put("W");
          result.close_write();
          (void)release.take();
          return r.close() ? 0 : 1;
        } catch (const Error& e) {
          result.put(std::string(e.code() == ErrorCode::kInUse ? "L" : "E") + e.what());
        }
        return 0;
      }));
      result.close_write();
    }
    go.close_read();
    release.close_read();

    std::latch start(kThreads + 1);
    OwnerGate let_go;
    std::latch threads_done(kThreads);  // each thread's result is written before it counts down
    std::vector<std::string> thread_results(kThreads);
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::string& result = thread_results[static_cast<std::size_t>(t)];
        start.arrive_and_wait();
        try {
          Region r = Region::create_or_join(opts);
          result = "W";
          threads_done.count_down();
          let_go.wait();  // holds the role while the others look
        } catch (const Error& e) {
          result = std::string(e.code() == ErrorCode::kInUse ? "L" : "E") + e.what();
          threads_done.count_down();
        }
      });
    }
    go.put(std::string(kProcesses, 'g'));
    start.arrive_and_wait();

    // Each process reports W (and keeps holding) or L/E with the message (and exits).
    std::vector<std::string> process_results;
    process_results.reserve(results.size());
    for (auto& r : results) process_results.push_back(r->take());
    // A thread's result is final once it lost, or once it won: losers return quickly.
    int winners = 0;
    pid_t winner = -1;
    for (std::size_t p = 0; p < process_results.size(); ++p) {
      if (process_results[p] == "W") {
        ++winners;
        winner = children[p];
      }
    }
    threads_done.wait();
    let_go.open();
    for (auto& th : threads) th.join();
    for (const auto& r : thread_results) {
      if (r == "W") {
        ++winners;
        winner = ::getpid();
      }
    }
    EXPECT_EQ(winners, 1);
    std::vector<std::string> all = process_results;
    all.insert(all.end(), thread_results.begin(), thread_results.end());
    for (const std::string& r : all) {
      if (r == "W") continue;
      EXPECT_EQ(r.substr(0, 1), "L") << r;
      EXPECT_THAT(r, HasSubstr(pid_text(winner)));
    }
    release.close_write();
    for (const pid_t pid : children) {
      const int status = test::wait_child(pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    }
    keeper.reset();
    EXPECT_TRUE(dir.entries().empty()) << "the last one out unlinked it";
  }
}

INSTANTIATE_TEST_SUITE_P(EachRole, OwnerRace,
                         ::testing::Values(RoleParam{0}, RoleParam{std::nullopt}), role_param_name);

// `list_regions` shows who holds what; it opens and closes the file in the holder's own process
// without dropping the holder's role (a classic POSIX lock would be gone) and takes none itself.
TEST(Owners, ListingShowsTheHoldersAndNeverTakesOrDropsARole) {
  const TempDir dir;
  const std::string id = test::unique_id("list");
  Region rank0 = Region::create_or_join(small_options(dir.path(), id, 0));
  HoldingChild scheduler(small_options(dir.path(), id, std::nullopt));
  ASSERT_TRUE(scheduler.held());

  for (int i = 0; i < 2; ++i) {
    const auto listed = list_regions(dir.path());
    ASSERT_EQ(listed.size(), 1U);
    EXPECT_EQ(listed[0].attached, 2U);
    ASSERT_EQ(listed[0].owners.size(), 2U);
    EXPECT_EQ(listed[0].owners[0].rank, std::optional<std::uint32_t>(0));
    EXPECT_EQ(listed[0].owners[0].pid, static_cast<std::uint32_t>(::getpid()));
    EXPECT_EQ(listed[0].owners[1].rank, std::nullopt);
    EXPECT_EQ(listed[0].owners[1].pid, static_cast<std::uint32_t>(scheduler.pid()));
  }
  // Still ours after the listing's open and close in this process.
  const pid_t probe = test::fork_child([&] {
    try {
      (void)Region::create_or_join(small_options(dir.path(), id, 0));
    } catch (const Error& e) {
      return e.code() == ErrorCode::kInUse ? 0 : 2;
    }
    return 3;
  });
  const int status = test::wait_child(probe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  // The listing holds nothing: rank 1 is free.
  Region rank1 = Region::create_or_join(small_options(dir.path(), id, 1));

  EXPECT_EQ(scheduler.release(), 0);
  ASSERT_TRUE(rank1.close());
  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  ASSERT_EQ(listed[0].owners.size(), 1U) << "released roles are not listed";
  EXPECT_EQ(listed[0].owners[0].rank, std::optional<std::uint32_t>(0));
  ASSERT_TRUE(rank0.close());
  EXPECT_TRUE(dir.entries().empty());
}

// Note [Owners]: the PID in a record is trusted only once its holder has locked the "recorded"
// byte. A claimant refused while the holder is between its lock and its write must not report a
// PID left in the record by a holder killed earlier; it waits for the real one.
TEST(Owners, ARefusalDuringTheHoldersRecordingWaitsForItsPid) {
  const TempDir dir;
  const std::string id = test::unique_id("rec");
  Region keeper = Region::create_or_join(small_options(dir.path(), id, 1));
  const detail::Role role{.world_size = 2, .rank = 0};
  {
    // A dead holder's leftover: PID 999999 in rank 0's record.
    const int fd = ::open(keeper.path().c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const detail::OwnerRecord stale{.pid = 999999, .reserved = 0};
    ASSERT_EQ(::pwrite(fd, &stale, sizeof stale, static_cast<off_t>(role.record_offset())),
              static_cast<ssize_t>(sizeof stale));
    ::close(fd);
  }
  // The holder pauses before its record write (its first pwrite on the join path) until the
  // claimant has looked once; the claimant's next try waits until the holder has recorded.
  OwnerGate paused;
  OwnerGate looked;
  OwnerGate recorded;
  FaultSyscalls holder_sys;
  holder_sys.before(Op::kPwrite, 1, [&] {
    paused.open();
    looked.wait();
  });
  holder_sys.after(Op::kFcntlLock, 2, [&] { recorded.open(); });  // the "recorded" lock
  FaultSyscalls claimant_sys;
  claimant_sys.after(Op::kFcntlLock, 2, [&] { looked.open(); });  // its first F_OFD_GETLK
  claimant_sys.before(Op::kFcntlLock, 3, [&] { recorded.wait(); });

  auto holder_opts = small_options(dir.path(), id, 0);
  holder_opts.syscalls = holder_sys.get();
  HolderThread holder(holder_opts);
  paused.wait();
  auto o = small_options(dir.path(), id, 0);
  o.syscalls = claimant_sys.get();
  const Error e = expect_error([&] { (void)Region::create_or_join(o); });
  looked.open();
  holder.join();
  EXPECT_EQ(e.code(), ErrorCode::kInUse) << e.what();
  EXPECT_THAT(e.what(), AllOf(HasSubstr(pid_text(::getpid())), Not(HasSubstr("999999"))));
  ASSERT_TRUE(holder.region) << holder.error;
  ASSERT_TRUE(holder.region->close());
}

// A holder stopped between its lock and its record for longer than the claimant waits: the
// claimant is refused all the same, and says the PID is not known yet.
TEST(Owners, AHolderThatNeverRecordsIsStillAHolder) {
  const TempDir dir;
  const std::string id = test::unique_id("norec");
  Region keeper = Region::create_or_join(small_options(dir.path(), id, 1));
  OwnerGate paused;
  OwnerGate done;
  FaultSyscalls holder_sys;
  holder_sys.before(Op::kPwrite, 1, [&] {
    paused.open();
    done.wait();
  });
  auto holder_opts = small_options(dir.path(), id, 0);
  holder_opts.syscalls = holder_sys.get();
  HolderThread holder(holder_opts);
  paused.wait();
  const Error e =
      expect_error([&] { (void)Region::create_or_join(small_options(dir.path(), id, 0)); });
  done.open();
  holder.join();
  EXPECT_EQ(e.code(), ErrorCode::kInUse) << e.what();
  EXPECT_THAT(e.what(), AllOf(HasSubstr("had not recorded its PID yet"),
                              HasSubstr("stop the process that holds it")));
  ASSERT_TRUE(holder.region) << holder.error;
  ASSERT_TRUE(holder.region->close());
}

// A replicated (MLA) layout still has one holder per rank: every rank maps copy 0, and two ranks
// both attach while a second rank 1 is refused.
TEST(Owners, ReplicatedLayoutHasOneHolderPerRankToo) {
  const TempDir dir;
  const std::string id = test::unique_id("mla");
  auto o0 = small_options(dir.path(), id, 0);
  o0.layout.replicated = true;
  auto o1 = o0;
  o1.rank = 1;
  Region r0 = Region::create_or_join(o0);
  Region r1 = Region::create_or_join(o1);
  std::memset(r0.slot(2).data(), 0x3C, r0.slot(2).size());
  for (const std::byte b : r1.slot(2)) ASSERT_EQ(b, std::byte{0x3C});  // rank 1's slot is copy 0
  const Error e = expect_error([&] { (void)Region::create_or_join(o1); });
  EXPECT_EQ(e.code(), ErrorCode::kInUse) << e.what();
}

// Note [Owners]: a leaver gives up "recorded" (byte 1) first, clears its PID, and only then the
// role (byte 0), so no claimant can take the role while the leaver's record is still trusted.
// Watched from another open file description at the record's write (the middle step).
TEST(Owners, AReleaseDropsTheRecordedByteBeforeTheRole) {
  const TempDir dir;
  const std::string path = (dir.path() / "owners").string();
  const detail::Role role{.world_size = 2, .rank = 1};
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(role.record_offset() + 64)), 0);
  const int watcher = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(watcher, 0);
  auto held = [&](std::uint64_t offset) {
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    l.l_start = static_cast<off_t>(offset);
    l.l_len = 1;
    EXPECT_EQ(::fcntl(watcher, F_OFD_GETLK, &l), 0) << std::strerror(errno);
    return l.l_type != F_UNLCK;
  };
  ASSERT_FALSE(detail::claim_role(real_syscalls(), fd, role, path));
  EXPECT_TRUE(held(role.record_offset()));
  EXPECT_TRUE(held(role.record_offset() + 1));

  FaultSyscalls sys;
  bool role_held_then = false;
  bool recorded_held_then = true;
  sys.before(Op::kPwrite, 1, [&] {
    role_held_then = held(role.record_offset());
    recorded_held_then = held(role.record_offset() + 1);
  });
  EXPECT_EQ(detail::release_role(*sys.get(), fd, role), 0);
  EXPECT_TRUE(role_held_then) << "the role is given up last";
  EXPECT_FALSE(recorded_held_then) << "\"recorded\" is given up first";
  EXPECT_FALSE(held(role.record_offset()));
  EXPECT_FALSE(held(role.record_offset() + 1));
  detail::OwnerRecord record{.pid = 1, .reserved = 1};
  ASSERT_EQ(::pread(watcher, &record, sizeof record, static_cast<off_t>(role.record_offset())),
            static_cast<ssize_t>(sizeof record));
  EXPECT_EQ(record.pid, 0U) << "the PID is cleared";
  ::close(watcher);
  ::close(fd);
}

TEST(Owners, RolesAreNotCountedAsAttachedAndDoNotChangeWhoUnlinks) {
  const TempDir dir;
  const std::string id = test::unique_id("live");
  std::optional<Region> a(Region::create_or_join(small_options(dir.path(), id, 0)));
  std::optional<Region> s(Region::create_or_join(small_options(dir.path(), id, std::nullopt)));
  auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].attached, 2U) << "one liveness flock per Region, whatever roles they hold";
  ASSERT_TRUE(a->close());
  EXPECT_EQ(dir.entries().size(), 1U);
  ASSERT_TRUE(s->close());
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace kvoffload
