// Transfer bandwidth by backend, direction, path, fragment size and count.
//
//   build/<dir>/bin/transfer_bench                      # every available backend, ~1 minute
//   build/<dir>/bin/transfer_bench --benchmark_filter=host/store
//   KVOFFLOAD_BENCH_HOST_THREADS=2 build/<dir>/bin/transfer_bench    # host copy threads
//   KVOFFLOAD_BENCH_BACKENDS=sim build/<dir>/bin/transfer_bench      # the simulated device: checks
//                                                                    # bytes, measures nothing real
//
// Each case copies `count` fragments of `bytes`, scattered (every other fragment of a buffer twice
// the size, so nothing coalesces), between device memory (host memory on the host backend) and a
// registered host buffer, as one batch on one stream: enqueue + event + synchronize, wall time.
// Counters: GBps (this case), ref_GBps (the reference for the same total bytes through the same
// stream: one memcpy run on the stream's worker on the host backend, one contiguous DMA copy on
// GPUs), ratio = GBps / ref_GBps, caller_memcpy_GBps (one memcpy on the calling thread: shows the
// cost of the asynchronous hand-off itself, which the stream-side reference shares), and
// stream_GBps (bytes / time between events recorded before and after the batch on the stream:
// the copy itself, without the submission and wake-up latency that wall time includes) with
// stream_ratio, the same ratio on stream time (the reference's own events around its memcpy).
// caller_memcpy_GBps exists on the host backend only: on GPUs (and sim) the "device" side is not
// host memory, and a CPU memcpy of it would fault.
// Every case checks its bytes after timing (every fragment, both directions, also on sim, where
// the copies went through the simulated device and its copy kernel); a mismatch makes the program
// exit 1. Target (docs/PERFORMANCE.md): host backend ratio >= 0.9 for fragments >= 64 KiB; GPU
// figures on the device's own targets (docs/PERFORMANCE.md).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>

namespace {

using kvoffload::CopyDescriptor;
using kvoffload::CopyKind;
using kvoffload::CopyPath;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kMaxTotal = 32ULL << 20;

// Tuning knobs for the host backend: KVOFFLOAD_BENCH_HOST_THREADS, KVOFFLOAD_BENCH_HOST_SPLIT_MIN
// (bytes); KVOFFLOAD_BENCH_KERNEL_CTAS for the copy kernel's grid. Unset: the runtime's defaults
// (what the figures in docs/PERFORMANCE.md use).
kvoffload::RuntimeOptions options_from_env() {
  kvoffload::RuntimeOptions o;
  // The kernel path's grid bound (the "at most 12 CTAs" case: =12).
  if (const char* c = std::getenv("KVOFFLOAD_BENCH_KERNEL_CTAS"))
    o.kernel_max_blocks = static_cast<unsigned>(std::strtoul(c, nullptr, 10));
  if (const char* t = std::getenv("KVOFFLOAD_BENCH_HOST_THREADS"))
    o.host_copy_threads = static_cast<unsigned>(std::strtoul(t, nullptr, 10));
  if (const char* m = std::getenv("KVOFFLOAD_BENCH_HOST_SPLIT_MIN"))
    o.host_split_min_bytes = std::strtoull(m, nullptr, 10);
  return o;
}

struct Setup {
  std::unique_ptr<kvoffload::DeviceRuntime> rt;
  kvoffload::DeviceBuffer device;
  std::byte* host = nullptr;
  kvoffload::HostRegistration reg;
  kvoffload::Stream stream;
  kvoffload::Event start;
  kvoffload::Event done;
  kvoffload::HostFlag gate;  // the runtime's own flag memory (HIP waits on signal memory only)
  double last_stream_seconds =
      0;  // start -> done on the stream: the copy without submission latency

  explicit Setup(const std::string& backend)
      : rt(kvoffload::make_runtime(backend, options_from_env())) {
    device = rt->allocate_device(2 * kMaxTotal);
    rt->memset_sync(device.data(), 1, device.bytes());
    // Two fragments' worth for the cases (and a page to spare).
    host = static_cast<std::byte*>(std::aligned_alloc(4096, 2 * kMaxTotal + 4096));
    std::memset(host, 2, 2 * kMaxTotal + 4096);  // resident before measuring
    reg = rt->register_host(host, 2 * kMaxTotal + 4096);
    gate = rt->create_host_flag();
    stream = rt->create_stream();
    start = rt->create_event(true);
    done = rt->create_event(true);
  }
  ~Setup() {
    gate.reset();
    reg.reset();
    std::free(host);
  }
  Setup(const Setup&) = delete;
  Setup& operator=(const Setup&) = delete;

