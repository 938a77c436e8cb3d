// Region bring-up: create + populate of a 1 GiB region in /dev/shm (the real target), with 1 and 2
// populate threads, the MADV_POPULATE_WRITE path and the page-touch fallback (forced through a
// Syscalls table whose madvise refuses MADV_POPULATE_WRITE with EINVAL, as kernels < 5.14 do),
// ranked (world size 2, rank 0 populates its half) and unranked (the whole region).
// Reference: first touch (memset) of the same number of bytes of fresh anonymous memory, which is
// the machine's page-fault + zeroing rate that populate should reach (targets:
// docs/PERFORMANCE.md).
//
// Bytes/s counts the bytes this process populated. Teardown (munmap, unlink) is not timed.
//
// BM_RegionBringupRanks is the engine's view (issue 9): W processes, one per rank, started
// together, each creating or joining the same 1 GiB region (1 MiB slot per rank per row) and
// populating its own columns; the time is from the start signal until the last rank is up.
//
// BM_RegionAttachDetach is the fixed cost of one attach and detach of a 1-chunk region (system
// calls, header, liveness lock, the role of Note [Owners]), as a creator or as a joiner.
//   build/<preset>/bin/region_bench --benchmark_min_time=0.01
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/region.hpp>

#include "sys/syscalls.hpp"

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
    const auto expected =
        fallback ? kvoffload::PopulateMethod::kFallback : kvoffload::PopulateMethod::kMadvise;
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
    state.counters["populate_MiB"] =
        static_cast<double>(populated) / static_cast<double>(state.iterations()) / kMiB;
    state.counters["populate_s"] = populate_seconds / static_cast<double>(state.iterations());
  }
  state.SetLabel(std::string(fallback ? "fallback" : "madvise") +
                 (unranked ? " unranked" : " ranked r0/2"));
}

