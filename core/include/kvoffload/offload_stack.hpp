#pragma once
// Building the runtime's resources in order, with one cleanup path (docs/DESIGN.md §7.4).
//
// Scheduler side (OffloadStack): validate everything -> region -> primary (Manager) -> secondary
// tiers (in order) -> tiered store. Worker side (OffloadWorker, Note [Rank assembly] in
// core/src/stack/offload_worker.cpp): validate -> probe -> device runtime -> region (ranked; each
// bring-up piece registered as it comes up) -> device caches -> transfer engine (told of every
// piece).
//
// Note [Initialisation failures]: the whole configuration is validated before the first resource
// exists, so a bad tier root or capacity never creates a region. When a step throws, what was
// built is released in reverse order (tiers closed, manager dropped, region closed: the last
// process out unlinks the file) and the ORIGINAL exception is rethrown unchanged; a failure while
// releasing is logged and never replaces it. Every step goes through InitHooks (internal:
// core/src/stack/init_hooks.hpp), so a test can fail any step (before_step) or substitute a
// factory that fails inside it.

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
  kTransferEngine = 5,  // worker: the transfer engine
  kDeviceCaches = 6,    // worker: the KV caches it allocates (WorkerConfig::caches)
  kPieces = 7,          // worker: the host registrations of the bring-up pieces (released only)
};
KVOFFLOAD_API std::string_view to_string(InitStep step) noexcept;

// The test seam of Note [Initialisation failures]: a hook before each step, substitute factories,
// a hook after each release. Internal (core/src/stack/init_hooks.hpp); an engine calls build()
// without it.
struct InitHooks;

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
  static std::unique_ptr<OffloadStack> build(const StackConfig& config);
  // The same, each step through `hooks` (tests).
  static std::unique_ptr<OffloadStack> build(const StackConfig& config, const InitHooks& hooks);
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

// KV caches the worker allocates on its own device, for a rank whose engine does not own them
// (the `kvoffload` program, benches, tests): one group of `tensors` tensors, each `num_blocks`
// blocks of `block_bytes`, blocks packed.
struct DeviceCaches {
  std::uint32_t tensors = 0;      // > 0
  std::uint64_t num_blocks = 0;   // > 0
  std::uint64_t block_bytes = 0;  // > 0
};

struct WorkerConfig {
  // Rank required. bringup, bringup_piece_bytes and bringup_first_piece_bytes are honoured;
  // on_piece_ready and on_teardown must be empty: the worker registers the pieces itself
  // (Note [Rank assembly]).
  RegionOptions region;
  std::string backend = "auto";  // make_runtime name: auto, host, sim, cuda or hip
  // The rank's device: rank r takes devices[r mod size]; empty: device r mod the count the probe
  // sees (one device per rank). Each is checked against the probe before a runtime exists.
  // runtime.device is set from it.
  std::vector<int> devices;
  RuntimeOptions runtime;
  // The device KV: either `groups` (the engine's own caches: vLLM's tensors) or `caches` (the
  // worker allocates them on its device, after the runtime exists), exactly one of the two.
  std::vector<KvGroup> groups;
  std::optional<DeviceCaches> caches;
  std::uint32_t blocks_per_chunk = 0;  // > 0
  EngineOptions engine;                // register_host is ignored: the worker registers
};

// The whole worker configuration, before any resource exists: region options and rank, the
// backend name (kNotAvailable for one not built into this library), the devices, and the KV
// layout against this rank's slot (KvLayout::validate on the region's geometry). Throws
// kInvalidArgument naming the value; touches nothing.
KVOFFLOAD_API void validate(const WorkerConfig& config);

// The worker's host registrations: one per bring-up piece (Note [Rank assembly]).
struct WorkerRegistration {
  std::uint64_t pieces = 0;
  std::uint64_t bytes = 0;  // registered with the device: this rank's registered_bytes
  double seconds = 0.0;     // in register calls, all pieces
  double longest_piece_seconds = 0.0;
};

// One rank, assembled and torn down in one place (Note [Rank assembly]).
class KVOFFLOAD_API OffloadWorker {
 public:
  // Blocking bring-up: returns with the pool up and registered (or throws, having released
  // everything). Background: returns once the region is mapped; the pieces come up, are
  // registered and told to the engine while the rank serves (region().bringup_status()).
  static std::unique_ptr<OffloadWorker> build(const WorkerConfig& config);
  // The same, each step through `hooks` (tests).
  static std::unique_ptr<OffloadWorker> build(const WorkerConfig& config, const InitHooks& hooks);
  ~OffloadWorker();
  OffloadWorker(const OffloadWorker&) = delete;
  OffloadWorker& operator=(const OffloadWorker&) = delete;

  [[nodiscard]] Region& region() noexcept { return *region_; }
  [[nodiscard]] DeviceRuntime& runtime() noexcept { return *runtime_; }
  [[nodiscard]] TransferEngine& engine() noexcept { return *engine_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  // The caches allocated from WorkerConfig::caches (empty when the engine gave its groups).
  [[nodiscard]] std::span<const DeviceBuffer> caches() const noexcept { return caches_; }
  // The KV groups the engine moves (the given ones, or those over caches()).
  [[nodiscard]] const std::vector<KvGroup>& groups() const noexcept { return groups_; }
  // So far (thread-safe: background pieces register while the rank serves).
  [[nodiscard]] WorkerRegistration registration() const;

  // Engine (drains), caches, region (bring-up joined, pieces unregistered, unmapped), runtime
  // last. Idempotent, never throws; false when a step failed (logged; every later step runs).
  bool close() noexcept;

 private:
  struct Pieces;
  OffloadWorker();
  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<Pieces> pieces_;  // before region_: the bring-up thread writes to it
  std::optional<Region> region_;
  std::vector<DeviceBuffer> caches_;
  std::vector<KvGroup> groups_;
  std::unique_ptr<TransferEngine> engine_;
  int device_ = 0;
  std::function<void(InitStep, std::size_t)> after_release_;
};

}  // namespace kvoffload
