// Two and three real processes (engines) sharing one node pool, each running a scheduler's cycle
// (lookup_and_prepare with pins, load, store, commit, unpin) and verifying every byte it loads.
#include <sys/wait.h>
#include <unistd.h>

#include <random>

#include <gtest/gtest.h>

#include "pool_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload::pool {
namespace {

using test::small_options;

struct Counters {
  std::uint64_t requests = 0, keys = 0, hits = 0, cross = 0, stored = 0, verified_bytes = 0,
                bad = 0;
};

// One engine's requests: a shared system prompt (keys 0..7) and then 8 chunks of one of
// `documents` documents, chosen by the seed.
std::vector<BlockKey> request_keys(std::mt19937_64& rng, std::uint32_t documents) {
  std::vector<BlockKey> ks = test::keys(0, 8);
  const std::uint64_t d = rng() % documents;
  for (std::uint64_t i = 0; i < 8; ++i) ks.push_back(test::key(1000 + d * 8 + i));
  return ks;
}

Counters run_engine(NodePool& p, std::uint64_t seed, std::uint32_t requests,
                    std::uint32_t documents) {
  Counters c;
  std::mt19937_64 rng(seed);
  const std::uint64_t chunk = p.geometry().slot_bytes * p.geometry().world_size;
  for (std::uint32_t r = 0; r < requests; ++r) {
    const auto ks = request_keys(rng, documents);
    const NodePool::Cycle cy = p.lookup_and_prepare(ks, true);
    const std::vector<std::uint32_t> loaded(cy.lookup.slots.begin(), cy.lookup.slots.end());
    for (std::size_t i = 0; i < loaded.size(); ++i) {
      if (test::chunk_holds(p, loaded[i], ks[i])) {
        c.verified_bytes += chunk;
      } else {
        ++c.bad;
      }
    }
    const std::vector<std::uint32_t> slots(cy.store.slots.begin(), cy.store.slots.end());
    for (std::size_t i = 0; i < slots.size(); ++i)
      test::write_chunk(p, slots[i], ks[cy.store.positions[i]]);
    p.commit_stores(slots);
    p.unpin(loaded);
    c.requests += 1;
    c.keys += ks.size();
    c.hits += cy.lookup.hits;
    c.cross += cy.lookup.cross_engine_hits;
    c.stored += slots.size();
  }
  return c;
}

// Runs run_engine in a child process; its counters come back through a pipe. `go` is a pipe the
// child waits on, so several children start together.
struct Engine {
  pid_t pid = -1;
  int result = -1;
};
Engine spawn(const std::filesystem::path& dir, const std::string& id, std::uint32_t slots,
             std::uint64_t seed, std::uint32_t requests, std::uint32_t documents, int go) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  Engine e;
  e.pid = kvoffload::test::fork_child([&] {
    ::close(fds[0]);
    auto p = NodePool::attach(small_options(dir, id, slots));
    char byte = 0;
    if (go >= 0 && ::read(go, &byte, 1) != 1) return 2;
    const Counters c = run_engine(p, seed, requests, documents);
    if (::write(fds[1], &c, sizeof c) != static_cast<ssize_t>(sizeof c)) return 3;
    return c.bad == 0 ? 0 : 1;
  });
  ::close(fds[1]);
  e.result = fds[0];
  return e;
}
Counters finish(Engine& e) {
  Counters c;
  const ssize_t got = ::read(e.result, &c, sizeof c);
  ::close(e.result);
  const int status = kvoffload::test::wait_child(e.pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "engine status " << status;
  EXPECT_EQ(got, static_cast<ssize_t>(sizeof c));
  return c;
}

void expect_clean(NodePool& observer) {
  EXPECT_EQ(test::joined(observer.check_invariants()), "");
  const PoolStats st = observer.stats();
  EXPECT_EQ(st.tenants.size(), 1U);  // every engine detached
  EXPECT_EQ(st.writing, 0U);
  EXPECT_EQ(st.pinned, 0U);
  for (const SlotView& v : observer.snapshot()) {
    if (v.state == SlotState::kReady) {
      EXPECT_TRUE(test::chunk_holds(observer, v.slot, v.key)) << v.slot;
    }
  }
}

TEST(PoolProcesses, EngineBReplayingEngineAsWorkloadHitsWhatAStored) {
  const kvoffload::test::TempDir dir;
  constexpr std::uint32_t kSlots = 256, kRequests = 40, kDocs = 20;
  auto observer = NodePool::attach(small_options(dir.path(), "observer", kSlots));
  Engine a = spawn(dir.path(), "engine-a", kSlots, 7, kRequests, kDocs, -1);
  const Counters ca = finish(a);
  Engine b = spawn(dir.path(), "engine-b", kSlots, 7, kRequests, kDocs, -1);
  const Counters cb = finish(b);
  EXPECT_GT(ca.stored, 0U);
  EXPECT_EQ(ca.cross, 0U);
  // B finds every chunk of every request, all stored by A, and stores nothing.
  EXPECT_EQ(cb.hits, cb.keys);
  EXPECT_EQ(cb.cross, cb.hits);
  EXPECT_EQ(cb.stored, 0U);
  EXPECT_EQ(cb.bad, 0U);
  EXPECT_EQ(cb.verified_bytes, cb.hits * 512 * 2);
  expect_clean(observer);
}

TEST(PoolProcesses, ThreeEnginesAtOnceUnderEvictionLoadOnlyVerifiedBytes) {
  const kvoffload::test::TempDir dir;
  constexpr std::uint32_t kSlots = 48, kRequests = 600, kDocs = 12;
  auto observer = NodePool::attach(small_options(dir.path(), "observer", kSlots));
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<Engine> engines;
  engines.reserve(3);
  for (int i = 0; i < 3; ++i)
    engines.push_back(
        spawn(dir.path(), "engine-" + std::to_string(i), kSlots, 100 + i, kRequests, kDocs, go[0]));
  ASSERT_EQ(::write(go[1], "xxx", 3), 3);
  ::close(go[0]);
  ::close(go[1]);
  Counters total;
  for (Engine& e : engines) {
    const Counters c = finish(e);
    total.hits += c.hits;
    total.cross += c.cross;
    total.stored += c.stored;
    total.bad += c.bad;
    total.verified_bytes += c.verified_bytes;
  }
  EXPECT_EQ(total.bad, 0U);
  EXPECT_GT(total.cross, 0U);
  EXPECT_GT(total.stored, kSlots);  // the pool was evicting
  EXPECT_EQ(total.verified_bytes, total.hits * 512 * 2);
  expect_clean(observer);
}

}  // namespace
}  // namespace kvoffload::pool
