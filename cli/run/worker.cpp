#include "worker.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/node_pool.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/platform.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "channel.hpp"
#include "kv_pattern.hpp"
#include "run_config.hpp"
#include "util/log.hpp"

namespace kvoffload::run {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int /*signal*/) {
  g_stop.store(true);
}

// One job of a request, as the scheduler sent it.
struct JobPart {
  std::uint64_t job = 0;
  std::vector<std::uint64_t> chunks;
  std::vector<std::uint64_t> blocks;  // chunks.size() · blocks_per_chunk GPU block ids
  std::vector<BlockKey> keys;         // one per chunk
};

std::optional<JobPart> parse_part(const nlohmann::json& request, const char* name) {
  if (!request.contains(name)) return std::nullopt;
  const auto& j = request.at(name);
  JobPart part;
  j.at("job").get_to(part.job);
  j.at("chunks").get_to(part.chunks);
  j.at("blocks").get_to(part.blocks);
  for (const auto& k : j.at("keys"))
    part.keys.emplace_back(k.at(0).get<std::uint64_t>(), k.at(1).get<std::uint64_t>());
  return part;
}

// One rank of a run on a node pool (Note [Run on a node pool] in pool_run.cpp): its runtime, its
// device caches, the pool file's chunk bytes mapped and registered, and a transfer engine over
// this rank's slots there. Torn down in reverse: engine (drains, unregisters), caches, munmap,
// runtime.
class PoolRank {
 public:
  PoolRank(const RunConfig& c, std::uint32_t rank) {
    const BackendInfo backend = probe_backend(c.backend);
    const std::vector<int> devices = c.device_list();
    if (devices.empty() && backend.device_count <= 0) {
      throw Error(ErrorCode::kNotAvailable,
                  "backend " + backend.name + " has no device (" + backend.detail + ")");
    }
    device_ = devices.empty() ? static_cast<int>(rank % backend.device_count)
                              : devices[rank % devices.size()];
    RuntimeOptions ro;
    ro.device = device_;
    runtime_ = make_runtime(backend.name, ro);
    map_pool(c, rank);
    KvLayout layout;
    KvGroup group;
    for (std::uint32_t t = 0; t < c.layers; ++t) {
      caches_.push_back(runtime_->allocate_device(c.gpu_blocks * c.block_bytes));
      group.tensors.push_back({.base = reinterpret_cast<std::uint64_t>(caches_.back().data()),
                               .num_blocks = c.gpu_blocks,
                               .page_bytes = c.block_bytes,
                               .block_stride = c.block_bytes});
    }
    layout.groups = {group};
    layout.blocks_per_chunk = c.blocks_per_chunk;
    layout.host = HostSlots{.base = static_cast<std::byte*>(map_),
                            .buffer_bytes = map_bytes_,
                            .num_chunks = c.num_chunks,
                            .row_stride = c.pool_slot_stride,
                            .slot_offset = 0,
                            .slot_bytes = c.slot_bytes};
    const auto start = std::chrono::steady_clock::now();
    engine_ = std::make_unique<TransferEngine>(*runtime_, layout);  // registers the mapping
    registration_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  ~PoolRank() {
    if (engine_) engine_->shutdown();
    engine_.reset();
    caches_.clear();
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    runtime_.reset();
  }
  PoolRank(const PoolRank&) = delete;
  PoolRank& operator=(const PoolRank&) = delete;

  DeviceRuntime& runtime() { return *runtime_; }
  TransferEngine& engine() { return *engine_; }
  [[nodiscard]] std::span<const DeviceBuffer> caches() const { return caches_; }
  [[nodiscard]] int device() const { return device_; }
  [[nodiscard]] std::uint64_t mapped_bytes() const { return map_bytes_; }
  [[nodiscard]] double registration_seconds() const { return registration_seconds_; }

 private:
  // This rank's range of the pool file (Note [Pool layout]: rank-major, the range holds this
  // rank's slot of every chunk), and nothing else: not the index, not the other ranks' slots.
  void map_pool(const RunConfig& c, std::uint32_t rank) {
    const std::filesystem::path path = pool::pool_path(c.shm_dir, c.pool);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw_system_error("open", errno, "of the node pool " + path.string());
    struct stat st {};
    char magic[8] = {};
    const bool stat_ok = ::fstat(fd, &st) == 0;
    const bool magic_ok = ::pread(fd, magic, sizeof magic, 0) == sizeof magic &&
                          std::memcmp(magic, "KVOPOOL", 8) == 0;
    map_bytes_ = c.pool_rank_stride;
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t want = c.pool_data_offset + c.world_size * c.pool_rank_stride;
    const std::uint64_t page = platform::page_size();
    if (!stat_ok || !magic_ok || size != want || c.pool_data_offset % page != 0 ||
        c.pool_rank_stride % page != 0 || c.pool_rank_stride < c.num_chunks * c.pool_slot_stride) {
      ::close(fd);
      throw Error(ErrorCode::kMismatch,
                  "the node pool " + path.string() + " (" + std::to_string(size) +
                      " bytes) is not " + std::to_string(c.world_size) + " ranks' ranges of " +
                      std::to_string(c.pool_rank_stride) + " bytes from offset " +
                      std::to_string(c.pool_data_offset) + " (" + std::to_string(want) +
                      " bytes), as the scheduler attached it");
    }
    const std::uint64_t offset = c.pool_data_offset + rank * c.pool_rank_stride;
    void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                     static_cast<off_t>(offset));
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw_system_error("mmap", err, "of the node pool " + path.string());
    map_ = p;
  }

