#include "worker.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/log.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "channel.hpp"
#include "kv_pattern.hpp"
#include "run_config.hpp"
#include "util/clock.hpp"

namespace kvoffload::run {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int /*signal*/) {
  g_stop.store(true);
}

using Clock = std::chrono::steady_clock;
using util::seconds_since;

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

// The rank's resources, in construction order; members are destroyed in reverse, so the engine
// (which unregisters host memory) goes before the device caches, the runtime and the region.
class RankState {
 public:
  RankState(const RunConfig& config, std::uint32_t rank) : config_(config), rank_(rank) {
    // Rank r on device r mod the device count (or as --devices says): one GPU per rank. The
    // count comes from a probe, which creates no context: a runtime made first on device 0 would
    // leave a context on GPU 0 in every rank (refused outright in EXCLUSIVE_PROCESS mode).
    const BackendInfo backend = probe_backend(config.backend);
    device_ = config.device_for_rank(rank, backend.device_count);
    RuntimeOptions ro;
    ro.device = device_;
    runtime_ = make_runtime(backend.name, ro);
    RegionOptions options;
    options.engine_id = config.engine_id;
    options.layout = {.num_chunks = config.num_chunks,
                      .slot_bytes = config.slot_bytes,
                      .world_size = config.world_size};
    options.rank = rank;
    if (!config.shm_dir.empty()) options.shm_dir = config.shm_dir;
    options.populate_threads = config.populate_threads;
    options.bringup = parse_bringup_mode(config.bringup);
    options.bringup_piece_bytes = config.bringup_piece_bytes;
    const bool background = options.bringup == BringupMode::kBackground;
    if (background) {
      // Note [Progressive bring-up]: each piece is registered as it comes up, so no single
      // driver call covers more than a piece. The engine below registers nothing itself: it runs
      // DMA until the pieces cover the region, then may use the copy kernel too.
      options.on_piece_ready = [this](std::span<std::byte> rows, std::uint64_t, std::uint64_t) {
        const auto start = Clock::now();
        HostRegistration reg = runtime_->register_host(rows.data(), rows.size());
        const double s = seconds_since(start);
        const std::lock_guard lock(pieces_mu_);
        if (engine_told_)
          engine_->note_host_registration(reg);  // the kernel path opens at the last piece
        pieces_.push_back(std::move(reg));
        piece_seconds_ += s;
        longest_piece_seconds_ = std::max(longest_piece_seconds_, s);
      };
    }
    region_.emplace(Region::create_or_join(options));
    try {
      finish_construction(config, rank, background);
    } catch (...) {
      // The bring-up thread uses runtime_ and pieces_: stop it (close) before members go.
      if (engine_) engine_->shutdown();
      engine_.reset();
      region_->close();
      throw;
    }
  }

  void finish_construction(const RunConfig& config, std::uint32_t rank, bool background) {
    if (background) {
      // Added before the engine's hook, so it runs after it: the engine drains first, then the
      // pieces are unregistered, then the region unmaps.
      region_->add_teardown_hook([this] {
        const std::lock_guard lock(pieces_mu_);
        for (auto& reg : pieces_) (void)reg.reset();
        pieces_.clear();
      });
    }
    const std::uint64_t tensor_bytes = config.gpu_blocks * config.block_bytes;
    KvGroup group;
    for (std::uint32_t layer = 0; layer < config.layers; ++layer) {
      caches_.push_back(runtime_->allocate_device(tensor_bytes));
      group.tensors.push_back({.base = reinterpret_cast<std::uint64_t>(caches_.back().data()),
                               .num_blocks = config.gpu_blocks,
                               .page_bytes = config.block_bytes,
                               .block_stride = config.block_bytes});
    }
    compute_ = runtime_->create_stream();
    const auto start = Clock::now();
    EngineOptions engine_options;
    engine_options.register_host = !background;
    engine_.emplace(*runtime_, *region_, rank, std::vector<KvGroup>{group}, config.blocks_per_chunk,
                    engine_options);
    if (background) {
      // The pieces registered so far, then (in on_piece_ready) each one as it comes.
      const std::lock_guard lock(pieces_mu_);
      for (const HostRegistration& reg : pieces_) engine_->note_host_registration(reg);
      engine_told_ = true;
    }
    registration_seconds_ = seconds_since(start);
    staging_.resize(config.block_bytes);
  }

  ~RankState() {
    if (engine_) engine_->shutdown();
    engine_.reset();
    if (region_) region_->close();
  }
  RankState(const RankState&) = delete;
  RankState& operator=(const RankState&) = delete;

  nlohmann::json ready_message() const {
    const PopulateReport& p = region_->populate_report();
    return {{"op", "ready"},
            {"rank", rank_},
            {"backend", std::string(runtime_->name())},
            {"device", device_},
            {"role", std::string(to_string(region_->role()))},
            {"populate",
             {{"method", std::string(to_string(p.method))},
              {"bytes", p.bytes},
              {"seconds", p.seconds}}},
            {"registration_seconds", registration_seconds_},
            {"host_registered", engine_->host_registered()},
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
    const EngineStats s = engine_->stats();
    const BringupStatus b = region_->bringup_status();
    const PopulateReport p = region_->populate_report();
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
    const std::lock_guard lock(pieces_mu_);
    bye["registration"] = {{"pieces", pieces_.size()},
                           {"seconds", piece_seconds_},
                           {"longest_piece_seconds", longest_piece_seconds_}};
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
            static_cast<std::byte*>(caches_[layer].data()) + part.blocks[i] * config_.block_bytes;
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

  RunConfig config_;
  std::uint32_t rank_;
  std::optional<Region> region_;
  std::unique_ptr<DeviceRuntime> runtime_;
  int device_ = 0;  // the device this rank uses
  std::vector<DeviceBuffer> caches_;
  Stream compute_;
  std::optional<TransferEngine> engine_;
  double registration_seconds_ = 0;
  std::vector<std::byte> staging_;
  // Pieces registered by the bring-up thread (background mode).
  mutable std::mutex pieces_mu_;
  std::vector<HostRegistration> pieces_;
  bool engine_told_ = false;  // engine_ exists and knows every piece so far (pieces_mu_)
  double piece_seconds_ = 0;
  double longest_piece_seconds_ = 0;
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
