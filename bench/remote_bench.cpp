// Remote tier throughput on loopback, beside redis-benchmark's own SET/GET for the same value
// size. The bench starts its servers itself (one redis-server, a 3-master Redis Cluster made
// with `redis-cli --cluster create`, and a redis-server on a TLS port only with a password, its
// certificates made with openssl) on free loopback ports and stops them at exit.
//
//   build/cpu/bin/remote_bench --benchmark_counters_tabular=true
//
// BM_RemotePut / BM_RemoteGet: a batch of 32 chunks (one value each, world size 1) per iteration,
// args = {chunk bytes, store: 0 standalone, 1 cluster, 2 standalone over TLS with AUTH}; bytes/s
// counts payload bytes.
// BM_RedisBenchmark: one redis-benchmark run per {test 0 SET / 1 GET, value bytes, store}, with
// the same number of connections per node and a pipeline depth of 8; its requests/s x value bytes
// is reported as the "bytes_per_second" counter (compare with the remote tier's).
#include <cstdio>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/remote_tier.hpp>

#include "remote_servers.hpp"
#include "test_certs.hpp"

namespace {

using kvoffload::BlockKey;
using kvoffload::test::RedisCluster;
using kvoffload::test::ServerProcess;

constexpr std::size_t kBatch = 32;
constexpr unsigned kConnections = 4;

constexpr const char* kTlsPassword = "remote-bench-pw";

std::unique_ptr<ServerProcess> g_redis;
std::unique_ptr<RedisCluster> g_cluster;
std::unique_ptr<kvoffload::test::TestCertificates> g_certs;
std::unique_ptr<ServerProcess> g_tls;

std::string url_of(int store) {
  if (store == 2) {
    return "rediss://:" + std::string(kTlsPassword) +
           "@127.0.0.1:" + std::to_string(g_tls->port()) + "?tls_ca=" + g_certs->ca();
  }
  return store == 0 ? g_redis->url() : g_cluster->url();
}

std::unique_ptr<kvoffload::RemoteTier> open_tier(int store, std::uint64_t bytes) {
  kvoffload::RemoteTierOptions o;
  o.url = kvoffload::RemoteUrl::parse(url_of(store));
  o.geometry = {.slot_bytes = bytes, .world_size = 1, .tensor_layout = "bench", .dtype = "u8"};
  o.connections_per_node = kConnections;
  o.max_inflight_bytes = 64ULL << 20;
  o.max_queued_bytes = 512ULL << 20;
  o.get_timeout = std::chrono::milliseconds(10'000);
  o.put_timeout = std::chrono::milliseconds(10'000);
  return kvoffload::RemoteTier::open(o);
}

struct Rows {
  std::vector<std::vector<std::byte>> data;
  std::vector<BlockKey> keys;
  Rows(std::uint64_t bytes, std::uint64_t salt) {
    for (std::size_t i = 0; i < kBatch; ++i) {
      data.emplace_back(bytes, static_cast<std::byte>(i + salt));
      keys.emplace_back(salt, i);
    }
  }
};

void BM_RemotePut(benchmark::State& state) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  auto tier = open_tier(static_cast<int>(state.range(1)), bytes);
  Rows rows(bytes, 1);
  std::vector<kvoffload::TierPut> puts;
  for (std::size_t i = 0; i < kBatch; ++i) puts.push_back({rows.keys[i], rows.data[i]});
  for (auto _ : state) {
    const auto results = tier->put(puts).wait();
    for (const auto& r : results) {
      if (r.status != kvoffload::TierItemStatus::kOk) state.SkipWithError(r.detail.c_str());
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * bytes));
}

void BM_RemoteGet(benchmark::State& state) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  auto tier = open_tier(static_cast<int>(state.range(1)), bytes);
  Rows rows(bytes, 2);
  std::vector<kvoffload::TierPut> puts;
  std::vector<kvoffload::TierGet> gets;
  std::vector<std::vector<std::byte>> into(kBatch, std::vector<std::byte>(bytes));
  for (std::size_t i = 0; i < kBatch; ++i) {
    puts.push_back({rows.keys[i], rows.data[i]});
    gets.push_back({rows.keys[i], into[i]});
  }
  (void)tier->put(puts).wait();
  for (auto _ : state) {
    const auto results = tier->get(gets).wait();
    for (const auto& r : results) {
      if (r.status != kvoffload::TierItemStatus::kOk) state.SkipWithError(r.detail.c_str());
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * bytes));
}

// redis-benchmark -t set|get -d BYTES -c <connections> -P 8 -n N --csv [--cluster]
void BM_RedisBenchmark(benchmark::State& state) {
  const bool get = state.range(0) == 1;
  const auto bytes = static_cast<std::uint64_t>(state.range(1));
  const int store = static_cast<int>(state.range(2));
  const ServerProcess& node = store == 0 ? *g_redis : g_cluster->node(0);
  const unsigned clients = store == 0 ? kConnections : kConnections * 3;
  const std::uint64_t n = std::max<std::uint64_t>(200, (256ULL << 20) / bytes);
  double rps = 0;
  for (auto _ : state) {
    std::vector<std::string> argv = {kvoffload::test::which("redis-benchmark"),
                                     "-h",
                                     "127.0.0.1",
                                     "-p",
                                     std::to_string(node.port()),
                                     "-t",
                                     get ? "set,get" : "set",
                                     "-d",
                                     std::to_string(bytes),
                                     "-c",
                                     std::to_string(clients),
                                     "-P",
                                     "8",
                                     "-n",
                                     std::to_string(n),
                                     "--csv"};
    if (store == 1) argv.emplace_back("--cluster");
    std::string out;
    if (kvoffload::test::run_command(argv, &out) != 0) {
      state.SkipWithError(("redis-benchmark failed: " + out).c_str());
      return;
    }
    // Lines: "test","rps",... ; take the row of the test measured.
    std::istringstream lines(out);
    std::string line;
    const std::string want = get ? "\"GET\"" : "\"SET\"";
    while (std::getline(lines, line)) {
      if (line.rfind(want, 0) == 0) {
        const auto a = line.find(",\"") + 2;
        rps = std::stod(line.substr(a, line.find('"', a) - a));
      }
    }
  }
  // In 1024-based units like the tier's SetBytesProcessed, so the two columns compare directly.
  state.counters["bytes_per_second"] =
      benchmark::Counter(rps * static_cast<double>(bytes), benchmark::Counter::kDefaults,
                         benchmark::Counter::OneK::kIs1024);
  state.counters["requests_per_second"] = rps;
}

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t store : {0, 1, 2}) {
    for (const std::int64_t bytes : {256 << 10, 512 << 10, 1 << 20, 2 << 20})
      b->Args({bytes, store});
  }
}

