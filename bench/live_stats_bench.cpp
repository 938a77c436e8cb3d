// What publishing live statistics costs the hot paths (Note [Live stats]): the Manager's calls and
// the TransferEngine's jobs, each with the region's live page attached (live:1) and without
// (live:0), and with a reader copying the page in a tight loop on another thread (reader:1; a
// real `top` or exporter reads it once a second, so this is the worst case: every write finds its
// cache lines taken by the reader).
//
//   build/<dir>/bin/live_stats_bench
//   build/<dir>/bin/live_stats_bench --benchmark_filter=Manager
//
// Counters: per_op = seconds per call (a Manager call of `keys` keys, or one submitted and
// completed transfer job); BM_PublishOnly is the bare cost of one publication (sequence number,
// six relaxed stores, sequence number) for scale.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/hash.hpp>
#include <kvoffload/live_stats.hpp>
#include <kvoffload/manager.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "live/live_page.hpp"

namespace {

using kvoffload::BlockKey;

constexpr std::uint64_t kChunks = 10'000;  // a 40 MiB region of 4 KiB rows

BlockKey key_of(std::uint64_t i) {
  return BlockKey(kvoffload::splitmix64(i), i);
}

std::string engine_id(const char* what) {
  return std::string("live-bench-") + what + "-" + std::to_string(::getpid());
}

// A reader spinning on the page, as `top` would if it refreshed continuously.
class BusyReader {
 public:
  explicit BusyReader(const kvoffload::Region* region) {
    if (region == nullptr) return;
    thread_ = std::thread([this, region] {
      while (!stop_.load(std::memory_order_relaxed)) {
        benchmark::DoNotOptimize(kvoffload::read_live_stats(*region).scheduler.used);
      }
    });
  }
  ~BusyReader() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  BusyReader(const BusyReader&) = delete;
  BusyReader& operator=(const BusyReader&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void per_op(benchmark::State& state) {
  state.counters["per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(state.range(0) != 0 ? "live" : "no live") +
                 (state.range(2) != 0 ? ", busy reader" : ""));
}

// A full manager of kChunks over a region of kChunks rows (tiny slots): lookup, store cycle (every
// store evicts), load cycle, each call of `keys` keys.
struct ManagerSetup {
  kvoffload::Region region;
  kvoffload::Manager manager;
  std::uint64_t next = 0;

  explicit ManagerSetup(bool live)
      : region(kvoffload::Region::create_or_join(
            {.engine_id = engine_id("manager"),
             .layout = {.num_chunks = kChunks, .slot_bytes = 16, .world_size = 1},
             .populate = false})),
        manager(kvoffload::ManagerConfig{
            .num_chunks = kChunks, .policy = kvoffload::PolicyKind::kArc, .record_events = false}) {
    if (live) manager.publish_live_stats(region);
    std::vector<BlockKey> keys(4096);
    while (next < kChunks) {
      for (auto& k : keys) k = key_of(next++);
      const auto plan = manager.prepare_store(keys);
      manager.complete_store(plan.keys, true);
    }
  }
};

void BM_ManagerLookup(benchmark::State& state) {
  ManagerSetup s(state.range(0) != 0);
  const BusyReader reader(state.range(2) != 0 ? &s.region : nullptr);
  const auto n = static_cast<std::size_t>(state.range(1));
  std::vector<BlockKey> keys(256 * n);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = key_of(s.next - 1 - (i * 7919) % kChunks);
  std::vector<kvoffload::LookupResult> results(n);
  std::size_t b = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(s.manager.lookup(std::span(keys.data() + b * n, n), results));
    b = (b + 1) & 255;
  }
  per_op(state);
}

void BM_ManagerStoreCycle(benchmark::State& state) {
  ManagerSetup s(state.range(0) != 0);
  const BusyReader reader(state.range(2) != 0 ? &s.region : nullptr);
  std::vector<BlockKey> keys(static_cast<std::size_t>(state.range(1)));
  for (auto _ : state) {
    for (auto& k : keys) k = key_of(s.next++);
    const auto plan = s.manager.prepare_store(keys);
    s.manager.complete_store(plan.keys, true);
  }
  per_op(state);
}

void BM_ManagerLoadCycle(benchmark::State& state) {
  ManagerSetup s(state.range(0) != 0);
  const BusyReader reader(state.range(2) != 0 ? &s.region : nullptr);
  std::vector<BlockKey> keys(static_cast<std::size_t>(state.range(1)));
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = key_of(s.next - 1 - i);
  for (auto _ : state) {
    benchmark::DoNotOptimize(s.manager.prepare_load(keys).data());
    s.manager.complete_load(keys);
  }
  per_op(state);
}

// One rank's engine on the host backend: a job of `blocks` 4 KiB blocks (one chunk), submitted
// and waited for; per_op is one job (submit, the copy on the stream's worker, completion).
void BM_EngineJob(benchmark::State& state) {
  const bool live = state.range(0) != 0;
  const auto blocks = static_cast<std::uint32_t>(state.range(1));
  constexpr std::uint64_t kBlock = 4096;
  kvoffload::Region region = kvoffload::Region::create_or_join(
      {.engine_id = engine_id("engine"),
       .layout = {.num_chunks = 64, .slot_bytes = kBlock * blocks, .world_size = 1},
       .rank = 0});
  auto rt = kvoffload::make_runtime("host");
  kvoffload::DeviceBuffer cache = rt->allocate_device(kBlock * blocks * 2);
  kvoffload::KvGroup group;
  group.tensors.push_back({.base = reinterpret_cast<std::uint64_t>(cache.data()),
                           .num_blocks = blocks * 2,
                           .page_bytes = kBlock,
                           .block_stride = kBlock});
  kvoffload::EngineOptions options;
  options.live_stats = live;
  std::optional<kvoffload::TransferEngine> engine;
  engine.emplace(*rt, region, 0, std::vector<kvoffload::KvGroup>{group}, blocks, options);
  const BusyReader reader(state.range(2) != 0 ? &region : nullptr);
  std::vector<std::uint64_t> block_ids(blocks);
  for (std::uint32_t i = 0; i < blocks; ++i) block_ids[i] = i;
  const std::span<const std::uint64_t> groups[] = {block_ids};
  std::uint64_t chunk = 0;
  std::uint64_t id = 0;
  for (auto _ : state) {
    const std::uint64_t chunks[] = {chunk};
    const kvoffload::JobId job{++id};
    engine->submit(job, (id & 1) != 0 ? kvoffload::Direction::kStore : kvoffload::Direction::kLoad,
                   {.chunks = chunks, .group_blocks = groups});
    const kvoffload::JobId ids[] = {job};
    benchmark::DoNotOptimize(engine->wait(ids).front().success);
    chunk = (chunk + 1) % 64;
  }
  per_op(state);
  engine.reset();
  region.close();
}

// The bare publication: what every publishing call adds on its thread.
void BM_PublishOnly(benchmark::State& state) {
  alignas(64) static kvoffload::detail::RankTransferBlock block{};
  std::uint64_t v = 0;
  for (auto _ : state) {
    ++v;
    const kvoffload::detail::LiveWrite write(block.seq);
    kvoffload::detail::LiveWrite::put(block.store.submitted, v);
    kvoffload::detail::LiveWrite::put(block.store.succeeded, v);
    kvoffload::detail::LiveWrite::put(block.store.failed, v);
    kvoffload::detail::LiveWrite::put(block.store.bytes, v);
    kvoffload::detail::LiveWrite::put(block.store.copy_ns, v);
    kvoffload::detail::LiveWrite::put(block.host_registered, 1);
  }
  benchmark::DoNotOptimize(block.seq);
  state.counters["per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

const std::vector<std::int64_t> kLive{0, 1};
const std::vector<std::int64_t> kReader{0};

BENCHMARK(BM_ManagerLookup)
    ->ArgsProduct({kLive, {1, 64}, kReader})
    ->Args({1, 1, 1})
    ->Args({1, 64, 1})
    ->ArgNames({"live", "keys", "reader"})
    ->MinTime(0.2);
BENCHMARK(BM_ManagerStoreCycle)
    ->ArgsProduct({kLive, {1, 64}, kReader})
    ->Args({1, 1, 1})
    ->ArgNames({"live", "keys", "reader"})
    ->MinTime(0.2);
BENCHMARK(BM_ManagerLoadCycle)
    ->ArgsProduct({kLive, {1, 64}, kReader})
    ->Args({1, 1, 1})
    ->ArgNames({"live", "keys", "reader"})
    ->MinTime(0.2);
BENCHMARK(BM_EngineJob)
    ->ArgsProduct({kLive, {1, 16}, kReader})
    ->Args({1, 1, 1})
    ->ArgNames({"live", "blocks", "reader"})
    ->MinTime(0.2);
BENCHMARK(BM_PublishOnly)->MinTime(0.2);

}  // namespace

BENCHMARK_MAIN();