// Args: join (0: each iteration creates a fresh 1-chunk region and, last out, removes it; 1: it
// joins a region a keeper (rank 1) holds, and leaves it). Populate has one page to do, so this is
// the fixed cost of an attach + detach: the system calls of create or join, the liveness lock and
// taking and releasing the role (Note [Owners]).
void BM_RegionAttachDetach(benchmark::State& state) {
  const bool join = state.range(0) != 0;
  kvoffload::RegionOptions opts;
  opts.engine_id = "bench-attach-" + std::to_string(getpid());
  opts.layout = {.num_chunks = 1, .slot_bytes = 4096, .world_size = 2, .replicated = false};
  opts.rank = 0;
  opts.shm_dir = g_shm_dir;
  try {
    std::optional<kvoffload::Region> keeper;
    if (join) {
      auto k = opts;
      k.rank = 1;
      keeper.emplace(kvoffload::Region::create_or_join(k));
    }
    for (auto _ : state) {
      kvoffload::Region region = kvoffload::Region::create_or_join(opts);
      if (region.role() !=
              (join ? kvoffload::RegionRole::kJoiner : kvoffload::RegionRole::kCreator) ||
          !region.close()) {
        state.SkipWithError("unexpected role, or close failed (a region was left over?)");
        break;
      }
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  state.SetLabel(join ? "join + leave" : "create + remove");
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

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool read_all(int fd, void* buf, std::size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

enum Scheme : int {
  kKvoffload = 0,  // Region::create_or_join, `threads` populate threads per rank
  kSparse = 1,     // reference: vLLM's SharedOffloadRegion (sparse file, each rank populates)
  kWholeFallocate =
      2  // reference: kvoffload before issue 9 (rank 0 fallocates the whole file first)
};

// The reference schemes, as plain system calls: a sparse file of the region's size exists (made by
// the parent before the clock starts; ftruncate is free); rank 0 of kWholeFallocate fallocates it
// whole and then releases the others; every rank maps the file and MADV_POPULATE_WRITEs its own
// columns row by row, like the Region does.
bool reference_rank(const std::string& path, Scheme scheme, std::uint32_t world, std::uint32_t rank,
                    int allocated_rd, int allocated_wr) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = true;
  if (scheme == kWholeFallocate) {
    if (rank == 0) {
      ok = fallocate(fd, 0, 0, static_cast<off_t>(kRegionBytes)) == 0;
      const std::string release(world - 1, 'a');
      ok = write(allocated_wr, release.data(), release.size()) ==
               static_cast<ssize_t>(release.size()) &&
           ok;
    } else {
      char c = 0;
      ok = read_all(allocated_rd, &c, 1);
    }
  }
  void* map = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return false;
  }
  auto* base = static_cast<char*>(map);
  const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t row = kSlotBytes * world;
  for (std::uint64_t c = 0; ok && c < kRegionBytes / row; ++c) {
    const std::uint64_t off = c * row + rank * kSlotBytes;
    const std::uint64_t begin = off / page * page;
    const std::uint64_t end = (off + kSlotBytes + page - 1) / page * page;
    ok = madvise(base + begin, end - begin, MADV_POPULATE_WRITE) == 0;
  }
  munmap(map, kRegionBytes);
  close(fd);
  return ok;
}

// Args: scheme, W (ranks = processes), threads (populate threads per rank; kvoffload only). Each
// iteration forks W children that wait on a pipe; the parent releases them together and times
// until the last one reports its region up (steady_clock is CLOCK_MONOTONIC, one clock for every
// process). The ranks stay attached until all are up, as an engine's do; teardown is not timed.
// slowest_rank_s is the largest of the ranks' own create/join + populate seconds (the issue's
// measure); the benchmark time is from the start signal to the last rank up.
void BM_RegionBringupRanks(benchmark::State& state) {
  const auto scheme = static_cast<Scheme>(state.range(0));
  const auto world = static_cast<std::uint32_t>(state.range(1));
  const auto threads = static_cast<unsigned>(state.range(2));
  kvoffload::RegionOptions opts;
  opts.layout = {.num_chunks = kRegionBytes / (kSlotBytes * world),
                 .slot_bytes = kSlotBytes,
                 .world_size = world,
                 .replicated = false};
  opts.shm_dir = g_shm_dir;
  opts.populate_threads = threads;
  int round = 0;
  double slowest_rank_s = 0;
  for (auto _ : state) {
    opts.engine_id = "bench-ranks-" + std::to_string(getpid()) + "-" + std::to_string(round++);
    const std::string ref_path = (g_shm_dir / (opts.engine_id + ".ref")).string();
    if (scheme != kKvoffload) {
      const int fd = open(ref_path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(kRegionBytes)) != 0) {
        state.SkipWithError("could not create the reference file");
        break;
      }
      close(fd);
    }
    int go[2];
    int up[2];
    int release[2];
    int allocated[2];
    if (pipe(go) != 0 || pipe(up) != 0 || pipe(release) != 0 || pipe(allocated) != 0) {
      state.SkipWithError("pipe failed");
      break;
    }
    std::vector<pid_t> children;
    for (std::uint32_t r = 0; r < world; ++r) {
      const pid_t pid = fork();
      if (pid == 0) {
        close(go[1]);
        close(up[0]);
        close(release[1]);
        char c = 0;
        if (!read_all(go[0], &c, 1)) _exit(2);
        std::int64_t report[2] = {-1, 0};
        std::optional<kvoffload::Region> region;
        const std::int64_t t = now_ns();
        try {
          bool ok = true;
          if (scheme == kKvoffload) {
            auto o = opts;
            o.rank = r;
            region.emplace(kvoffload::Region::create_or_join(o));
          } else {
            ok = reference_rank(ref_path, scheme, world, r, allocated[0], allocated[1]);
          }
          if (ok) {
            report[0] = now_ns();
            report[1] = report[0] - t;
          }
        } catch (const std::exception& e) {
          (void)std::fprintf(stderr, "rank %u: %s\n", r, e.what());
        }
        if (write(up[1], report, sizeof report) != static_cast<ssize_t>(sizeof report)) _exit(3);
        (void)read_all(release[0], &c, 1);  // EOF: everyone is up
        region.reset();
        _exit(report[0] < 0 ? 1 : 0);
      }
      children.push_back(pid);
    }
    close(go[0]);
    close(up[1]);
    close(release[0]);
    close(allocated[0]);
    close(allocated[1]);
    const std::string start(world, 'g');
    const std::int64_t t0 = now_ns();
    bool ok = write(go[1], start.data(), start.size()) == static_cast<ssize_t>(start.size());
    std::int64_t last = t0;
    double slowest = 0;
    for (std::uint32_t r = 0; r < world && ok; ++r) {
      std::int64_t report[2];
      ok = read_all(up[0], report, sizeof report) && report[0] >= 0;
      if (ok) {
        last = std::max(last, report[0]);
        slowest = std::max(slowest, static_cast<double>(report[1]) / 1e9);
      }
    }
    close(release[1]);
    close(go[1]);
    close(up[0]);
    for (const pid_t pid : children) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    if (scheme != kKvoffload) unlink(ref_path.c_str());
    if (!ok) {
      state.SkipWithError("a rank failed (see stderr)");
      break;
    }
    state.SetIterationTime(static_cast<double>(last - t0) / 1e9);
    slowest_rank_s += slowest;
  }
  if (state.iterations() > 0) {
    state.counters["slowest_rank_s"] = slowest_rank_s / static_cast<double>(state.iterations());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(kRegionBytes * state.iterations()));
  static const char* const kNames[] = {"kvoffload", "reference sparse (vLLM)",
                                       "reference whole fallocate (old)"};
  state.SetLabel(std::string(kNames[scheme]) + ", W=" + std::to_string(world) + " processes");
}

// Every scheme at one W before the next W, so the schemes compared are measured close together.
BENCHMARK(BM_RegionBringupRanks)
    ->ArgNames({"scheme", "W", "threads"})
    ->Args({0, 1, 1})
    ->Args({0, 1, 2})
    ->Args({1, 1, 1})
    ->Args({2, 1, 1})
    ->Args({0, 2, 1})
    ->Args({0, 2, 2})
    ->Args({1, 2, 1})
    ->Args({2, 2, 1})
    ->Args({0, 4, 1})
    ->Args({0, 4, 2})
    ->Args({1, 4, 1})
    ->Args({2, 4, 1})
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Few iterations: each one maps and faults in a whole GiB, and the run should stay under a minute.
BENCHMARK(BM_RegionCreatePopulate)
    ->ArgNames({"threads", "fallback", "unranked"})
    ->ArgsProduct({{1, 2}, {0, 1}, {0, 1}})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_RegionAttachDetach)
    ->ArgNames({"join"})
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_FirstTouchMemset)
    ->ArgNames({"MiB", "threads"})
    ->ArgsProduct({{static_cast<std::int64_t>(kRegionBytes / kMiB / 2),
                    static_cast<std::int64_t>(kRegionBytes / kMiB)},
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
    (void)std::fprintf(stderr, "region_bench: mkdtemp %s: %s\n", tmpl.c_str(),
                       std::strerror(errno));
    return 1;
  }
  g_shm_dir = tmpl;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(g_shm_dir, ec);
  return 0;
}