  int device_ = 0;
  std::unique_ptr<DeviceRuntime> runtime_;
  void* map_ = nullptr;
  std::uint64_t map_bytes_ = 0;
  std::vector<DeviceBuffer> caches_;
  std::unique_ptr<TransferEngine> engine_;
  double registration_seconds_ = 0;
};

// One rank of the run: an OffloadWorker (Note [Rank assembly]: probe, runtime, region with each
// bring-up piece registered as it comes up, the KV caches, the transfer engine; torn down in the
// one safe order), a compute stream, and the staging buffer the "model" writes through.
class RankState {
 public:
  RankState(const RunConfig& config, std::uint32_t rank) : config_(config), rank_(rank) {
    if (config.pool.empty()) {
      worker_ = OffloadWorker::build(worker_config(config, rank));
      runtime_ = &worker_->runtime();
      engine_ = &worker_->engine();
    } else {
      pool_rank_ = std::make_unique<PoolRank>(config, rank);
      runtime_ = &pool_rank_->runtime();
      engine_ = &pool_rank_->engine();
    }
    compute_ = runtime_->create_stream();
    staging_.resize(config.block_bytes);
  }
  RankState(const RankState&) = delete;
  RankState& operator=(const RankState&) = delete;

  static WorkerConfig worker_config(const RunConfig& config, std::uint32_t rank) {
    WorkerConfig w;
    w.region.engine_id = config.engine_id;
    w.region.layout = {.num_chunks = config.num_chunks,
                       .slot_bytes = config.slot_bytes,
                       .world_size = config.world_size};
    w.region.rank = rank;
    if (!config.shm_dir.empty()) w.region.shm_dir = config.shm_dir;
    w.region.populate_threads = config.populate_threads;
    w.region.bringup = parse_bringup_mode(config.bringup);
    w.region.bringup_piece_bytes = config.bringup_piece_bytes;
    w.backend = config.backend;
    // Rank r on device r mod the device count, or as --devices says: one GPU per rank.
    w.devices = config.device_list();
    w.caches = DeviceCaches{.tensors = config.layers,
                            .num_blocks = config.gpu_blocks,
                            .block_bytes = config.block_bytes};
    w.blocks_per_chunk = config.blocks_per_chunk;
    // The report's store/load GB/s are bytes over each job's copy time on the device
    // (JobResult::seconds), so the run's engines always time their jobs
    // (EngineOptions::job_timing).
    w.engine.job_timing = true;
    return w;
  }

