#pragma once
// Building the runtime's resources in order, with one cleanup path (docs/DESIGN.md §7.4).
//
// Scheduler side (OffloadStack): validate everything -> region -> primary (Manager) -> secondary
// tiers (in order) -> tiered store. Worker side (OffloadWorker): validate -> region (ranked) ->
// device runtime -> transfer engine (registers the region).
//
// Note [Initialisation failures]: the whole configuration is validated before the first resource
// exists, so a bad tier root or capacity never creates a region. When a step throws, what was
// built is released in reverse order (tiers closed, manager dropped, region closed: the last
// process out unlinks the file) and the ORIGINAL exception is rethrown unchanged; a failure while
// releasing is logged and never replaces it. Every step goes through InitHooks, so a test can fail
// any step (before_step) or substitute a factory that fails inside it.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/export.h>
#include <kvoffload/file_tier.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/manager.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/remote_tier.hpp>
#include <kvoffload/tier.hpp>
#include <kvoffload/tiered_store.hpp>
#include <kvoffload/transfer_engine.hpp>

namespace kvoffload {

enum class InitStep : std::uint8_t {
  kRegion = 0,
  kPrimary = 1,    // the Manager
  kSecondary = 2,  // one per tier (index = position in the config)
  kTieredStore = 3,
  kRuntime = 4,         // worker: the device runtime
  kTransferEngine = 5,  // worker: the transfer engine (host registration)
};
KVOFFLOAD_API std::string_view to_string(InitStep step) noexcept;

struct InitHooks {
  // Called before each step; throwing from it fails that step (tests).
  std::function<void(InitStep step, std::size_t index)> before_step;
  // Factories; empty: the real ones (Region::create_or_join, FileTier::open, make_runtime).
  std::function<Region(const RegionOptions&)> make_region;
  std::function<std::unique_ptr<SecondaryTier>(const FileTierOptions&)> make_file_tier;
  std::function<std::unique_ptr<SecondaryTier>(const RemoteTierOptions&)> make_remote_tier;
  std::function<std::unique_ptr<DeviceRuntime>(std::string_view, const RuntimeOptions&)>
      make_runtime;
  // Called by close() right after each resource is released (also on a failed build), so tests
  // can record the release order. Kept by the built object; must not throw.
  std::function<void(InitStep step, std::size_t index)> after_release;
};

struct StackConfig {
  RegionOptions region;                     // the scheduler maps it unranked (rank = nullopt)
  ManagerConfig manager;                    // num_chunks 0: the region's; else must equal it
  std::vector<FileTierOptions> file_tiers;  // secondary tiers, fastest first
  // Distributed tiers, after the file tiers. Their geometry's slot_bytes, world_size and
  // replicated must match the region's layout (the fingerprint is computed from them).
  std::vector<RemoteTierOptions> remote_tiers;
};

// Throws kInvalidArgument naming the field; touches nothing (stat/access of tier roots only).
KVOFFLOAD_API void validate(const StackConfig& config);

class KVOFFLOAD_API OffloadStack {
 public:
  static std::unique_ptr<OffloadStack> build(const StackConfig& config,
                                             const InitHooks& hooks = {});
  ~OffloadStack();
  OffloadStack(const OffloadStack&) = delete;
  OffloadStack& operator=(const OffloadStack&) = delete;

  [[nodiscard]] Region& region() noexcept { return *region_; }
  [[nodiscard]] Manager& manager() noexcept { return *manager_; }
  [[nodiscard]] TieredStore& store() noexcept { return *store_; }
  [[nodiscard]] std::span<const std::unique_ptr<SecondaryTier>> tiers() const noexcept {
    return tiers_;
  }

  // Drains the store, then releases tiers (reverse order), manager and region. Idempotent, never
  // throws; false when a step failed (logged; every later step still runs).
  bool close() noexcept;

 private:
  OffloadStack() = default;
  std::optional<Region> region_;
  std::unique_ptr<Manager> manager_;
  std::vector<std::unique_ptr<SecondaryTier>> tiers_;
  std::unique_ptr<TieredStore> store_;
  std::function<void(InitStep, std::size_t)> after_release_;
};

struct WorkerConfig {
  RegionOptions region;          // rank required
  std::string backend = "auto";  // make_runtime name
  RuntimeOptions runtime;
  std::vector<KvGroup> groups;
  std::uint32_t blocks_per_chunk = 0;  // > 0
  EngineOptions engine;
};

// The whole worker configuration, before any resource exists: region options and rank, the
// backend name (kNotAvailable for one not built into this library) and the KV layout against this
// rank's slot (KvLayout::validate on the region's geometry). Throws kInvalidArgument naming the
// value; touches nothing.
KVOFFLOAD_API void validate(const WorkerConfig& config);

class KVOFFLOAD_API OffloadWorker {
 public:
  static std::unique_ptr<OffloadWorker> build(const WorkerConfig& config,
                                              const InitHooks& hooks = {});
  ~OffloadWorker();
  OffloadWorker(const OffloadWorker&) = delete;
  OffloadWorker& operator=(const OffloadWorker&) = delete;

  [[nodiscard]] Region& region() noexcept { return *region_; }
  [[nodiscard]] DeviceRuntime& runtime() noexcept { return *runtime_; }
  [[nodiscard]] TransferEngine& engine() noexcept { return *engine_; }

  // Engine (drain, unregister), runtime, region. Idempotent, never throws.
  bool close() noexcept;

 private:
  OffloadWorker() = default;
  std::optional<Region> region_;
  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<TransferEngine> engine_;
  std::function<void(InitStep, std::size_t)> after_release_;
};

}  // namespace kvoffload
