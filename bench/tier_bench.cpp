// File tier throughput: put and get of whole records, 256 KiB to 2 MiB, with O_DIRECT (kAuto:
// O_DIRECT where the filesystem takes it) and buffered I/O. Each iteration is one batch of
// kBatch records submitted at once and waited for (as the tiered store offloads a request's
// chunks), on the tier's 4 I/O threads.
//
// Counters: bytes_per_second = payload bytes moved; direct = 1 when O_DIRECT was really in use
// at the end of the case (0 when the filesystem refused it and the tier fell back).
// Puts use fresh keys every iteration (a held key is not rewritten); capacity (1 GiB, capped by
// the filesystem's free space) evicts the oldest. Gets read the same kBatch records again: in
// buffered mode they come from the page cache, with O_DIRECT from the device.
// BM_Crc32c: the records' checksum alone, per record size (built from its source: it is internal).
//   KVOFFLOAD_BENCH_DIR=/var/tmp build/cpu/bin/tier_bench     (a directory on the disk to test;
//                                                               default /var/tmp)
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/file_tier.hpp>

#include "tier/file/crc32c.hpp"

namespace {

using kvoffload::BlockKey;
using kvoffload::DirectIoMode;
using kvoffload::FileTier;
using kvoffload::FileTierOptions;
using kvoffload::TierGet;
using kvoffload::TierPut;

constexpr std::size_t kBatch = 32;

std::filesystem::path bench_root() {
  const char* env = std::getenv("KVOFFLOAD_BENCH_DIR");
  const std::filesystem::path base = env != nullptr && *env != '\0' ? env : "/var/tmp";
  return base / ("kvoffload-tier-bench-" + std::to_string(::getpid()));
}

struct Tier {
  std::unique_ptr<FileTier> tier;
  std::filesystem::path root;
  explicit Tier(DirectIoMode mode) : root(bench_root()) {
    std::filesystem::remove_all(root);
    FileTierOptions o;
    o.root = root;
    o.capacity_bytes = 1ULL << 30;
    o.io_threads = 4;
    o.direct_io = mode;
    o.name = "bench";
    tier = FileTier::open(o);
  }
  ~Tier() {
    tier->close();
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

DirectIoMode mode_of(std::int64_t arg) {
  return arg == 0 ? DirectIoMode::kAuto : DirectIoMode::kBuffered;
}

void BM_Put(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Tier t(mode_of(state.range(1)));
  std::vector<std::byte> payload(bytes, std::byte{0x5A});
  std::vector<TierPut> puts(kBatch);
  std::uint64_t next = 1;
  for (auto _ : state) {
    for (auto& p : puts) p = TierPut{BlockKey::from_u64(next++), payload};
    for (const auto& r : t.tier->put(puts).wait()) {
      if (r.status != kvoffload::TierItemStatus::kOk) {
        state.SkipWithError(("put failed: " + r.detail).c_str());
        return;
      }
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * bytes));
  state.counters["direct"] = t.tier->stats().direct_io ? 1 : 0;
  state.SetLabel(state.range(1) == 0 ? "odirect" : "buffered");
}

void BM_Get(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Tier t(mode_of(state.range(1)));
  std::vector<std::byte> payload(bytes, std::byte{0x5A});
  std::vector<TierPut> puts(kBatch);
  for (std::size_t i = 0; i < kBatch; ++i) puts[i] = TierPut{BlockKey::from_u64(i + 1), payload};
  (void)t.tier->put(puts).wait();
  std::vector<std::vector<std::byte>> out(kBatch, std::vector<std::byte>(bytes));
  std::vector<TierGet> gets(kBatch);
  for (std::size_t i = 0; i < kBatch; ++i) gets[i] = TierGet{BlockKey::from_u64(i + 1), out[i]};
  for (auto _ : state) {
    for (const auto& r : t.tier->get(gets).wait()) {
      if (r.status != kvoffload::TierItemStatus::kOk) {
        state.SkipWithError(("get failed: " + r.detail).c_str());
        return;
      }
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * bytes));
  state.counters["direct"] = t.tier->stats().direct_io ? 1 : 0;
  state.SetLabel(state.range(1) == 0 ? "odirect" : "buffered");
}

// The records' checksum alone (one thread, data in cache): what verifying costs a load per record.
void BM_Crc32c(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::byte>(i * 131 + (i >> 9));
  std::uint32_t crc = 0;
  for (auto _ : state) {
    crc = kvoffload::detail::crc32c(data, crc);
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Crc32c)->Arg(64 << 10)->Arg(256 << 10)->Arg(1 << 20)->Arg(4 << 20)->Unit(
    benchmark::kMicrosecond);

// record bytes x {0: O_DIRECT (auto), 1: buffered}
BENCHMARK(BM_Put)
    ->ArgsProduct({{256 << 10, 512 << 10, 1 << 20, 2 << 20}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Get)
    ->ArgsProduct({{256 << 10, 512 << 10, 1 << 20, 2 << 20}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
