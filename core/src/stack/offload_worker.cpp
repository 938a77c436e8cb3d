// One rank, assembled and torn down in one place (docs/DESIGN.md §7.4, Note [Rank assembly]).

#include <algorithm>
#include <chrono>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/offload_stack.hpp>

#include "stack/init_hooks.hpp"
#include "stack/stack_internal.hpp"
#include "util/log.hpp"

// Note [Rank assembly]
// ~~~~~~~~~~~~~~~~~~~~
// A rank needs a device runtime to register host memory, a region whose pieces come up over
// time, and a transfer engine that may use the kernel path only on registered memory. Built in
// this order, so that progressive bring-up works the same for every engine (the program, C,
// Python, vLLM):
//   1. probe the backend (no context is created): the device count picks the rank's device, so
//      no runtime is ever made on device 0 first (one context per rank, on its own GPU);
//   2. the runtime on that device, BEFORE the region: the region's first piece is registered the
//      moment it is populated, in blocking and background bring-up alike;
//   3. the region, ranked: on_piece_ready registers each piece (no single driver call covers more
//      than a piece, Note [Growing pieces]) and tells the engine when one exists; on_teardown
//      unregisters every piece, and is in place before the first piece, so a failed blocking
//      bring-up still unregisters before its pages are unmapped;
//   4. the device caches, when the worker allocates them;
//   5. the transfer engine, which registers nothing itself: it is told of the pieces registered so
//      far, then of each new one (under the pieces' lock, so none is missed or told twice).
// close() goes the other way, in the one order that keeps a registration from outliving its
// pages and a copy from outliving either: the engine drains (it is first detached from the
// pieces, so a piece registered meanwhile is not told to a closed engine), the caches are freed,
// the region closes (its bring-up thread stops and is joined, the pieces unregister, then
// munmap), and the runtime goes last. A failure at any step of build() runs the same close().

namespace kvoffload {

namespace {

using Clock = std::chrono::steady_clock;

// "0,3" for an error message.
std::string device_list(const std::vector<int>& devices) {
  std::string out;
  for (const int d : devices) out += (out.empty() ? "" : ",") + std::to_string(d);
  return out;
}

// The device rank `rank` uses (WorkerConfig::devices) on a backend with `count` devices.
int choose_device(const WorkerConfig& config, std::uint32_t rank, const BackendInfo& backend) {
  const int count = backend.device_count;
  if (count <= 0) return config.devices.empty() ? 0 : config.devices[rank % config.devices.size()];
  if (config.devices.empty()) return static_cast<int>(rank % static_cast<std::uint32_t>(count));
  const int d = config.devices[rank % config.devices.size()];
  if (d >= count) {
    throw_invalid("worker: devices " + device_list(config.devices) + ": rank " +
                  std::to_string(rank) + " would use device " + std::to_string(d) + ", but the " +
                  backend.name + " backend has " + std::to_string(count) + " device(s), 0 to " +
                  std::to_string(count - 1));
  }
  return d;
}

// The one KV group over `caches` (WorkerConfig::caches): tensor after tensor, blocks packed.
std::vector<KvGroup> groups_over(const DeviceCaches& c, std::span<const DeviceBuffer> buffers) {
  KvGroup group;
  for (std::uint32_t t = 0; t < c.tensors; ++t) {
    const std::uint64_t base =
        buffers.empty() ? 1 : reinterpret_cast<std::uint64_t>(buffers[t].data());
    group.tensors.push_back({.base = base,
                             .num_blocks = c.num_blocks,
                             .page_bytes = c.block_bytes,
                             .block_stride = c.block_bytes});
  }
  return {group};
}

}  // namespace

// The bring-up pieces' registrations, written by the bring-up thread (background) or by
// create_or_join (blocking) and read by the serving threads.
struct OffloadWorker::Pieces {
  explicit Pieces(DeviceRuntime& rt) : runtime(rt) {}

