// The scheduler side's composition root (docs/DESIGN.md §7.4): region, Manager, secondary tiers
// and the tiered store, built in order and released in reverse (Note [Initialisation failures]).
#include <set>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/offload_stack.hpp>

#include "stack/init_hooks.hpp"
#include "stack/stack_internal.hpp"
#include "util/log.hpp"

namespace kvoffload {

std::string_view to_string(InitStep step) noexcept {
  switch (step) {
    case InitStep::kRegion:
      return "region";
    case InitStep::kPrimary:
      return "primary";
    case InitStep::kSecondary:
      return "secondary";
    case InitStep::kTieredStore:
      return "tiered_store";
    case InitStep::kRuntime:
      return "runtime";
    case InitStep::kTransferEngine:
      return "transfer_engine";
    case InitStep::kDeviceCaches:
      return "device_caches";
    case InitStep::kPieces:
      return "pieces";
  }
  return "unknown";
}

void validate(const StackConfig& config) {
  const RegionGeometry g = detail::validate_region(config.region);
  const ManagerConfig& m = config.manager;
  if (m.num_chunks != 0 && m.num_chunks != g.num_chunks()) {
    throw_invalid("manager: num_chunks " + std::to_string(m.num_chunks) +
                  " differs from the region's " + std::to_string(g.num_chunks()) +
                  " chunks (0 takes the region's)");
  }
  // The Manager's own rules, with the chunk count the stack will give it (the region's).
  ManagerConfig as_built = m;
  as_built.num_chunks = g.num_chunks();
  Manager::validate(as_built);
  if (m.store_threshold == 0 && m.threshold_tracker_capacity != 0) {
    throw_invalid("manager: threshold_tracker_capacity " +
                  std::to_string(m.threshold_tracker_capacity) +
                  " is set but store_threshold is 0 (no tracker is kept)");
  }
  const std::uint64_t record = file_tier_record_bytes(g.copies() * g.slot_stride());
  std::set<std::filesystem::path> roots;
  for (std::size_t i = 0; i < config.file_tiers.size(); ++i) {
    const FileTierOptions& t = config.file_tiers[i];
    FileTier::validate(t);
    if (t.capacity_bytes < record) {
      throw_invalid("file tier '" + t.name + "': capacity_bytes " +
                    std::to_string(t.capacity_bytes) + " cannot hold one chunk row (" +
                    std::to_string(record) + " bytes on disk)");
    }
    if (!roots.insert(t.root.lexically_normal()).second) {
      throw_invalid("file tier '" + t.name + "': root " + t.root.string() +
                    " is used by another tier of this configuration");
    }
  }
  for (const RemoteTierOptions& t : config.remote_tiers) {
    t.validate();
    const RemoteGeometry& rg = t.geometry;
    if (rg.slot_bytes != g.slot_bytes() || rg.world_size != g.world_size() ||
        rg.replicated != g.replicated() || rg.stride() != g.slot_stride()) {
      throw_invalid(
          "remote tier '" + t.name + "': geometry (slot_bytes " + std::to_string(rg.slot_bytes) +
          ", slot_stride " + std::to_string(rg.stride()) + ", world_size " +
          std::to_string(rg.world_size) + ", replicated " + (rg.replicated ? "yes" : "no") +
          ") differs from the region's (slot_bytes " + std::to_string(g.slot_bytes()) +
          ", slot_stride " + std::to_string(g.slot_stride()) + ", world_size " +
          std::to_string(g.world_size()) + ", replicated " + (g.replicated() ? "yes" : "no") + ")");
    }
  }
}

// ---- OffloadStack -------------------------------------------------------------------------------

std::unique_ptr<OffloadStack> OffloadStack::build(const StackConfig& config) {
  return build(config, InitHooks{});
}

std::unique_ptr<OffloadStack> OffloadStack::build(const StackConfig& config,
                                                  const InitHooks& hooks) {
  validate(config);  // before any resource exists
  std::unique_ptr<OffloadStack> s(new OffloadStack());
  s->after_release_ = hooks.after_release;
  try {
    s->region_.emplace(detail::make_region(hooks, config.region));

    detail::run_hook(hooks, InitStep::kPrimary, 0);
    ManagerConfig mc = config.manager;
    mc.num_chunks = s->region_->geometry().num_chunks();
    s->manager_ = std::make_unique<Manager>(mc);
    s->manager_->publish_live_stats(*s->region_);  // Note [Live stats]

    for (std::size_t i = 0; i < config.file_tiers.size(); ++i) {
      detail::run_hook(hooks, InitStep::kSecondary, i);
      s->tiers_.push_back(hooks.make_file_tier ? hooks.make_file_tier(config.file_tiers[i])
                                               : FileTier::open(config.file_tiers[i]));
      if (!s->tiers_.back()) {
        throw Error(ErrorCode::kInternal,
                    "file tier factory returned null for tier " + std::to_string(i));
      }
    }

    for (std::size_t i = 0; i < config.remote_tiers.size(); ++i) {
      detail::run_hook(hooks, InitStep::kSecondary, config.file_tiers.size() + i);
      s->tiers_.push_back(hooks.make_remote_tier ? hooks.make_remote_tier(config.remote_tiers[i])
                                                 : RemoteTier::open(config.remote_tiers[i]));
      if (!s->tiers_.back()) {
        throw Error(ErrorCode::kInternal,
                    "remote tier factory returned null for tier " + std::to_string(i));
      }
    }

    detail::run_hook(hooks, InitStep::kTieredStore, 0);
    std::vector<SecondaryTier*> raw;
    for (auto& t : s->tiers_) raw.push_back(t.get());
    s->store_ =
        std::make_unique<TieredStore>(*s->manager_, PrimaryRows::of(*s->region_), std::move(raw));
    s->store_->publish_live_stats(*s->region_);
  } catch (const std::exception& e) {
    log().debug("offload stack: initialisation failed ({}); releasing what was built", e.what());
    s->close();  // logs its own failures; the original exception propagates
    throw;
  }
  log().info("offload stack: region {} ({} chunks), {} secondary tier(s)",
             s->region_->path().string(), s->manager_->num_chunks(), s->tiers_.size());
  return s;
}

OffloadStack::~OffloadStack() {
  close();
}

bool OffloadStack::close() noexcept {
  bool ok = true;
  if (store_) {
    try {
      store_->drain();
    } catch (const std::exception& e) {
      ok = false;
      log().error("offload stack: draining the tiered store: {}", e.what());
    }
    store_.reset();  // its destructor drains again (nothing left) and never throws
    detail::released(after_release_, InitStep::kTieredStore, 0);
  }
  for (std::size_t i = tiers_.size(); i-- > 0;) {
    if (tiers_[i] && !tiers_[i]->close()) ok = false;
    tiers_[i].reset();
    detail::released(after_release_, InitStep::kSecondary, i);
  }
  tiers_.clear();
  if (manager_) {
    manager_.reset();
    detail::released(after_release_, InitStep::kPrimary, 0);
  }
  if (region_) {
    if (!region_->close()) ok = false;
    region_.reset();
    detail::released(after_release_, InitStep::kRegion, 0);
  }
  return ok;
}

}  // namespace kvoffload
