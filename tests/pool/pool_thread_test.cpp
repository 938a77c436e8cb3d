// Several node pool tenants on threads of one process (docs/DESIGN.md §6.6): each its own
// NodePool, attaching, looking up, storing and detaching concurrently, with every loaded byte
// verified and the index's invariants checked at the end. The .ci/run TSan stage runs this suite:
// in one process TSan sees the index lock (Note [Pool lock under TSan] in pool_lock.cpp) and each
// object's own state; it cannot see races between tenants, whose mappings of the file lie at
// different addresses (the cross-process suites and the checker cover those).
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pool_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload::pool {
namespace {

using test::key;
using test::small_options;

TEST(PoolThreads, TenantsOnThreadsAttachLoadStoreAndDetachConcurrentlyWithVerifiedBytes) {
  const kvoffload::test::TempDir dir;
  constexpr std::uint32_t kThreads = 4;
  constexpr int kAttachments = 3;       // each thread attaches, works and detaches this often
  constexpr int kRounds = 60;           // lookups + stores per attachment
  constexpr std::uint64_t kShared = 6;  // keys the observer stores and keeps pinned
  constexpr std::uint64_t kSpace = 96;  // keys the threads draw from: more than the slots

  // The observer keeps the pool alive and pins the shared prefix, so every thread's lookup of
  // it is a hit on chunks another engine stored, whatever the other threads evict.
  auto observer = NodePool::attach(small_options(dir.path(), "observer", 48, 256));
  const std::vector<BlockKey> shared = test::keys(0, kShared);
  ASSERT_EQ(test::store(observer, shared), kShared);
  const LookupOutcome pinned = observer.lookup(shared, true);
  ASSERT_EQ(pinned.hits, kShared);
  const std::vector<std::uint32_t> pinned_slots(pinned.slots.begin(), pinned.slots.end());

  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> cross{0};
  std::atomic<std::uint64_t> stored{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::uint64_t rng = 0x9E3779B97F4A7C15ULL * (t + 1);
      for (int a = 0; a < kAttachments; ++a) {
        auto p = NodePool::attach(small_options(dir.path(), "engine" + std::to_string(t), 48, 256));
        for (int r = 0; r < kRounds; ++r) {
          rng = splitmix64(rng);
          const std::uint64_t from = kShared + rng % (kSpace - 8);
          std::vector<BlockKey> ks = shared;
          for (std::uint64_t i = 0; i < 1 + (rng >> 32) % 6; ++i) ks.push_back(key(from + i));
          const std::uint32_t got = test::load_verified(p, ks);
          EXPECT_GE(got, kShared) << "the observer's pinned prefix was not a hit";
          hits += got;
          stored += test::store(p, ks);
        }
        const PoolStats st = p.stats();
        for (const TenantStats& ts : st.tenants) {
          if (ts.index == p.tenant_index()) cross += ts.cross_engine_hits;
        }
        p.detach();
      }
    });
  }
  for (auto& th : threads) th.join();

  EXPECT_GE(hits.load(), std::uint64_t{kThreads} * kAttachments * kRounds * kShared);
  EXPECT_GE(cross.load(), std::uint64_t{kThreads} * kAttachments * kRounds * kShared);
  EXPECT_GT(stored.load(), 0U);
  EXPECT_POOL_OK(observer);
  const PoolStats st = observer.stats();
  ASSERT_EQ(st.tenants.size(), 1U) << "every thread's tenant left";
  EXPECT_EQ(st.writing, 0U);
  EXPECT_EQ(st.free + st.ready, st.slot_count);
  // Every chunk left ready holds its key's bytes, in every rank.
  std::uint64_t ready = 0;
  for (const SlotView& s : observer.snapshot()) {
    if (s.state != SlotState::kReady) continue;
    ++ready;
    EXPECT_TRUE(test::chunk_holds(observer, s.slot, s.key)) << "slot " << s.slot;
  }
  EXPECT_EQ(ready, st.ready);
  observer.unpin(pinned_slots);
  EXPECT_POOL_OK(observer);
}

}  // namespace
}  // namespace kvoffload::pool