void redis_benchmark_sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t store : {0, 1}) {
    for (const std::int64_t test : {0, 1}) {
      for (const std::int64_t bytes : {256 << 10, 512 << 10, 1 << 20, 2 << 20}) {
        b->Args({test, bytes, store});
      }
    }
  }
}

BENCHMARK(BM_RemotePut)->Apply(sizes)->ArgNames({"bytes", "store"})->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_RemoteGet)->Apply(sizes)->ArgNames({"bytes", "store"})->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_RedisBenchmark)
    ->Apply(redis_benchmark_sizes)
    ->ArgNames({"get", "bytes", "cluster"})
    ->Iterations(1)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const std::string missing =
      kvoffload::test::missing_binary({"redis-server", "redis-cli", "redis-benchmark", "openssl"});
  if (!missing.empty()) {
    (void)std::fprintf(
        stderr, "remote_bench: %s is not installed (Debian: redis-server redis-tools openssl)\n",
        missing.c_str());
    return 1;
  }
  try {
    g_redis = std::make_unique<ServerProcess>(ServerProcess::Kind::kRedis,
                                              std::vector<std::string>{"--maxmemory", "2gb"});
    g_cluster = std::make_unique<RedisCluster>();
    g_certs = std::make_unique<kvoffload::test::TestCertificates>();
    const int tls_port = kvoffload::test::free_port();
    std::vector<std::string> tls_args = g_certs->redis_args(tls_port, false);
    tls_args.insert(tls_args.end(), {"--maxmemory", "2gb", "--requirepass", kTlsPassword});
    g_tls = std::make_unique<ServerProcess>(ServerProcess::Kind::kRedis, tls_args, tls_port);
  } catch (const std::exception& e) {  // a server or the certificates could not be made
    (void)std::fprintf(stderr, "remote_bench: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_tls.reset();
  g_certs.reset();
  g_cluster.reset();  // stops the servers
  g_redis.reset();
  return 0;
}