  nlohmann::json ready_message() const {
    if (pool_rank_) {
      return {{"op", "ready"},
              {"rank", rank_},
              {"backend", std::string(runtime_->name())},
              {"device", pool_rank_->device()},
              {"role", "pool"},
              {"populate", {{"method", "pool"}, {"bytes", 0}, {"seconds", 0.0}}},
              {"registration_seconds", pool_rank_->registration_seconds()},
              {"host_registered", engine_->host_registered()},
              {"device_bytes", config_.gpu_blocks * config_.block_bytes * config_.layers}};
    }
    const PopulateReport p = worker_->region().populate_report();
    return {{"op", "ready"},
            {"rank", rank_},
            {"backend", std::string(runtime_->name())},
            {"device", worker_->device()},
            {"role", std::string(to_string(worker_->region().role()))},
            {"populate",
             {{"method", std::string(to_string(p.method))},
              {"bytes", p.bytes},
              {"seconds", p.seconds}}},
            // Blocking: every piece is registered by now; background: those up so far.
            {"registration_seconds", worker_->registration().seconds},
            {"host_registered", worker_->engine().host_registered()},
            {"device_bytes", config_.gpu_blocks * config_.block_bytes * config_.layers}};
  }

  nlohmann::json serve(const nlohmann::json& request) {
    const auto load = parse_part(request, "load");
    const auto store = parse_part(request, "store");
    // The "model" writes the KV of the chunks to store (the compute that produced them), and the
    // blocks a load fills are cleared first so stale bytes can never pass verification.
    if (store)
      for_each_block(*store, [&](const BlockTag& tag, void* device) {
        fill_pattern(tag, staging_);
        runtime_->memcpy_sync(device, staging_.data(), staging_.size());
      });
    if (load)
      for_each_block(*load, [&](const BlockTag&, void* device) {
        runtime_->memset_sync(device, 0x5A, config_.block_bytes);
      });
    std::vector<JobId> ids;
    if (load) ids.push_back(submit(*load, Direction::kLoad));
    if (store) ids.push_back(submit(*store, Direction::kStore));
    const std::vector<JobResult> results = engine_->wait(ids);

    nlohmann::json reply{{"op", "done"}, {"id", request.at("id")}};
    std::size_t next = 0;
    if (load) {
      const JobResult& r = results[next++];
      std::uint64_t verified = 0;
      std::uint64_t mismatched = 0;
      if (r.success) {
        for_each_block(*load, [&](const BlockTag& tag, void* device) {
          runtime_->memcpy_sync(staging_.data(), device, staging_.size());
          const std::uint64_t bad = count_mismatches(tag, staging_);
          mismatched += bad;
          verified += staging_.size() - bad;
        });
      }
      reply["load"] = result_json(r);
      reply["load"]["verified_bytes"] = verified;
      reply["load"]["mismatched_bytes"] = mismatched;
    }
    if (store) reply["store"] = result_json(results[next++]);
    return reply;
  }

  nlohmann::json bye_message() const {
    if (pool_rank_) {
      const EngineStats s = engine_->stats();
      const std::uint64_t reg = s.host_registered ? pool_rank_->mapped_bytes() : 0;
      return {{"op", "bye"},
              {"rank", rank_},
              {"dma_batches", s.dma_batches},
              {"kernel_batches", s.kernel_batches},
              {"fragments", s.fragments},
              {"descriptors", s.descriptors},
              {"registration",
               {{"pieces", 1},
                {"bytes", reg},
                {"seconds", pool_rank_->registration_seconds()},
                {"longest_piece_seconds", pool_rank_->registration_seconds()}}},
              // Its own range of the rank-major pool: 1/W of the chunk bytes.
              {"registered_bytes", reg}};
    }
    const EngineStats s = worker_->engine().stats();
    const BringupStatus b = worker_->region().bringup_status();
    const PopulateReport p = worker_->region().populate_report();
    const WorkerRegistration reg = worker_->registration();
    nlohmann::json bye{{"op", "bye"},
                       {"rank", rank_},
                       {"dma_batches", s.dma_batches},
                       {"kernel_batches", s.kernel_batches},
                       {"fragments", s.fragments},
                       {"descriptors", s.descriptors},
                       {"bringup",
                        {{"state", std::string(to_string(b.state))},
                         {"seconds", b.seconds},
                         {"ready_chunks", b.ready_chunks},
                         {"error", b.error ? b.error->what() : ""}}},
                       {"populate",
                        {{"method", std::string(to_string(p.method))},
                         {"bytes", p.bytes},
                         {"seconds", p.seconds}}}};
    bye["registration"] = {{"pieces", reg.pieces},
                           {"bytes", reg.bytes},
                           {"seconds", reg.seconds},
                           {"longest_piece_seconds", reg.longest_piece_seconds}};
    // The bytes this rank pinned and mapped for the device (issue 28: about 1/W of the region).
    bye["registered_bytes"] = reg.bytes;
    return bye;
  }