  // RegionOptions::on_piece_ready. A failure (the register call or the engine's refusal) fails
  // the bring-up; a registration made before the refusal unregisters on its way out, while the
  // piece is still mapped.
  void register_piece(std::span<std::byte> rows) {
    const auto start = Clock::now();
    HostRegistration reg = runtime.register_host(rows.data(), rows.size());
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    const std::lock_guard lock(mu);
    if (engine != nullptr) engine->note_host_registration(reg);
    stats.pieces += 1;
    stats.bytes += reg.bytes();
    stats.seconds += s;
    stats.longest_piece_seconds = std::max(stats.longest_piece_seconds, s);
    regs.push_back(std::move(reg));
  }

  // Tells `e` of every piece so far, and from now on of each new one.
  void attach(TransferEngine& e) {
    const std::lock_guard lock(mu);
    for (const HostRegistration& reg : regs) e.note_host_registration(reg);
    engine = &e;
  }

  void detach() noexcept {
    const std::lock_guard lock(mu);
    engine = nullptr;
  }

  // Unregisters every piece, newest first (RegionOptions::on_teardown: before munmap). Returns
  // false when one failed (logged by the runtime); every piece is still released.
  bool release() noexcept {
    const std::lock_guard lock(mu);
    bool ok = true;
    for (auto it = regs.rbegin(); it != regs.rend(); ++it) {
      if (!it->reset()) ok = false;
    }
    regs.clear();
    engine = nullptr;
    return ok;
  }

  [[nodiscard]] WorkerRegistration snapshot() const {
    const std::lock_guard lock(mu);
    return stats;
  }

