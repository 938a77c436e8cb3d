// Manager throughput: lookup, store cycle (prepare + complete, evicting when full), touch and
// load cycle at 10^4, 10^5 and 10^6 chunks for LRU and ARC, and batch eviction time against the
// batch size (16 .. 4096 at 10^6 chunks: time per key should stay flat, i.e. linear in the batch).
//
// Every benchmark runs on a full manager (every slot holds a key), so each store evicts.
// Counters: items_per_second = keys per second; per_key = seconds per key. policy:0 is LRU,
// policy:1 is ARC (also the label).
//   build/<dir>/bin/manager_bench            (about 30 s of CPU; each case runs >= 0.1 s)
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/hash.hpp>
#include <kvoffload/manager.hpp>

namespace {

using kvoffload::BlockKey;
using kvoffload::Manager;
using kvoffload::ManagerConfig;
using kvoffload::PolicyKind;

// Key i: a well-spread 128-bit value, as a real block hash would be.
BlockKey key_of(std::uint64_t i) {
  return BlockKey(kvoffload::splitmix64(i), i);
}

constexpr std::size_t kBatch = 64;  // keys per call (a request of 64 chunks)

struct Fixture {
  std::unique_ptr<Manager> manager;
  std::uint64_t chunks = 0;
  std::uint64_t next_id = 0;  // keys [next_id - chunks, next_id) were stored last
};

// One full manager per (policy, chunks), shared by the benchmarks (filling 10^6 takes a while).
Fixture& fixture(PolicyKind policy, std::uint64_t chunks) {
  static std::map<std::pair<int, std::uint64_t>, Fixture> cache;
  Fixture& f = cache[{static_cast<int>(policy), chunks}];
  if (f.manager) return f;
  ManagerConfig config;
  config.num_chunks = chunks;
  config.policy = policy;
  config.record_events = false;
  f.manager = std::make_unique<Manager>(config);
  f.chunks = chunks;
  std::vector<BlockKey> keys(4096);
  while (f.next_id < chunks) {
    const std::size_t n = std::min<std::uint64_t>(keys.size(), chunks - f.next_id);
    for (std::size_t i = 0; i < n; ++i) keys[i] = key_of(f.next_id + i);
    const auto plan = f.manager->prepare_store(std::span(keys.data(), n));
    f.manager->complete_store(plan.keys, true);
    f.next_id += n;
  }
  return f;
}

PolicyKind policy_arg(const benchmark::State& state) {
  return state.range(0) == 0 ? PolicyKind::kLru : PolicyKind::kArc;
}

void label(benchmark::State& state, std::size_t keys_per_iteration) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * keys_per_iteration));
  // Seconds per key (printed with an SI prefix: "21.5n" is 21.5 ns).
  state.counters["per_key"] =
      benchmark::Counter(static_cast<double>(state.iterations() * keys_per_iteration),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(state.range(0) == 0 ? "lru" : "arc");
}

// Random recent keys (mostly resident; some were evicted by touch reordering) in 256 batches.
std::vector<BlockKey> recent_keys(Fixture& f, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<BlockKey> keys(256 * kBatch);
  for (auto& k : keys) k = key_of(f.next_id - 1 - rng() % f.chunks);
  return keys;
}

void BM_Lookup(benchmark::State& state) {
  Fixture& f = fixture(policy_arg(state), static_cast<std::uint64_t>(state.range(1)));
  const auto keys = recent_keys(f, 1);
  std::vector<kvoffload::LookupResult> results(kBatch);
  std::size_t b = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        f.manager->lookup(std::span(keys.data() + b * kBatch, kBatch), results));
    b = (b + 1) & 255;
  }
  label(state, kBatch);
}

void BM_Touch(benchmark::State& state) {
  Fixture& f = fixture(policy_arg(state), static_cast<std::uint64_t>(state.range(1)));
  const auto keys = recent_keys(f, 2);
  std::size_t b = 0;
  for (auto _ : state) {
    f.manager->touch(std::span(keys.data() + b * kBatch, kBatch));
    b = (b + 1) & 255;
  }
  label(state, kBatch);
}

// prepare_store of new keys (each evicts one) + complete_store.
void store_cycle(benchmark::State& state, Fixture& f, std::size_t batch) {
  std::vector<BlockKey> keys(batch);
  for (auto _ : state) {
    for (std::size_t i = 0; i < batch; ++i) keys[i] = key_of(f.next_id + i);
    f.next_id += batch;
    const auto plan = f.manager->prepare_store(keys);
    if (!plan.ok() || plan.evicted.size() != batch) state.SkipWithError("store did not evict");
    f.manager->complete_store(plan.keys, true);
  }
  label(state, batch);
}

void BM_StoreCycle(benchmark::State& state) {
  Fixture& f = fixture(policy_arg(state), static_cast<std::uint64_t>(state.range(1)));
  store_cycle(state, f, kBatch);
}

void BM_LoadCycle(benchmark::State& state) {
  Fixture& f = fixture(policy_arg(state), static_cast<std::uint64_t>(state.range(1)));
  // The most recent keys are resident under both policies (nothing touched them away).
  std::vector<BlockKey> keys(kBatch);
  for (std::size_t i = 0; i < kBatch; ++i) keys[i] = key_of(f.next_id - 1 - i);
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.manager->prepare_load(keys).data());
    f.manager->complete_load(keys);
  }
  label(state, kBatch);
}

// Batch eviction against batch size at 10^6 chunks.
void BM_EvictBatch(benchmark::State& state) {
  Fixture& f = fixture(policy_arg(state), 1'000'000);
  store_cycle(state, f, static_cast<std::size_t>(state.range(1)));
}

const std::vector<std::int64_t> kPolicies{0, 1};
const std::vector<std::int64_t> kSizes{10'000, 100'000, 1'000'000};

BENCHMARK(BM_Lookup)
    ->ArgsProduct({kPolicies, kSizes})
    ->ArgNames({"policy", "chunks"})
    ->MinTime(0.1);
BENCHMARK(BM_Touch)->ArgsProduct({kPolicies, kSizes})->ArgNames({"policy", "chunks"})->MinTime(0.1);
BENCHMARK(BM_StoreCycle)
    ->ArgsProduct({kPolicies, kSizes})
    ->ArgNames({"policy", "chunks"})
    ->MinTime(0.1);
BENCHMARK(BM_LoadCycle)
    ->ArgsProduct({kPolicies, kSizes})
    ->ArgNames({"policy", "chunks"})
    ->MinTime(0.1);
BENCHMARK(BM_EvictBatch)
    ->ArgsProduct({kPolicies, {16, 64, 256, 1024, 4096}})
    ->ArgNames({"policy", "batch"})
    ->MinTime(0.1);

}  // namespace

BENCHMARK_MAIN();
