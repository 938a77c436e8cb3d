// The node pool's index cost and cross-engine benefit (docs/DESIGN.md §6.6, issue 28's targets).
//
//  - BM_ManagerCycle: a private Manager's scheduler cycle: lookup of a 64-key request (32
//    resident keys, then 32 new), prepare_store of the 32 new ones (each evicts: the cache is
//    full), complete_store. One private Manager per thread (threads:2 = two private engines).
//  - BM_PoolCycle: the same cycle on one node pool: lookup_and_prepare (one lock acquisition) and
//    commit_stores. threads:N = N tenants of the same pool running concurrently, each with its
//    own NodePool object and keys (no sharing between them: the worst case for contention).
//    Threads of one process contend for the pool's mutex exactly as processes do (the same
//    shared cache lines); only the address spaces differ.
//  - BM_CrossEngine: engine A runs a shared-prefix workload, then engine B replays it; counters
//    a_hits, b_hits and b_cross (hits on chunks A stored) on the pool, b_private_hits and
//    b_private_cross with a private Manager for B (cross is 0 there by construction).
//   build/<dir>/bin/pool_bench   (pools live in a fresh directory under /dev/shm, removed after)
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/hash.hpp>
#include <kvoffload/manager.hpp>
#include <kvoffload/node_pool.hpp>

