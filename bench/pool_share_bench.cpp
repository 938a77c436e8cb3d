// Sharing chunks between two engines on one node: through the node pool versus through the remote
// tier on a local redis-server, today's only other way (issue 28's cross-engine benefit).
//
// Engine A stores a batch of 32 chunks (one rank's slot each); engine B loads the same 32 chunks:
//  - BM_ShareLoad/path:0 (node pool): B's lookup pins the batch, each chunk's bytes are copied out
//    of the pool's shared memory into B's buffer (what a host-to-device copy reads), then unpin.
//  - BM_ShareLoad/path:1 (remote tier): B's own RemoteTier gets the 32 values from the local
//    redis-server (loopback TCP, 4 connections) into B's buffers, each value's checksum verified.
// bytes/s counts loaded payload bytes; both check every byte of the batch once (before the loop)
// against A's pattern. The redis-server is started on a free loopback port and stopped at exit.
//
//   build/cpu/bin/pool_share_bench --benchmark_counters_tabular=true
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/node_pool.hpp>
#include <kvoffload/remote_tier.hpp>

#include "remote_servers.hpp"

namespace {

using kvoffload::BlockKey;
using kvoffload::pool::NodePool;
using kvoffload::test::ServerProcess;

constexpr std::size_t kBatch = 32;
std::unique_ptr<ServerProcess> g_redis;

std::filesystem::path bench_dir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = "/dev/shm/kvoffload-share-bench-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

// Chunk i's bytes, as engine A wrote them.
std::byte byte_of(std::size_t chunk, std::uint64_t i) {
  return static_cast<std::byte>((chunk * 131 + i * 7 + (i >> 12)) & 0xFF);
}
void fill(std::span<std::byte> out, std::size_t chunk) {
  for (std::uint64_t i = 0; i < out.size(); ++i) out[i] = byte_of(chunk, i);
}
bool holds(std::span<const std::byte> in, std::size_t chunk) {
  for (std::uint64_t i = 0; i < in.size(); ++i)
    if (in[i] != byte_of(chunk, i)) return false;
  return true;
}

std::vector<BlockKey> batch_keys(std::uint64_t salt) {
  std::vector<BlockKey> keys;
  for (std::size_t i = 0; i < kBatch; ++i) keys.emplace_back(salt, i + 1);
  return keys;
}

kvoffload::pool::PoolOptions pool_options(std::uint64_t bytes, const std::string& engine) {
  kvoffload::pool::PoolOptions o;
  o.name = "share" + std::to_string(bytes);
  o.shm_dir = bench_dir();
  o.engine_id = engine;
  o.geometry = {.slot_bytes = bytes,
                .slot_count = 2 * kBatch,
                .world_size = 1,
                .layout = "bench",
                .dtype = "u8",
                .fingerprint = "share-bench"};
  return o;
}

void load_from_pool(benchmark::State& state, std::uint64_t bytes) {
  auto a = NodePool::attach(pool_options(bytes, "engine-a"));
  auto b = NodePool::attach(pool_options(bytes, "engine-b"));
  const std::vector<BlockKey> keys = batch_keys(bytes);
  const auto plan = a.prepare_stores(keys);
  const std::vector<std::uint32_t> slots(plan.slots.begin(), plan.slots.end());
  for (std::size_t i = 0; i < slots.size(); ++i)
    fill({a.chunk(slots[i], 0), bytes}, plan.positions[i]);
  a.commit_stores(slots);
  std::vector<std::vector<std::byte>> into(kBatch, std::vector<std::byte>(bytes));
  std::vector<std::uint32_t> pinned;
  auto load = [&] {
    const auto got = b.lookup(keys, /*pin=*/true);
    pinned.assign(got.slots.begin(), got.slots.end());
    for (std::size_t i = 0; i < pinned.size(); ++i)
      std::memcpy(into[i].data(), b.chunk(pinned[i], 0), bytes);
    b.unpin(pinned);
    return got.cross_engine_hits;
  };
  if (load() != kBatch) state.SkipWithError("engine B did not hit all of A's chunks");
  for (std::size_t i = 0; i < kBatch; ++i)
    if (!holds(into[i], i)) state.SkipWithError("a chunk loaded from the pool did not verify");
  for (auto _ : state) benchmark::DoNotOptimize(load());
}

std::unique_ptr<kvoffload::RemoteTier> open_tier(std::uint64_t bytes) {
  kvoffload::RemoteTierOptions o;
  o.url = kvoffload::RemoteUrl::parse(g_redis->url());
  o.geometry = {.slot_bytes = bytes, .world_size = 1, .tensor_layout = "bench", .dtype = "u8"};
  o.connections_per_node = 4;
  o.max_inflight_bytes = 64ULL << 20;
  o.max_queued_bytes = 512ULL << 20;
  o.get_timeout = std::chrono::milliseconds(10'000);
  o.put_timeout = std::chrono::milliseconds(10'000);
  return kvoffload::RemoteTier::open(o);
}

void load_from_redis(benchmark::State& state, std::uint64_t bytes) {
  auto a = open_tier(bytes);  // engine A's tier
  auto b = open_tier(bytes);  // engine B's: its own connections
  const std::vector<BlockKey> keys = batch_keys(bytes);
  std::vector<std::vector<std::byte>> rows(kBatch, std::vector<std::byte>(bytes));
  std::vector<kvoffload::TierPut> puts;
  for (std::size_t i = 0; i < kBatch; ++i) {
    fill(rows[i], i);
    puts.push_back({keys[i], rows[i]});
  }
  for (const auto& r : a->put(puts).wait())
    if (r.status != kvoffload::TierItemStatus::kOk) state.SkipWithError(r.detail.c_str());
  std::vector<std::vector<std::byte>> into(kBatch, std::vector<std::byte>(bytes));
  std::vector<kvoffload::TierGet> gets;
  for (std::size_t i = 0; i < kBatch; ++i) gets.push_back({keys[i], into[i]});
  auto load = [&] {
    for (const auto& r : b->get(gets).wait())
      if (r.status != kvoffload::TierItemStatus::kOk) state.SkipWithError(r.detail.c_str());
  };
  load();
  for (std::size_t i = 0; i < kBatch; ++i)
    if (!holds(into[i], i)) state.SkipWithError("a chunk loaded from redis did not verify");
  for (auto _ : state) load();
}

void BM_ShareLoad(benchmark::State& state) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  if (state.range(1) == 0) {
    load_from_pool(state, bytes);
  } else {
    load_from_redis(state, bytes);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * bytes));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t bytes : {256 << 10, 1 << 20, 2 << 20})
    for (const std::int64_t path : {0, 1}) b->Args({bytes, path});
}

BENCHMARK(BM_ShareLoad)->Apply(sizes)->ArgNames({"bytes", "path"})->UseRealTime()->MinTime(1.0);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const std::string missing = kvoffload::test::missing_binary({"redis-server"});
  if (!missing.empty()) {
    (void)std::fprintf(stderr, "pool_share_bench: %s is not installed (Debian: redis-server)\n",
                       missing.c_str());
    return 1;
  }
  int rc = 0;
  try {
    g_redis = std::make_unique<ServerProcess>(ServerProcess::Kind::kRedis,
                                              std::vector<std::string>{"--maxmemory", "2gb"});
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    (void)std::fprintf(stderr, "pool_share_bench: %s\n", e.what());
    rc = 1;
  }
  benchmark::Shutdown();
  g_redis.reset();
  std::error_code ec;
  std::filesystem::remove_all(bench_dir(), ec);
  return rc;
}
