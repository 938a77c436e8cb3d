// A tenant killed (SIGKILL) at every step of every index operation in turn, a tenant killed while
// it writes a chunk or holds pins, a stopped (SIGSTOP) holder of the index lock: the index stays
// consistent (check_invariants), nothing stays leaked, every served chunk verifies, and the live
// tenant keeps serving (Note [Pool repair], Note [Pool lock]).
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>

#include "pool_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload::pool {
namespace {

using test::keys;
using test::small_options;
using ::testing::HasSubstr;

constexpr int kNotReached = 50;  // the child's exit code when its operation ran to the end

// In the child: once armed, the k-th step of any operation kills the process (or stops it).
struct StepTrap {
  bool armed = false;
  std::uint32_t at = 0;
  std::uint32_t seen = 0;
  int signal = SIGKILL;
};
void trap_hook(void* context, Op /*op*/, std::uint32_t /*step*/) {
  auto* t = static_cast<StepTrap*>(context);
  if (t->armed && t->seen++ == t->at) (void)::raise(t->signal);
}

enum class Scenario {
  kAttach,
  kLookupPin,
  kLookupTouch,
  kPrepare,
  kCycle,
  kCommit,
  kAbort,
  kUnpin,
  kDetach,
  kRepair
};

const char* name_of(Scenario s) {
  switch (s) {
    case Scenario::kAttach:
      return "attach";
    case Scenario::kLookupPin:
      return "lookup_pin";
    case Scenario::kLookupTouch:
      return "lookup_touch";
    case Scenario::kPrepare:
      return "prepare_stores";
    case Scenario::kCycle:
      return "lookup_and_prepare";
    case Scenario::kCommit:
      return "commit_stores";
    case Scenario::kAbort:
      return "abort_stores";
    case Scenario::kUnpin:
      return "unpin";
    case Scenario::kDetach:
      return "detach";
    case Scenario::kRepair:
      return "repair";
  }
  return "?";
}

PoolOptions options(const std::filesystem::path& dir, const char* engine, PolicyKind policy) {
  auto o = small_options(dir, engine);
  o.policy = policy;
  return o;
}

// A tenant that attaches, stores, pins and starts two stores, then dies outside the lock.
void leave_a_dead_tenant(const std::filesystem::path& dir, const char* engine,
                         PolicyKind policy = PolicyKind::kLru) {
  const pid_t pid = kvoffload::test::fork_child([&] {
    auto p = NodePool::attach(options(dir, engine, policy));
    (void)p.lookup(keys(0, 1), true);
    const StoreOutcome s = p.prepare_stores(keys(700, 2));
    for (std::size_t i = 0; i < s.slots.size(); ++i)
      test::write_chunk(p, s.slots[i], keys(700, 2)[s.positions[i]]);
    (void)::raise(SIGKILL);
    return 0;
  });
  const int status = kvoffload::test::wait_child(pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

// The child: a tenant with stores, pins and stores in flight; then the operation, trapped at step
// k.
int run_child(const std::filesystem::path& dir, Scenario sc, PolicyKind policy, std::uint32_t k) {
  StepTrap trap;
  trap.at = k;
  auto o = options(dir, "child", policy);
  o.step_hook = trap_hook;
  o.step_context = &trap;
  if (sc == Scenario::kAttach) {
    trap.armed = true;
    auto p = NodePool::attach(o);
    return kNotReached;
  }
  auto p = NodePool::attach(o);
  test::store(p, keys(100, 2));         // the pool is full now (6 + 2 of 8)
  (void)p.lookup(keys(100, 2), false);  // most recent (ARC: in T2 with the parent's)
  const LookupOutcome pins = p.lookup(keys(0, 2), true);  // pins on the parent's chunks
  const std::vector<std::uint32_t> pinned(pins.slots.begin(), pins.slots.end());
  const std::vector<BlockKey> w = keys(200, 2);
  const StoreOutcome s = p.prepare_stores(w);  // evicts two of the parent's chunks
  const std::vector<std::uint32_t> writing(s.slots.begin(), s.slots.end());
  for (std::size_t i = 0; i < writing.size(); ++i)
    test::write_chunk(p, writing[i], w[s.positions[i]]);
  if (pinned.size() != 2 || writing.size() != 2) return 60;
  trap.armed = true;
  switch (sc) {
    case Scenario::kLookupPin:
      (void)p.lookup(keys(100, 2), true);
      break;
    case Scenario::kLookupTouch:
      (void)p.lookup(keys(100, 2), false);
      break;
    case Scenario::kPrepare:
      (void)p.prepare_stores(keys(300, 3));
      break;
    case Scenario::kCycle: {
      std::vector<BlockKey> req = keys(100, 2);
      for (const auto& x : keys(400, 2)) req.push_back(x);
      (void)p.lookup_and_prepare(req, true);
      break;
    }
    case Scenario::kCommit:
      p.commit_stores(writing);
      break;
    case Scenario::kAbort:
      p.abort_stores(writing);
      break;
    case Scenario::kUnpin:
      p.unpin(pinned);
      break;
    case Scenario::kDetach:
      p.detach();
      break;
    case Scenario::kRepair:
      trap.armed = false;
      leave_a_dead_tenant(dir, "grandchild", policy);
      trap.armed = true;
      (void)p.reclaim_dead_tenants();
      break;
    default:
      break;
  }
  trap.armed = false;  // the destructor's detach is the kDetach scenario's
  return kNotReached;
}

class KillAtEveryStep : public ::testing::TestWithParam<std::tuple<Scenario, PolicyKind>> {};

TEST_P(KillAtEveryStep, TheIndexStaysConsistentAndTheLiveTenantKeepsServing) {
  const kvoffload::test::TempDir dir;
  const Scenario scenario = std::get<0>(GetParam());
  const PolicyKind policy = std::get<1>(GetParam());
  auto parent = NodePool::attach(options(dir.path(), "parent", policy));
  std::uint64_t next_key = 1000;
  std::uint32_t kills = 0;
  for (std::uint32_t k = 0;; ++k) {
    ASSERT_LT(k, 500U) << "the operation never finished";
    // The parent's working set: keys 0..5 ready (re-stored when an earlier round evicted them).
    test::store(parent, keys(0, 6));
    ASSERT_EQ(parent.lookup(keys(0, 6), false).hits, 6U);  // most recent: the child evicts others
    const pid_t pid =
        kvoffload::test::fork_child([&] { return run_child(dir.path(), scenario, policy, k); });
    const int status = kvoffload::test::wait_child(pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == kNotReached) break;
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << name_of(scenario) << " step " << k << ": child status " << status;
    ++kills;
    // The first lock after the death repairs (EOWNERDEAD); the checker then sees a sound index.
    ASSERT_EQ(test::joined(parent.check_invariants()), "") << name_of(scenario) << " step " << k;
    PoolStats st = parent.stats();
    ASSERT_EQ(st.tenants.size(), 1U) << "the dead child is still a tenant after step " << k;
    EXPECT_EQ(st.writing, 0U) << "a dead tenant's store was left writing (step " << k << ")";
    EXPECT_EQ(st.pinned, 0U) << "a dead tenant's pin was left (step " << k << ")";
    // Every ready chunk holds its key's bytes: nothing half-written is served.
    for (const SlotView& v : parent.snapshot()) {
      if (v.state == SlotState::kReady) {
        EXPECT_TRUE(test::chunk_holds(parent, v.slot, v.key)) << "slot " << v.slot << " step " << k;
      }
    }
    // And it keeps serving.
    const auto fresh = keys(next_key, 3);
    next_key += 3;
    EXPECT_EQ(test::store(parent, fresh), 3U);
    EXPECT_EQ(test::load_verified(parent, fresh), 3U);
  }
  EXPECT_GT(kills, 0U) << "no step of " << name_of(scenario) << " was reached";
  EXPECT_EQ(test::joined(parent.check_invariants()), "");
  // The run that finished: the child detached (or died with its tenant) and left nothing.
  parent.reclaim_dead_tenants();
  EXPECT_EQ(parent.stats().tenants.size(), 1U);
  const ArcState arc = parent.arc_state();
  if (policy == PolicyKind::kArc) {
    // Repairs keep consistent ghosts; a death inside a ghost change makes them rebuilt empty.
    EXPECT_GT(arc.ghosts_kept, 0U);
    if (scenario == Scenario::kPrepare || scenario == Scenario::kCycle) {
      EXPECT_GT(arc.ghosts_cleared, 0U);
    }
  }
  (void)std::printf(
      "%s/%s: killed at each of %u steps; ghosts kept by %lu repairs, rebuilt by %lu\n",
      name_of(scenario), std::string(to_string(policy)).c_str(), kills,
      static_cast<unsigned long>(arc.ghosts_kept), static_cast<unsigned long>(arc.ghosts_cleared));
}

INSTANTIATE_TEST_SUITE_P(
    Ops, KillAtEveryStep,
    ::testing::Combine(::testing::Values(Scenario::kAttach, Scenario::kLookupPin,
                                         Scenario::kLookupTouch, Scenario::kPrepare,
                                         Scenario::kCycle, Scenario::kCommit, Scenario::kAbort,
                                         Scenario::kUnpin, Scenario::kDetach, Scenario::kRepair),
                       ::testing::Values(PolicyKind::kLru, PolicyKind::kArc)),
    [](const auto& param_info) {
      return std::string(name_of(std::get<0>(param_info.param))) + "_" +
             std::string(to_string(std::get<1>(param_info.param)));
    });

TEST(PoolCrash, AHalfWrittenChunkOfADeadTenantIsNeverServedAndIsStoredAgain) {
  const kvoffload::test::TempDir dir;
  auto parent = NodePool::attach(small_options(dir.path(), "parent"));
  const auto k = keys(5, 1);
  const pid_t pid = kvoffload::test::fork_child([&] {
    auto p = NodePool::attach(small_options(dir.path(), "writer"));
    const StoreOutcome s = p.prepare_stores(k);
    if (s.slots.size() != 1) return 1;
    std::byte* b = p.chunk(s.slots[0], 0);
    for (std::uint64_t i = 0; i < 256; ++i)
      b[i] = static_cast<std::byte>(test::byte_of(k[0], 0, i));
    (void)::raise(SIGKILL);  // half of rank 0's bytes written, nothing committed
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(kvoffload::test::wait_child(pid)));
  EXPECT_EQ(parent.lookup(k, true).hits, 0U);
  EXPECT_EQ(parent.prepare_stores(k).skipped_writing, 1U);  // until the writer is reclaimed
  EXPECT_EQ(parent.reclaim_dead_tenants(), 1U);
  EXPECT_EQ(parent.lookup(k, true).hits, 0U);
  EXPECT_EQ(test::store(parent, k), 1U);
  EXPECT_EQ(test::load_verified(parent, k), 1U);
  EXPECT_EQ(test::joined(parent.check_invariants()), "");
}

TEST(PoolCrash, ADeadTenantsPinsAndStoresAreReclaimedWhenAStoreFindsNoRoom) {
  const kvoffload::test::TempDir dir;
  auto parent = NodePool::attach(small_options(dir.path(), "parent", 3));
  const pid_t pid = kvoffload::test::fork_child([&] {
    auto p = NodePool::attach(small_options(dir.path(), "hog", 3));
    test::store(p, keys(0, 2));
    if (p.lookup(keys(0, 2), true).hits != 2) return 1;
    if (p.prepare_stores(keys(9, 1)).slots.size() != 1) return 1;
    (void)::raise(SIGKILL);  // every slot pinned or writing by a dead tenant
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(kvoffload::test::wait_child(pid)));
  // The sweep interval (1 s) has not passed; the store that finds no room checks liveness.
  const StoreOutcome s = parent.prepare_stores(keys(20, 3));
  EXPECT_EQ(s.slots.size(), 3U);
  EXPECT_EQ(s.skipped_no_room, 0U);
  EXPECT_EQ(parent.stats().tenants_reclaimed, 1U);
  EXPECT_EQ(test::joined(parent.check_invariants()), "");
}

TEST(PoolCrash, ThePeriodicSweepReclaimsATenantThatDiedOutsideTheLock) {
  const kvoffload::test::TempDir dir;
  auto o = small_options(dir.path(), "parent");
  o.sweep_interval = std::chrono::milliseconds(0);  // every operation
  auto parent = NodePool::attach(o);
  leave_a_dead_tenant(dir.path(), "dead");
  EXPECT_EQ(parent.lookup(keys(0, 1), false).hits, 0U);
  const PoolStats st = parent.stats();
  EXPECT_EQ(st.tenants.size(), 1U);
  EXPECT_EQ(st.writing, 0U);
  EXPECT_EQ(st.tenants_reclaimed, 1U);
}

// The child stops itself holding the index lock (the first step of its lookup).
pid_t stopped_lock_holder(const std::filesystem::path& dir) {
  const pid_t pid = kvoffload::test::fork_child([&] {
    StepTrap trap;
    trap.signal = SIGSTOP;
    auto o = small_options(dir, "stopper");
    o.step_hook = trap_hook;
    o.step_context = &trap;
    auto p = NodePool::attach(o);
    trap.armed = true;
    (void)p.lookup(keys(0, 1), true);
    p.detach();
    return 0;
  });
  int status = 0;
  while (::waitpid(pid, &status, WUNTRACED) < 0 && errno == EINTR) {
  }
  EXPECT_TRUE(WIFSTOPPED(status));
  return pid;
}

TEST(PoolCrash, AStoppedLockHolderIsReportedWithItsPidAfterABoundedWait) {
  const kvoffload::test::TempDir dir;
  auto o = small_options(dir.path(), "parent");
  o.lock_timeout = std::chrono::milliseconds(200);
  auto parent = NodePool::attach(o);
  const pid_t pid = stopped_lock_holder(dir.path());
  try {
    (void)parent.lookup(keys(0, 1), false);
    ADD_FAILURE() << "the lookup did not time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_THAT(e.what(), HasSubstr("held by PID " + std::to_string(pid) + " (state T: stopped"));
    EXPECT_THAT(e.what(), HasSubstr("lookup waited 0.200 s"));
  }
  EXPECT_THROW((void)parent.prepare_stores(keys(0, 1)), Error);
  (void)::kill(pid, SIGCONT);
  const int status = kvoffload::test::wait_child(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(test::store(parent, keys(0, 1)), 1U);
  EXPECT_EQ(test::joined(parent.check_invariants()), "");
}

TEST(PoolCrash, AStoppedLockHolderKilledLeavesARepairableIndex) {
  const kvoffload::test::TempDir dir;
  auto parent = NodePool::attach(small_options(dir.path(), "parent"));
  test::store(parent, keys(0, 4));
  const pid_t pid = stopped_lock_holder(dir.path());
  (void)::kill(pid, SIGKILL);
  (void)kvoffload::test::wait_child(pid);
  EXPECT_EQ(test::load_verified(parent, keys(0, 4)), 4U);
  EXPECT_EQ(parent.stats().tenants.size(), 1U);
  EXPECT_EQ(test::joined(parent.check_invariants()), "");
}

}  // namespace
}  // namespace kvoffload::pool
