// Region bring-up: create + populate of a 1 GiB region in /dev/shm (the real target), with 1 and 2
// populate threads, the MADV_POPULATE_WRITE path and the page-touch fallback (forced through a
// Syscalls table whose madvise refuses MADV_POPULATE_WRITE with EINVAL, as kernels < 5.14 do),
// ranked (world size 2, rank 0 populates its half) and unranked (the whole region).
// Reference: first touch (memset) of the same number of bytes of fresh anonymous memory, which is
// the machine's page-fault + zeroing rate that populate should reach (REFERENCE.md targets).
//
// Bytes/s counts the bytes this process populated. Teardown (munmap, unlink) is not timed.
//   build/<preset>/bin/region_bench --benchmark_min_time=0.01
#include <kvoffload/region.hpp>
#include <kvoffload/syscalls.hpp>

#include <benchmark/benchmark.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older libc headers lack it
#endif

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kRegionBytes = std::uint64_t{1} << 30;
constexpr std::uint64_t kSlotBytes = kMiB;  // world size 2: a 2 MiB row, 512 chunks
constexpr std::uint32_t kWorldSize = 2;

std::filesystem::path g_shm_dir;  // unique directory under /dev/shm, removed at exit

// The fallback path: madvise refuses MADV_POPULATE_WRITE like a pre-5.14 kernel; any other advice
// goes to the real call.
int madvise_without_populate_write(void* ctx, void* addr, std::size_t len, int advice) {
  if (advice == MADV_POPULATE_WRITE) {
    errno = EINVAL;
    return -1;
  }
  return kvoffload::real_syscalls().madvise(ctx, addr, len, advice);
}

const kvoffload::Syscalls& fallback_syscalls() {
  static const kvoffload::Syscalls table = [] {
    kvoffload::Syscalls t = kvoffload::real_syscalls();
    t.madvise = &madvise_without_populate_write;
    return t;
  }();
  return table;
}

// Args: threads, fallback (0|1), unranked (0|1).
void BM_RegionCreatePopulate(benchmark::State& state) {
  const auto threads = static_cast<unsigned>(state.range(0));
  const bool fallback = state.range(1) != 0;
  const bool unranked = state.range(2) != 0;

  kvoffload::RegionOptions opts;
  opts.engine_id = "bench-" + std::to_string(getpid());
  opts.layout = {.num_chunks = kRegionBytes / (kSlotBytes * kWorldSize),
                 .slot_bytes = kSlotBytes,
                 .world_size = kWorldSize,
                 .replicated = false};
  if (!unranked) opts.rank = 0;
  opts.shm_dir = g_shm_dir;
  opts.populate_threads = threads;
  if (fallback) opts.syscalls = &fallback_syscalls();

  std::uint64_t populated = 0;
  double populate_seconds = 0;
  for (auto _ : state) {
    std::optional<kvoffload::Region> created;
    try {
      created.emplace(kvoffload::Region::create_or_join(opts));
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    kvoffload::Region& region = *created;
    const kvoffload::PopulateReport& report = region.populate_report();
    const auto expected = fallback ? kvoffload::PopulateMethod::kFallback : kvoffload::PopulateMethod::kMadvise;
    if (report.method != expected || region.role() != kvoffload::RegionRole::kCreator) {
      state.SkipWithError(("populate used " + std::string(kvoffload::to_string(report.method)) +
                           " as " + std::string(kvoffload::to_string(region.role())) +
                           " (this kernel may lack MADV_POPULATE_WRITE, or a region was left over)")
                              .c_str());
      break;
    }
    populated += report.bytes;
    populate_seconds += report.seconds;
    state.PauseTiming();
    region.close();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(populated));
  if (state.iterations() > 0) {
    state.counters["populate_MiB"] = static_cast<double>(populated / state.iterations()) / kMiB;
    state.counters["populate_s"] = populate_seconds / static_cast<double>(state.iterations());
  }
  state.SetLabel(std::string(fallback ? "fallback" : "madvise") + (unranked ? " unranked" : " ranked r0/2"));
}

// Args: MiB, threads. First touch of fresh anonymous memory, split among the threads.
void BM_FirstTouchMemset(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kMiB;
  const auto threads = static_cast<unsigned>(state.range(1));
  for (auto _ : state) {
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      break;
    }
    auto* base = static_cast<unsigned char*>(mem);
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) {
      pool.emplace_back([=] {
        std::memset(base + bytes * t / threads, 1, bytes * (t + 1) / threads - bytes * t / threads);
      });
    }
    std::memset(base, 1, bytes / threads);
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(base[bytes - 1]);
    state.PauseTiming();
    munmap(mem, bytes);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * state.iterations()));
}

// Few iterations: each one maps and faults in a whole GiB, and the run should stay under a minute.
BENCHMARK(BM_RegionCreatePopulate)
    ->ArgNames({"threads", "fallback", "unranked"})
    ->ArgsProduct({{1, 2}, {0, 1}, {0, 1}})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_FirstTouchMemset)
    ->ArgNames({"MiB", "threads"})
    ->ArgsProduct({{static_cast<std::int64_t>(kRegionBytes / kMiB / 2), static_cast<std::int64_t>(kRegionBytes / kMiB)},
                   {1, 2}})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const char* base = std::getenv("KVOFFLOAD_BENCH_SHM_DIR");
  std::string tmpl = std::string(base != nullptr ? base : "/dev/shm") + "/kvoffload_bench_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "region_bench: mkdtemp %s: %s\n", tmpl.c_str(), std::strerror(errno));
    return 1;
  }
  g_shm_dir = tmpl;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(g_shm_dir, ec);
  return 0;
}
