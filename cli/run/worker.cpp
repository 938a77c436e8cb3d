#include "worker.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <optional>
#include <span>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/log.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "channel.hpp"
#include "kv_pattern.hpp"
#include "run_config.hpp"

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

// One rank of the run: an OffloadWorker (Note [Rank assembly]: probe, runtime, region with each
// bring-up piece registered as it comes up, the KV caches, the transfer engine; torn down in the
// one safe order), a compute stream, and the staging buffer the "model" writes through.
class RankState {
 public:
  RankState(const RunConfig& config, std::uint32_t rank)
      : config_(config), rank_(rank), worker_(OffloadWorker::build(worker_config(config, rank))) {
    compute_ = worker_->runtime().create_stream();
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
    const PopulateReport p = worker_->region().populate_report();
    return {{"op", "ready"},
            {"rank", rank_},
            {"backend", std::string(worker_->runtime().name())},
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
        worker_->runtime().memcpy_sync(device, staging_.data(), staging_.size());
      });
    if (load)
      for_each_block(*load, [&](const BlockTag&, void* device) {
        worker_->runtime().memset_sync(device, 0x5A, config_.block_bytes);
      });
    std::vector<JobId> ids;
    if (load) ids.push_back(submit(*load, Direction::kLoad));
    if (store) ids.push_back(submit(*store, Direction::kStore));
    const std::vector<JobResult> results = worker_->engine().wait(ids);

    nlohmann::json reply{{"op", "done"}, {"id", request.at("id")}};
    std::size_t next = 0;
    if (load) {
      const JobResult& r = results[next++];
      std::uint64_t verified = 0;
      std::uint64_t mismatched = 0;
      if (r.success) {
        for_each_block(*load, [&](const BlockTag& tag, void* device) {
          worker_->runtime().memcpy_sync(staging_.data(), device, staging_.size());
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
        auto* device = static_cast<std::byte*>(worker_->caches()[layer].data()) +
                       part.blocks[i] * config_.block_bytes;
        fn(t, device);
      }
    }
  }

  JobId submit(const JobPart& part, Direction direction) {
    const std::span<const std::uint64_t> blocks(part.blocks);
    const std::span<const std::uint64_t> groups[] = {blocks};
    TransferSpec spec{.chunks = part.chunks, .skip = 0, .group_blocks = groups};
    const JobId id{part.job};
    worker_->engine().submit(id, direction, spec, WaitOn::stream(compute_.view()));
    return id;
  }

  static nlohmann::json result_json(const JobResult& r) {
    return {{"success", r.success}, {"bytes", r.bytes}, {"seconds", r.seconds}, {"error", r.error}};
  }

  RunConfig config_;
  std::uint32_t rank_;
  std::unique_ptr<OffloadWorker> worker_;
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