  // Holds the stream while start event, work and done event are enqueued, so that stream time
  // (start -> done) covers the work only, not a worker that went to sleep between two enqueues.
  // The stream waits for a flag word of the runtime's (wait_host_flag on a HostFlag,
  // cuStreamWaitValue32 / hipStreamWaitValue32): no host function that blocks.
  std::uint32_t gate_generation = 0;
  void close_gate() { rt->wait_host_flag(stream.view(), gate.data(), ++gate_generation); }
  void open_gate() { gate.set(gate_generation); }

  double run_batch(std::span<const CopyDescriptor> batch, CopyKind kind, CopyPath path) {
    const auto t0 = Clock::now();
    close_gate();
    rt->record_event(start.view(), stream.view());
    rt->enqueue_copies(stream.view(), batch, kind, path);
    rt->record_event(done.view(), stream.view());
    open_gate();
    rt->synchronize_event(done.view());
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    last_stream_seconds = rt->elapsed_seconds(start.view(), done.view());
    return wall;
  }
};

std::vector<std::unique_ptr<Setup>>& setups() {
  static std::vector<std::unique_ptr<Setup>> s;
  return s;
}

struct MemcpyArgs {
  void* dst;
  const void* src;
  std::size_t bytes;
};
void memcpy_fn(void* p) {
  auto* m = static_cast<MemcpyArgs*>(p);
  std::memcpy(m->dst, m->src, m->bytes);
}

// The reference for `total` bytes, through the same stream as the case (same thread hand-off,
// same worker): one memcpy run on the stream (host), or one contiguous DMA descriptor (GPUs).
double reference_once(Setup& s, bool store, std::uint64_t total) {
  auto* dev = static_cast<std::byte*>(s.device.data());
  if (s.rt->name() == "host") {
    MemcpyArgs m = store ? MemcpyArgs{s.host, dev, total} : MemcpyArgs{dev, s.host, total};
    const auto t0 = Clock::now();
    s.close_gate();
    s.rt->record_event(s.start.view(), s.stream.view());
    s.rt->launch_host_func(s.stream.view(), &memcpy_fn, &m);
    s.rt->record_event(s.done.view(), s.stream.view());
    s.open_gate();
    s.rt->synchronize_event(s.done.view());
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    s.last_stream_seconds = s.rt->elapsed_seconds(s.start.view(), s.done.view());
    return wall;
  }
  const CopyDescriptor d =
      store ? CopyDescriptor{dev, s.host, total} : CopyDescriptor{s.host, dev, total};
  return s.run_batch(std::span(&d, 1), store ? CopyKind::kDeviceToHost : CopyKind::kHostToDevice,
                     CopyPath::kDma);
}

// One memcpy on the calling thread (no hand-off at all): what a synchronous copy would take.
double caller_memcpy_once(Setup& s, bool store, std::uint64_t total) {
  auto* dev = static_cast<std::byte*>(s.device.data());
  const auto t0 = Clock::now();
  if (store) {
    std::memcpy(s.host, dev, total);
  } else {
    std::memcpy(dev, s.host, total);
  }
  benchmark::ClobberMemory();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool g_bytes_wrong = false;

// Fills every source fragment with a pattern of this case, and after the case checks that every
// destination fragment holds it.
std::uint8_t pattern(std::uint64_t i, std::uint64_t k, std::uint64_t salt) {
  return static_cast<std::uint8_t>((i * 131 + k * 7 + salt) & 0xff);
}
void fill_sources(Setup& s, bool store, std::uint64_t bytes, std::uint64_t count,
                  std::uint64_t salt) {
  std::vector<std::byte> frag(bytes);
  for (std::uint64_t i = 0; i < count; ++i) {
    for (std::uint64_t k = 0; k < bytes; ++k) frag[k] = static_cast<std::byte>(pattern(i, k, salt));
    if (store) {
      s.rt->memcpy_sync(static_cast<std::byte*>(s.device.data()) + 2 * i * bytes, frag.data(),
                        bytes);
    } else {
      std::memcpy(s.host + 2 * i * bytes, frag.data(), bytes);
    }
  }
}
bool check_destinations(Setup& s, bool store, std::uint64_t bytes, std::uint64_t count,
                        std::uint64_t salt) {
  std::vector<std::byte> frag(bytes);
  for (std::uint64_t i = 0; i < count; ++i) {
    if (store) {
      std::memcpy(frag.data(), s.host + 2 * i * bytes, bytes);
    } else {
      s.rt->memcpy_sync(frag.data(), static_cast<std::byte*>(s.device.data()) + 2 * i * bytes,
                        bytes);
    }
    for (std::uint64_t k = 0; k < bytes; ++k) {
      if (frag[k] != static_cast<std::byte>(pattern(i, k, salt))) return false;
    }
  }
  return true;
}

void bm_transfer(benchmark::State& state, Setup* s, bool store, CopyPath path) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  const auto count = static_cast<std::uint64_t>(state.range(1));
  const std::uint64_t total = bytes * count;
  std::vector<CopyDescriptor> batch;
  batch.reserve(count);
  auto* dev = static_cast<std::byte*>(s->device.data());
  for (std::uint64_t i = 0; i < count; ++i) {
    std::byte* d = dev + 2 * i * bytes;
    std::byte* h = s->host + 2 * i * bytes;
    if (path == CopyPath::kKernel) h = static_cast<std::byte*>(s->reg.device_pointer(h));
    batch.push_back(store ? CopyDescriptor{d, h, bytes} : CopyDescriptor{h, d, bytes});
  }
  const CopyKind kind = store ? CopyKind::kDeviceToHost : CopyKind::kHostToDevice;
  const std::uint64_t salt = bytes + count + (store ? 1 : 0) + (path == CopyPath::kKernel ? 2 : 0);
  fill_sources(*s, store, bytes, count, salt);
  s->run_batch(batch, kind, path);  // warm-up
  (void)reference_once(*s, store, total);
  // The reference runs between iterations (untimed for the case), so both see the same machine
  // load: on a shared machine, drifting load would otherwise dominate the ratio.
  double seconds = 0;
  double stream_seconds = 0;
  double ref_seconds = 0;
  double caller_seconds = 0;
  double ref_stream_seconds = 0;
  bool ref_first = false;
  auto run_reference = [&] {
    ref_seconds += reference_once(*s, store, total);
    ref_stream_seconds += s->last_stream_seconds;
  };
  for (auto _ : state) {
    // Alternate which of case and reference runs first: the second of two back-to-back hand-offs
    // finds the worker freshly idle (cheaper to wake), which would otherwise bias the ratio.
    ref_first = !ref_first;
    if (ref_first) {
      state.PauseTiming();
      run_reference();
      state.ResumeTiming();
    }
    const double sec = s->run_batch(batch, kind, path);
    state.SetIterationTime(sec);
    seconds += sec;
    stream_seconds += s->last_stream_seconds;
    if (!ref_first) {
      state.PauseTiming();
      run_reference();
      state.ResumeTiming();
    }
  }
  // The reference copies whole ranges over the case's buffers: run the case once more, then check.
  s->run_batch(batch, kind, path);
  if (!check_destinations(*s, store, bytes, count, salt)) {
    g_bytes_wrong = true;
    state.SkipWithError("bytes differ after the copy");
    return;
  }
  const bool host_backend = s->rt->name() == "host";
  // Outside the loop: inside, it would warm the reference's range of the caches right before it.
  if (host_backend) {
    for (int i = 0; i < 3; ++i) caller_seconds += caller_memcpy_once(*s, store, total);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * total));
  const double moved = static_cast<double>(state.iterations() * total);
  state.counters["GBps"] = moved / seconds / 1e9;
  state.counters["ref_GBps"] = moved / ref_seconds / 1e9;
  state.counters["ratio"] = ref_seconds / seconds;
  // Bandwidth on the stream (first to last byte), i.e. without the submission/wake-up latency.
  state.counters["stream_GBps"] = moved / stream_seconds / 1e9;
  state.counters["stream_ratio"] = ref_stream_seconds / stream_seconds;
  if (host_backend)
    state.counters["caller_memcpy_GBps"] = 3.0 * static_cast<double>(total) / caller_seconds / 1e9;
}

