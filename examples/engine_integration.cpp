// What an inference engine does to offload KV blocks with kvoffload, end to end, in one process
// playing one rank (run W copies with different --rank values for a real world; the first creates
// the region, the others join it).
//
//   1. describe its KV caches: per layer a K and a V tensor of num_blocks pages on the device;
//   2. create or join the shared host region for its rank (one chunk = blocks_per_chunk blocks of
//      every tensor of this rank);
//   3. build the device runtime ("auto": CUDA, else HIP, else the host backend) and the transfer
//      engine over the region;
//   4. submit stores (device -> host) and loads (host -> device) ordered after its compute stream,
//      and poll completions each step;
//   5. shut down: the engine (drain, unregister), then the region (the last rank out removes it).
//
// The scheduler side (which keys go to which chunk) is the Manager; it is used here too so the
// example shows the whole flow. Usage: engine_integration [--rank R] [--world-size W]
//                                       [--backend host|cuda|hip|auto] [--shm-dir DIR]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/manager.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

namespace kvo = kvoffload;

namespace {

constexpr std::uint32_t kLayers = 4;
constexpr std::uint64_t kNumGpuBlocks = 64;
constexpr std::uint64_t kPageBytes = 16 * 1024;  // one block of one K or V tensor of one layer
constexpr std::uint32_t kBlocksPerChunk = 4;
constexpr std::uint64_t kHostChunks = 8;

std::uint8_t pattern(std::uint32_t tensor, std::uint64_t block, std::uint64_t i) {
  return static_cast<std::uint8_t>(tensor * 31 + block * 7 + i);
}

int run(int argc, char** argv) {
  std::uint32_t rank = 0, world_size = 1;
  std::string backend = "auto", shm_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rank")
      rank = static_cast<std::uint32_t>(std::stoul(argv[i + 1]));
    else if (flag == "--world-size")
      world_size = static_cast<std::uint32_t>(std::stoul(argv[i + 1]));
    else if (flag == "--backend")
      backend = argv[i + 1];
    else if (flag == "--shm-dir")
      shm_dir = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }

  // 3a. The device runtime. Everything below works the same on a GPU.
  auto runtime = kvo::make_runtime(backend);
  std::printf("backend: %s\n", std::string(runtime->name()).c_str());

  // 1. The KV caches: 2 tensors (K, V) per layer. A real engine passes its tensors' data_ptr();
  // here the runtime allocates them.
  std::vector<kvo::DeviceBuffer> caches;
  kvo::KvGroup group;
  for (std::uint32_t t = 0; t < 2 * kLayers; ++t) {
    caches.push_back(runtime->allocate_device(kNumGpuBlocks * kPageBytes));
    group.tensors.push_back(kvo::DeviceTensor{reinterpret_cast<std::uint64_t>(caches.back().data()),
                                              kNumGpuBlocks, kPageBytes, kPageBytes});
  }
  // Fill blocks with a pattern (the "prefill" output) through the runtime.
  std::vector<std::uint8_t> page(kPageBytes);
  for (std::uint32_t t = 0; t < 2 * kLayers; ++t) {
    for (std::uint64_t b = 0; b < kNumGpuBlocks; ++b) {
      for (std::uint64_t i = 0; i < kPageBytes; ++i) page[i] = pattern(t, b, i);
      runtime->memcpy_sync(static_cast<std::byte*>(caches[t].data()) + b * kPageBytes, page.data(),
                           kPageBytes);
    }
  }

  // 2. The region: one slot per rank per chunk, holding kBlocksPerChunk blocks of every tensor.
  kvo::RegionOptions region_options;
  region_options.engine_id = "example-engine";
  region_options.layout = {kHostChunks, kBlocksPerChunk * 2 * kLayers * kPageBytes, world_size,
                           false};
  region_options.rank = rank;
  if (!shm_dir.empty()) region_options.shm_dir = shm_dir;
  kvo::Region region = kvo::Region::create_or_join(region_options);
  std::printf("region: %s (%s), %llu bytes\n", region.path().c_str(),
              std::string(kvo::to_string(region.role())).c_str(),
              static_cast<unsigned long long>(region.geometry().data_bytes()));