  DeviceRuntime& runtime;
  mutable std::mutex mu;
  std::vector<HostRegistration> regs;  // under mu
  TransferEngine* engine = nullptr;    // under mu; null: none yet, or closing
  WorkerRegistration stats;            // under mu
};

void validate(const WorkerConfig& config) {
  const RegionGeometry g = detail::validate_region(config.region);
  if (!config.region.rank) throw_invalid("worker: region.rank is required (the worker's rank)");
  if (config.region.on_piece_ready || config.region.on_teardown) {
    throw_invalid(
        "worker: region.on_piece_ready and region.on_teardown must be empty: the worker "
        "registers the bring-up pieces itself");
  }
  if (config.blocks_per_chunk == 0) throw_invalid("worker: blocks_per_chunk is 0");
  if (config.groups.empty() == !config.caches.has_value()) {
    throw_invalid(config.groups.empty()
                      ? "worker: no KV groups and no caches to allocate; give exactly one"
                      : "worker: both KV groups and caches to allocate; give exactly one");
  }
  if (config.caches) {
    const DeviceCaches& c = *config.caches;
    if (c.tensors == 0 || c.num_blocks == 0 || c.block_bytes == 0) {
      throw_invalid("worker: caches of " + std::to_string(c.tensors) + " tensor(s) x " +
                    std::to_string(c.num_blocks) + " block(s) x " + std::to_string(c.block_bytes) +
                    " bytes; each must be > 0");
    }
    if (c.num_blocks > UINT64_MAX / c.block_bytes) {
      throw_invalid("worker: caches of " + std::to_string(c.num_blocks) + " blocks x " +
                    std::to_string(c.block_bytes) + " bytes per tensor overflow 64 bits");
    }
  }
  for (const int d : config.devices) {
    if (d < 0) {
      throw_invalid("worker: devices " + device_list(config.devices) +
                    ": a device ordinal must be >= 0");
    }
  }
  const std::string& b = config.backend;
  if (b != "auto" && b != "host" && b != "sim" && b != "cuda" && b != "hip") {
    throw_invalid("worker: backend '" + b +
                  "' is not a backend name (auto, host, sim, cuda or hip)");
  }
  if (b != "auto") {
    for (const BackendInfo& info : list_backends()) {
      if (info.name == b && !info.built) {
        throw Error(ErrorCode::kNotAvailable,
                    "worker: backend '" + b + "' is not available: " + info.detail);
      }
    }
  }
  // The KV layout against this rank's slots, as the transfer engine will check it, from the
  // geometry alone. KvLayout::validate reads only sizes and offsets; `base` just has to be set.
  static std::byte placeholder{};
  KvLayout layout;
  layout.groups = config.caches ? groups_over(*config.caches, {}) : config.groups;
  layout.blocks_per_chunk = config.blocks_per_chunk;
  layout.host = HostSlots{
      .base = &placeholder,
      .buffer_bytes = g.data_bytes(),
      .num_chunks = g.num_chunks(),
      .row_stride = g.row_stride(),
      .slot_offset = static_cast<std::uint64_t>(g.copy_index(*config.region.rank)) * g.slot_bytes(),
      .slot_bytes = g.slot_bytes()};
  layout.validate();
}

OffloadWorker::OffloadWorker() = default;

std::unique_ptr<OffloadWorker> OffloadWorker::build(const WorkerConfig& config) {
  return build(config, InitHooks{});
}

std::unique_ptr<OffloadWorker> OffloadWorker::build(const WorkerConfig& config,
                                                    const InitHooks& hooks) {
  validate(config);  // before any resource exists
  std::unique_ptr<OffloadWorker> w(new OffloadWorker());
  w->after_release_ = hooks.after_release;
  const std::uint32_t rank = *config.region.rank;
  try {
    detail::run_hook(hooks, InitStep::kRuntime, 0);
    const BackendInfo backend = probe_backend(config.backend);
    w->device_ = choose_device(config, rank, backend);
    RuntimeOptions ro = config.runtime;
    ro.device = w->device_;
    w->runtime_ =
        hooks.make_runtime ? hooks.make_runtime(backend.name, ro) : make_runtime(backend.name, ro);
    if (!w->runtime_) throw Error(ErrorCode::kInternal, "runtime factory returned null");

    w->pieces_ = std::make_unique<Pieces>(*w->runtime_);
    RegionOptions region = config.region;
    Pieces* pieces = w->pieces_.get();
    OffloadWorker* self = w.get();
    region.on_piece_ready = [pieces](std::span<std::byte> rows, std::uint64_t, std::uint64_t) {
      pieces->register_piece(rows);
    };
    region.on_teardown = [pieces, self] {
      if (!pieces->release()) log().error("offload worker: unregistering a bring-up piece failed");
      detail::released(self->after_release_, InitStep::kPieces, 0);
    };
    w->region_.emplace(detail::make_region(hooks, region));

    if (config.caches) {
      detail::run_hook(hooks, InitStep::kDeviceCaches, 0);
      const DeviceCaches& c = *config.caches;
      for (std::uint32_t t = 0; t < c.tensors; ++t)
        w->caches_.push_back(w->runtime_->allocate_device(c.num_blocks * c.block_bytes));
      w->groups_ = groups_over(c, w->caches_);
    } else {
      w->groups_ = config.groups;
    }

    detail::run_hook(hooks, InitStep::kTransferEngine, 0);
    EngineOptions eo = config.engine;
    eo.register_host = false;  // the pieces are registered above (Note [Rank assembly])
    w->engine_ = std::make_unique<TransferEngine>(*w->runtime_, *w->region_, rank, w->groups_,
                                                  config.blocks_per_chunk, eo);
    w->pieces_->attach(*w->engine_);
  } catch (const std::exception& e) {
    log().debug("offload worker: initialisation failed ({}); releasing what was built", e.what());
    w->close();
    throw;
  }
  return w;
}

OffloadWorker::~OffloadWorker() {
  close();
}

WorkerRegistration OffloadWorker::registration() const {
  return pieces_ ? pieces_->snapshot() : WorkerRegistration{};
}

bool OffloadWorker::close() noexcept {
  bool ok = true;
  if (engine_) {
    if (pieces_) pieces_->detach();
    engine_->shutdown();  // drains both directions; registers nothing of its own
    engine_.reset();
    detail::released(after_release_, InitStep::kTransferEngine, 0);
  }
  if (!caches_.empty()) {
    caches_.clear();
    detail::released(after_release_, InitStep::kDeviceCaches, 0);
  }
  if (region_) {
    // Joins the bring-up thread, then on_teardown unregisters the pieces, then munmap.
    if (!region_->close()) ok = false;
    region_.reset();
    detail::released(after_release_, InitStep::kRegion, 0);
  }
  // A region that never came up (its create_or_join threw before its teardown was in place)
  // registered nothing; a piece left here would mean a region that failed to run on_teardown.
  if (pieces_ && !pieces_->release()) ok = false;
  pieces_.reset();
  if (runtime_) {
    runtime_.reset();
    detail::released(after_release_, InitStep::kRuntime, 0);
  }
  return ok;
}

}  // namespace kvoffload