// Both directions at once: a store and a load, each of `count` fragments of `bytes`, on two
// streams (the engine's two lanes). GBps counts the bytes of both.
void bm_bidirectional(benchmark::State& state, Setup* s, CopyPath path) {
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  const auto count = static_cast<std::uint64_t>(state.range(1));
  auto* dev = static_cast<std::byte*>(s->device.data());
  std::vector<CopyDescriptor> stores;
  std::vector<CopyDescriptor> loads;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::byte* h = s->host + 2 * i * bytes;
    if (path == CopyPath::kKernel) h = static_cast<std::byte*>(s->reg.device_pointer(h));
    stores.push_back({dev + 2 * i * bytes, h, bytes});                 // even halves
    loads.push_back({h + bytes, dev + 2 * i * bytes + bytes, bytes});  // odd halves
  }
  kvoffload::Stream other = s->rt->create_stream();
  kvoffload::Event other_done = s->rt->create_event();
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    s->rt->enqueue_copies(s->stream.view(), stores, CopyKind::kDeviceToHost, path);
    s->rt->enqueue_copies(other.view(), loads, CopyKind::kHostToDevice, path);
    s->rt->record_event(s->done.view(), s->stream.view());
    s->rt->record_event(other_done.view(), other.view());
    s->rt->synchronize_event(s->done.view());
    s->rt->synchronize_event(other_done.view());
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(sec);
    seconds += sec;
  }
  const double moved = 2.0 * static_cast<double>(state.iterations() * bytes * count);
  state.SetBytesProcessed(static_cast<std::int64_t>(moved));
  state.counters["GBps"] = moved / seconds / 1e9;
}