  // 3b. The transfer engine over this rank's slots (registers the region for the device).
  kvo::TransferEngine engine(*runtime, region, rank, {group}, kBlocksPerChunk);
  kvo::Stream compute = runtime->create_stream();  // the engine's compute stream

  // The scheduler: which chunks hold which keys (block hashes). Two chunks of a request's prefix.
  kvo::Manager manager(kvo::ManagerConfig{.num_chunks = kHostChunks});
  const std::vector<kvo::BlockKey> keys = {kvo::BlockKey::from_u64(0xA1),
                                           kvo::BlockKey::from_u64(0xA2)};
  const kvo::StorePlan plan = manager.prepare_store(keys);
  if (!plan.ok()) throw kvo::Error(kvo::ErrorCode::kCapacity, plan.describe());
  std::vector<std::uint64_t> chunks(plan.slots.begin(), plan.slots.end());

  // 4a. Store GPU blocks 0..7 into the two chunks, after the compute stream's work so far.
  std::vector<std::uint64_t> store_blocks = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<std::span<const std::uint64_t>> store_groups = {store_blocks};
  engine.submit(kvo::JobId{1}, kvo::Direction::kStore, {chunks, 0, store_groups},
                kvo::WaitOn::stream(compute.view()));
  // Poll each "step" until the store completes; only then is the chunk readable.
  std::vector<kvo::JobResult> done;
  while (done.empty()) done = engine.poll();
  manager.complete_store(keys, done[0].success);
  if (!done[0].success) throw kvo::Error(kvo::ErrorCode::kTransferFailed, done[0].error);
  std::printf("stored %llu bytes in %.6f s\n", static_cast<unsigned long long>(done[0].bytes),
              done[0].seconds);

  // 4b. A later request with the same prefix: look up, pin, load into other GPU blocks.
  std::vector<kvo::LookupResult> results(keys.size());
  const std::size_t hits = manager.lookup(keys, results);
  auto slots = manager.prepare_load(keys);
  std::vector<std::uint64_t> load_chunks(slots.begin(), slots.end());
  std::vector<std::uint64_t> load_blocks = {32, 33, 34, 35, 36, 37, 38, 39};
  std::vector<std::span<const std::uint64_t>> load_groups = {load_blocks};
  engine.submit(kvo::JobId{2}, kvo::Direction::kLoad, {load_chunks, 0, load_groups},
                kvo::WaitOn::stream(compute.view()));
  const kvo::JobId wait_ids[] = {kvo::JobId{2}};
  const kvo::JobResult loaded = engine.wait(wait_ids).at(0);
  manager.complete_load(keys);
  if (!loaded.success) throw kvo::Error(kvo::ErrorCode::kTransferFailed, loaded.error);

  // Verify every byte that came back.
  std::uint64_t bad = 0;
  for (std::uint32_t t = 0; t < 2 * kLayers; ++t) {
    for (std::uint64_t b = 0; b < 8; ++b) {
      runtime->memcpy_sync(page.data(),
                           static_cast<std::byte*>(caches[t].data()) + (32 + b) * kPageBytes,
                           kPageBytes);
      for (std::uint64_t i = 0; i < kPageBytes; ++i) bad += page[i] != pattern(t, b, i);
    }
  }
  std::printf("loaded %llu bytes (%zu of %zu chunks hit), %s\n",
              static_cast<unsigned long long>(loaded.bytes), hits, keys.size(),
              bad == 0 ? "all bytes verified" : "MISMATCH");

  // 5. Shut down: the engine first (drain, unregister), then the region.
  engine.shutdown();
  region.close();
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kvo::Error& e) {
    std::fprintf(stderr, "engine_integration: %s (%s)\n", e.what(),
                 std::string(kvo::to_string(e.code())).c_str());
    return 1;
  }
}