namespace {

using kvoffload::BlockKey;
using kvoffload::Manager;
using kvoffload::ManagerConfig;
using kvoffload::pool::NodePool;
using kvoffload::pool::PoolOptions;

constexpr std::uint32_t kChunks = 1U << 16;
constexpr std::size_t kHalf = 32;  // resident keys per request; as many new ones

BlockKey key_of(std::uint64_t i) {
  return BlockKey(kvoffload::splitmix64(i), i);
}

std::filesystem::path bench_dir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = "/dev/shm/kvoffload-pool-bench-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

PoolOptions options(const std::string& name, const std::string& engine) {
  PoolOptions o;
  o.name = name;
  o.shm_dir = bench_dir();
  o.engine_id = engine;
  o.geometry.slot_bytes = 64;  // the index is measured, not the bytes: one page per chunk
  o.geometry.slot_count = kChunks;
  o.geometry.world_size = 1;
  o.geometry.layout = "layer_major";
  o.geometry.dtype = "bf16";
  o.geometry.fingerprint = "bench";
  return o;
}

// A request of the cycle: kHalf keys stored by the previous requests, then kHalf new ones.
struct Stream {
  std::uint64_t base = 0;
  std::uint64_t next = 0;
  std::vector<BlockKey> keys = std::vector<BlockKey>(2 * kHalf);
  void make() {
    for (std::size_t i = 0; i < kHalf; ++i) keys[i] = key_of(base + next - kHalf + i);
    for (std::size_t i = 0; i < kHalf; ++i) keys[kHalf + i] = key_of(base + next + i);
    next += kHalf;
  }
};

void label(benchmark::State& state, std::uint64_t hits, std::uint64_t stored,
           std::uint64_t evicted) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));  // cycles
  // Per cycle, so a reader sees that both sides do the same work (32 hits, 32 stores, 32
  // evictions).
  const auto per = [&](std::uint64_t x) {
    return benchmark::Counter(static_cast<double>(x), benchmark::Counter::kAvgIterations);
  };
  state.counters["hits"] = per(hits);
  state.counters["stored"] = per(stored);
  state.counters["evicted"] = per(evicted);
  state.counters["per_cycle"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_ManagerCycle(benchmark::State& state) {
  ManagerConfig config;
  config.num_chunks = kChunks;
  config.record_events = false;
  Manager m(config);
  Stream s;
  s.base = static_cast<std::uint64_t>(state.thread_index()) << 40;
  s.next = kHalf;
  // Fill the cache, so every store evicts.
  while (s.next < kChunks + 2 * kHalf) {
    s.make();
    const auto plan = m.prepare_store(s.keys);
    m.complete_store(plan.keys, true);
  }
  std::uint64_t hits = 0, stored = 0, evicted = 0;
  for (auto _ : state) {
    s.make();
    const std::size_t h = m.lookup(s.keys);
    const auto plan = m.prepare_store(std::span(s.keys).subspan(h));
    m.complete_store(plan.keys, true);
    hits += h;
    stored += plan.keys.size();
    evicted += plan.evicted.size();
  }
  label(state, hits, stored, evicted);
}

// The pools of BM_PoolCycle: one per thread count, every tenant attached before any runs.
std::vector<std::unique_ptr<NodePool>>& pool_tenants(int threads) {
  static std::mutex mu;
  static std::map<int, std::vector<std::unique_ptr<NodePool>>> all;
  const std::lock_guard<std::mutex> lock(mu);
  auto& v = all[threads];
  if (v.empty()) {
    for (int t = 0; t < threads; ++t)
      v.push_back(std::make_unique<NodePool>(NodePool::attach(
          options("cycle" + std::to_string(threads), "engine" + std::to_string(t)))));
  }
  return v;
}

void BM_PoolCycle(benchmark::State& state) {
  NodePool& p = *pool_tenants(state.threads())[static_cast<std::size_t>(state.thread_index())];
  Stream s;
  s.base = static_cast<std::uint64_t>(state.thread_index()) << 40;
  s.next = kHalf;
  std::vector<std::uint32_t> slots;
  // Each tenant fills its share of the pool, so stores evict from the start.
  while (s.next < kChunks / static_cast<std::uint64_t>(state.threads()) + 2 * kHalf) {
    s.make();
    const auto out = p.prepare_stores(s.keys);
    slots.assign(out.slots.begin(), out.slots.end());
    p.commit_stores(slots);
  }
  std::uint64_t hits = 0, stored = 0, evicted = 0;
  for (auto _ : state) {
    s.make();
    const NodePool::Cycle c = p.lookup_and_prepare(s.keys, false);
    slots.assign(c.store.slots.begin(), c.store.slots.end());
    p.commit_stores(slots);
    hits += c.lookup.hits;
    stored += slots.size();
    evicted += c.store.evicted.size();
  }
  label(state, hits, stored, evicted);
}

// A shared-prefix workload: a system prompt of 16 chunks, then 16 of one of 64 documents.
std::vector<std::vector<BlockKey>> workload() {
  std::mt19937_64 rng(42);
  std::vector<std::vector<BlockKey>> reqs(2000);
  for (auto& r : reqs) {
    for (std::uint64_t i = 0; i < 16; ++i) r.push_back(key_of(i));
    const std::uint64_t d = rng() % 64;
    for (std::uint64_t i = 0; i < 16; ++i) r.push_back(key_of(1000 + d * 16 + i));
  }
  return reqs;
}

void BM_CrossEngine(benchmark::State& state) {
  const auto reqs = workload();
  std::uint64_t a_hits = 0, b_hits = 0, b_cross = 0, bp_hits = 0;
  std::vector<std::uint32_t> slots;
  for (auto _ : state) {
    a_hits = b_hits = b_cross = bp_hits = 0;
    {
      auto a = NodePool::attach(options("cross", "engine-a"));
      auto b = NodePool::attach(options("cross", "engine-b"));
      for (NodePool* p : {&a, &b}) {
        for (const auto& r : reqs) {
          const NodePool::Cycle c = p->lookup_and_prepare(r, false);
          slots.assign(c.store.slots.begin(), c.store.slots.end());
          p->commit_stores(slots);
          (p == &a ? a_hits : b_hits) += c.lookup.hits;
          if (p == &b) b_cross += c.lookup.cross_engine_hits;
        }
      }
    }
    ManagerConfig config;
    config.num_chunks = kChunks;
    config.record_events = false;
    Manager b_private(config);
    for (const auto& r : reqs) {
      const std::size_t hits = b_private.lookup(r);
      const auto plan = b_private.prepare_store(std::span(r).subspan(hits));
      b_private.complete_store(plan.keys, true);
      bp_hits += hits;
    }
  }
  state.counters["a_hits"] = static_cast<double>(a_hits);
  state.counters["b_hits"] = static_cast<double>(b_hits);
  state.counters["b_cross"] = static_cast<double>(b_cross);
  state.counters["b_cross_over_a_hits"] =
      static_cast<double>(b_cross) / static_cast<double>(a_hits);
  state.counters["b_private_hits"] = static_cast<double>(bp_hits);
  state.counters["b_private_cross"] = 0;  // a private Manager holds only B's own stores
}

BENCHMARK(BM_ManagerCycle)->Threads(1)->Threads(2)->MinTime(0.5)->UseRealTime();
BENCHMARK(BM_PoolCycle)->Threads(1)->Threads(2)->MinTime(0.5)->UseRealTime();
BENCHMARK(BM_CrossEngine)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(bench_dir(), ec);
  return 0;
}