// Host registration rate: register and unregister 1 GiB of populated memory (GPU backends).
void bm_register(benchmark::State& state, Setup* s) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  std::unique_ptr<std::byte, decltype(&std::free)> mem(
      static_cast<std::byte*>(std::aligned_alloc(4096, bytes)), &std::free);
  std::memset(mem.get(), 0, bytes);  // populated first, as a region is
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    kvoffload::HostRegistration reg = s->rt->register_host(mem.get(), bytes, 4096);
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(sec);
    seconds += sec;
    reg.reset();
  }
  state.counters["s_per_GB"] =
      seconds / static_cast<double>(state.iterations()) / (static_cast<double>(bytes) / 1e9);
}

void register_all() {
  const std::uint64_t sizes[] = {4096, 16384, 65536, 262144, 2097152};
  // Two batch totals per fragment size: 2 MiB (latency-bound: fixed costs show) and 32 MiB
  // (throughput-bound: what the 90% target is about).
  const std::uint64_t totals[] = {2ULL << 20, 32ULL << 20};
  // KVOFFLOAD_BENCH_BACKENDS=a,b picks backends; by default every available one but sim (a
  // simulation measures nothing about a GPU; run it to check bytes).
  const char* env = std::getenv("KVOFFLOAD_BENCH_BACKENDS");
  const std::string wanted = env != nullptr ? "," + std::string(env) + "," : std::string();
  for (const kvoffload::BackendInfo& b : kvoffload::list_backends()) {
    if (!b.built || b.device_count == 0) continue;
    if (wanted.empty() ? b.name == "sim" : wanted.find("," + b.name + ",") == std::string::npos)
      continue;
    try {
      setups().push_back(std::make_unique<Setup>(b.name));
    } catch (const kvoffload::Error& e) {
      (void)std::fprintf(stderr, "transfer_bench: skipping %s: %s\n", b.name.c_str(), e.what());
      continue;
    }
    Setup* s = setups().back().get();
    for (bool store : {true, false}) {
      for (CopyPath path : {CopyPath::kDma, CopyPath::kKernel}) {
        if (path == CopyPath::kKernel && !s->rt->supports_kernel_path()) continue;
        const std::string name =
            b.name + (store ? "/store" : "/load") + "/" + std::string(kvoffload::to_string(path));
        auto* bm = benchmark::RegisterBenchmark(name.c_str(), bm_transfer, s, store, path);
        for (std::uint64_t size : sizes) {
          for (std::uint64_t total : totals) {
            bm->Args({static_cast<std::int64_t>(size), static_cast<std::int64_t>(total / size)});
          }
        }
        bm->ArgNames({"bytes", "count"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.2);
      }
    }
    for (CopyPath path : {CopyPath::kDma, CopyPath::kKernel}) {
      if (path == CopyPath::kKernel && !s->rt->supports_kernel_path()) continue;
      const std::string name = b.name + "/bidirectional/" + std::string(kvoffload::to_string(path));
      benchmark::RegisterBenchmark(name.c_str(), bm_bidirectional, s, path)
          ->Args({65536, 256})
          ->Args({2097152, 8})
          ->ArgNames({"bytes", "count"})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2);
    }
    if (b.name != "host") {
      // Owned by the benchmark registry (named, so the analyzer sees it kept).
      auto* reg_bm = benchmark::RegisterBenchmark((b.name + "/register").c_str(), bm_register, s);
      reg_bm->Arg(1024)
          ->ArgName("MiB")
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    setups().clear();  // runtimes go before static destruction begins
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  setups().clear();
  if (g_bytes_wrong) {
    (void)std::fprintf(stderr,
                       "transfer_bench: some case copied wrong bytes (see the errors above)\n");
    return 1;
  }
  return 0;
}