 private:
  template <typename Fn>
  void for_each_block(const JobPart& part, Fn&& fn) {
    const std::uint32_t bpc = config_.blocks_per_chunk;
    for (std::size_t i = 0; i < part.blocks.size(); ++i) {
      const BlockTag tag{.key = part.keys[i / bpc],
                         .rank = rank_,
                         .layer = 0,
                         .position = static_cast<std::uint32_t>(i % bpc)};
      for (std::uint32_t layer = 0; layer < config_.layers; ++layer) {
        BlockTag t = tag;
        t.layer = layer;
        auto* device =
            static_cast<std::byte*>(caches()[layer].data()) + part.blocks[i] * config_.block_bytes;
        fn(t, device);
      }
    }
  }

  JobId submit(const JobPart& part, Direction direction) {
    const std::span<const std::uint64_t> blocks(part.blocks);
    const std::span<const std::uint64_t> groups[] = {blocks};
    TransferSpec spec{.chunks = part.chunks, .skip = 0, .group_blocks = groups};
    const JobId id{part.job};
    engine_->submit(id, direction, spec, WaitOn::stream(compute_.view()));
    return id;
  }

  static nlohmann::json result_json(const JobResult& r) {
    return {{"success", r.success}, {"bytes", r.bytes}, {"seconds", r.seconds}, {"error", r.error}};
  }

  [[nodiscard]] std::span<const DeviceBuffer> caches() const {
    return pool_rank_ ? pool_rank_->caches() : worker_->caches();
  }

  RunConfig config_;
  std::uint32_t rank_;
  std::unique_ptr<OffloadWorker> worker_;
  std::unique_ptr<PoolRank> pool_rank_;
  DeviceRuntime* runtime_ = nullptr;
  TransferEngine* engine_ = nullptr;
  Stream compute_;  // before the worker's runtime goes (members go in reverse)
  std::vector<std::byte> staging_;
};

}  // namespace

int run_worker(int fd) {
  // Ctrl-C in a terminal reaches the whole process group: the scheduler decides when ranks stop
  // (it finishes the request in flight, then sends "exit"), so a rank only notes the signal.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  (void)std::signal(SIGINT, SIG_IGN);

  Channel channel(fd);
  std::optional<RankState> state;
  try {
    std::optional<nlohmann::json> hello;
    while (!hello && !g_stop.load()) hello = channel.receive(std::chrono::milliseconds(200));
    if (!hello) return 1;
    RunConfig config = hello->at("config").get<RunConfig>();
    const auto rank = hello->at("rank").get<std::uint32_t>();
    try {
      state.emplace(config, rank);
    } catch (const std::exception& e) {
      channel.send({{"op", "error"}, {"rank", rank}, {"message", e.what()}});
      return 1;
    }
    channel.send(state->ready_message());
    while (!g_stop.load()) {
      const auto message = channel.receive(std::chrono::milliseconds(200));
      if (!message) continue;
      const std::string op = message->at("op").get<std::string>();
      if (op == "exit") {
        channel.send(state->bye_message());
        break;
      }
      if (op == "request") channel.send(state->serve(*message));
    }
  } catch (const Error& e) {
    // The scheduler is gone (it stopped the ranks after an error of its own, which it reports:
    // a warning here would only come first and hide it) or sent something we cannot serve.
    // Either way leave cleanly (the region's last process out unlinks it).
    const bool scheduler_gone =
        e.code() == ErrorCode::kSystem && (e.sys_errno() == EPIPE || e.sys_errno() == ECONNRESET);
    if (scheduler_gone) {
      log().debug("run worker: the scheduler left ({})", e.what());
    } else {
      log().warn("run worker: {}", e.what());
    }
    state.reset();
    return 1;
  } catch (const std::exception& e) {
    log().warn("run worker: {}", e.what());
    state.reset();
    return 1;
  }
  state.reset();
  return 0;
}

}  // namespace kvoffload::run
