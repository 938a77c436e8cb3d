#pragma once
// The structs behind the C API's opaque handles (the header declares them incomplete).

#include <string>
#include <utility>

#include <kvoffload/kvoffload.h>
#include <kvoffload/region.hpp>

#include "capi/capi_internal.hpp"

struct kvo_region {
  explicit kvo_region(kvoffload::Region r) : region(std::move(r)), path(region.path().string()) {}
  kvoffload::Region region;
  std::string path;  // kept as a std::string so kvo_region_path can hand out a stable char*
};

#include <mutex>
#include <vector>

#include <kvoffload/manager.hpp>

// The manager is thread-compatible; the handle serialises calls so C callers may share it. The
// scratch vectors convert between kvo_block_key and BlockKey without allocating once they have
// grown to the largest call.
struct kvo_manager {
  explicit kvo_manager(const kvoffload::ManagerConfig& config) : manager(config) {}
  std::mutex mutex;
  kvoffload::Manager manager;
  std::vector<kvoffload::BlockKey> keys;
  std::vector<kvoffload::BlockKey> protected_keys;
  std::vector<kvoffload::LookupResult> results;
  std::vector<kvoffload::SlotIndex> slots;
  // take_events output: C events pointing into event_keys (owned here until the next take).
  std::vector<kvo_manager_event> events;
  std::vector<kvo_block_key> event_keys;
};

#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/transfer_engine.hpp>

// A runtime plus the streams, events and device buffers made through the C API (named by their
// native handle). The owners are declared after the runtime so they are destroyed before it.
struct kvo_runtime {
  explicit kvo_runtime(std::unique_ptr<kvoffload::DeviceRuntime> rt)
      : runtime(std::move(rt)), name(runtime->name()) {}
  std::unique_ptr<kvoffload::DeviceRuntime> runtime;
  std::string name;
  std::mutex mutex;  // guards the maps (the runtime itself is thread-safe)
  std::unordered_map<std::uint64_t, kvoffload::Stream> streams;
  std::unordered_map<std::uint64_t, kvoffload::Event> events;
  std::unordered_map<std::uint64_t, kvoffload::DeviceBuffer> buffers;
};

namespace kvoffload::capi {
// The runtime behind a C handle (kInvalidArgument naming `function` when it is NULL).
inline kvo_runtime& runtime_of(kvo_runtime_t* rt, const char* function) {
  require_arg(rt, function, "runtime");
  return *rt;
}
}  // namespace kvoffload::capi

struct kvo_registration {
  kvoffload::HostRegistration registration;
};

// The engine plus results poll() collected but the caller had no room for. Owned (made by
// kvo_engine_create*) or borrowed (a worker's, kvo_worker_engine: the worker closes it).
struct kvo_engine {
  explicit kvo_engine(kvoffload::TransferEngine e) : owned(std::move(e)), engine(*owned) {}
  explicit kvo_engine(kvoffload::TransferEngine* worker_engine)
      : engine(*worker_engine), borrowed(true) {}
  std::optional<kvoffload::TransferEngine> owned;
  kvoffload::TransferEngine& engine;
  const bool borrowed = false;
  std::mutex mutex;  // guards `undelivered`
  std::deque<kvoffload::JobResult> undelivered;
};

namespace kvoffload::capi {
// The C API's conversions, shared by the engine and worker wrappers (kInvalidArgument naming
// `function` and the field).
RegionOptions region_options_of(const kvo_region_options* options, const char* function);
std::vector<KvGroup> groups_of(const kvo_kv_group* groups, size_t num_groups, const char* function);
EngineOptions engine_options_of(const kvo_engine_options* options, const char* function);
}  // namespace kvoffload::capi
