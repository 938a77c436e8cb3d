// C API over kvoffload::pool::NodePool (docs/DESIGN.md §6.6).
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <kvoffload/node_pool.hpp>

#include "capi/capi_internal.hpp"

using kvoffload::BlockKey;
using kvoffload::capi::guarded;
using kvoffload::capi::invalid_arg;
using kvoffload::pool::NodePool;

// One tenant; calls are serialised on the handle.
struct kvo_pool {
  explicit kvo_pool(NodePool p) : pool(std::move(p)) {}
  std::mutex mutex;
  NodePool pool;
  std::vector<BlockKey> keys;
};

namespace {

std::span<const BlockKey> keys_of(kvo_pool& h, const kvo_block_key* keys, size_t count,
                                  const char* fn) {
  if (count == 0) return {};
  if (keys == nullptr) invalid_arg(fn, "keys", "is NULL with count " + std::to_string(count));
  h.keys.resize(count);
  for (size_t i = 0; i < count; ++i) h.keys[i] = BlockKey(keys[i].hi, keys[i].lo);
  return h.keys;
}

std::span<const std::uint32_t> slots_of(const uint32_t* slots, size_t count, const char* fn) {
  if (count != 0 && slots == nullptr)
    invalid_arg(fn, "slots", "is NULL with count " + std::to_string(count));
  return {slots, count};
}

void require_pool_out(const void* out, size_t count, const char* fn, const char* name) {
  if (count != 0 && out == nullptr)
    invalid_arg(fn, name, "is NULL with count " + std::to_string(count));
}

std::string text(const char* s) {
  return s == nullptr ? std::string() : std::string(s);
}

}  // namespace

extern "C" {

kvo_status kvo_pool_options_init(kvo_pool_options* options) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    *options = kvo_pool_options{};
    options->struct_size = sizeof(kvo_pool_options);
    options->world_size = 1;
    options->max_tenants = 16;
    options->lock_timeout_ms = 5000;
    options->sweep_interval_ms = 1000;
    options->policy = KVO_POLICY_LRU;
  });
}

kvo_status kvo_pool_attach(const kvo_pool_options* options, kvo_pool_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    KVO_ARG(out);
    *out = nullptr;
    if (options->struct_size != sizeof(kvo_pool_options)) {
      invalid_arg(fn, "options",
                  "has struct_size " + std::to_string(options->struct_size) + ", expected " +
                      std::to_string(sizeof(kvo_pool_options)) +
                      " (initialise it with kvo_pool_options_init)");
    }
    kvoffload::pool::PoolOptions o;
    o.name = text(options->name);
    o.engine_id = text(options->engine_id);
    o.shm_dir = text(options->shm_dir);
    o.geometry.slot_bytes = options->slot_bytes;
    o.geometry.slot_count = options->slot_count;
    o.geometry.world_size = options->world_size;
    o.geometry.layout = text(options->layout);
    o.geometry.dtype = text(options->dtype);
    o.geometry.fingerprint = text(options->fingerprint);
    o.max_tenants = options->max_tenants;
    o.cap_bytes = options->cap_bytes;
    o.cap_fraction = options->cap_fraction;
    o.lock_timeout = std::chrono::milliseconds(options->lock_timeout_ms);
    o.sweep_interval = std::chrono::milliseconds(options->sweep_interval_ms);
    switch (kvoffload::capi::enum_value(options->policy)) {
      case KVO_POLICY_LRU:
        o.policy = kvoffload::PolicyKind::kLru;
        break;
      case KVO_POLICY_ARC:
        o.policy = kvoffload::PolicyKind::kArc;
        break;
      default:
        invalid_arg(fn, "options->policy",
                    "is " + std::to_string(kvoffload::capi::enum_value(options->policy)) +
                        "; use KVO_POLICY_LRU or KVO_POLICY_ARC");
    }
    *out = new kvo_pool(NodePool::attach(o));
  });
}

void kvo_pool_close(kvo_pool_t* pool) {
  delete pool;
}

kvo_status kvo_pool_lookup_keys(kvo_pool_t* pool, const kvo_block_key* keys, size_t count, int pin,
                                uint32_t* slots_out, kvo_pool_lookup* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    KVO_ARG(out);
    const std::lock_guard lock(pool->mutex);
    const auto r = pool->pool.lookup(keys_of(*pool, keys, count, fn), pin != 0);
    if (slots_out != nullptr) std::copy(r.slots.begin(), r.slots.end(), slots_out);
    *out = kvo_pool_lookup{r.hits, r.cross_engine_hits};
  });
}

kvo_status kvo_pool_prepare_stores(kvo_pool_t* pool, const kvo_block_key* keys, size_t count,
                                   uint32_t* positions_out, uint32_t* slots_out,
                                   kvo_block_key* evicted_out, kvo_pool_store* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    KVO_ARG(out);
    require_pool_out(positions_out, count, fn, "positions_out");
    require_pool_out(slots_out, count, fn, "slots_out");
    const std::lock_guard lock(pool->mutex);
    const auto r = pool->pool.prepare_stores(keys_of(*pool, keys, count, fn));
    std::copy(r.positions.begin(), r.positions.end(), positions_out);
    std::copy(r.slots.begin(), r.slots.end(), slots_out);
    if (evicted_out != nullptr) {
      for (size_t i = 0; i < r.evicted.size(); ++i)
        evicted_out[i] = kvo_block_key{r.evicted[i].hi(), r.evicted[i].lo()};
    }
    *out = kvo_pool_store{r.slots.size(),    r.evicted.size(),  r.skipped_present,
                          r.skipped_writing, r.skipped_no_room, r.skipped_cap};
  });
}

kvo_status kvo_pool_commit_stores(kvo_pool_t* pool, const uint32_t* slots, size_t count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    const std::lock_guard lock(pool->mutex);
    pool->pool.commit_stores(slots_of(slots, count, fn));
  });
}

kvo_status kvo_pool_abort_stores(kvo_pool_t* pool, const uint32_t* slots, size_t count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    const std::lock_guard lock(pool->mutex);
    pool->pool.abort_stores(slots_of(slots, count, fn));
  });
}

kvo_status kvo_pool_unpin(kvo_pool_t* pool, const uint32_t* slots, size_t count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    const std::lock_guard lock(pool->mutex);
    pool->pool.unpin(slots_of(slots, count, fn));
  });
}

kvo_status kvo_pool_chunk(kvo_pool_t* pool, uint32_t slot, uint32_t rank, void** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    KVO_ARG(out);
    *out = pool->pool.chunk(slot, rank);
  });
}

kvo_status kvo_pool_rank_range_get(kvo_pool_t* pool, uint32_t rank, kvo_pool_rank_range* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    KVO_ARG(out);
    const kvoffload::pool::RankRange r = pool->pool.rank_range(rank);
    *out = kvo_pool_rank_range{r.data, r.bytes, r.file_offset, r.slot_stride};
  });
}

kvo_status kvo_pool_reclaim_dead_tenants(kvo_pool_t* pool, uint32_t* out_reclaimed) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    const std::lock_guard lock(pool->mutex);
    const std::uint32_t n = pool->pool.reclaim_dead_tenants();
    if (out_reclaimed != nullptr) *out_reclaimed = n;
  });
}

kvo_status kvo_pool_check_invariants(kvo_pool_t* pool) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    const std::lock_guard lock(pool->mutex);
    const auto bad = pool->pool.check_invariants();
    if (bad.empty()) return;
    std::string msg = "node pool '" + pool->pool.path().string() +
                      "': " + std::to_string(bad.size()) + " invariant(s) violated:";
    for (const auto& b : bad) msg += " " + b + ";";
    throw kvoffload::Error(kvoffload::ErrorCode::kInternal, msg);
  });
}

kvo_status kvo_pool_stats_get(kvo_pool_t* pool, kvo_pool_stats* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(pool);
    KVO_ARG(out);
    const std::lock_guard lock(pool->mutex);
    const auto s = pool->pool.stats();
    kvo_pool_stats r{};
    r.slot_count = s.slot_count;
    r.free = s.free;
    r.writing = s.writing;
    r.ready = s.ready;
    r.pinned = s.pinned;
    r.repairs = s.repairs;
    r.tenants_reclaimed = s.tenants_reclaimed;
    r.tenants = static_cast<uint32_t>(s.tenants.size());
    r.policy = s.policy == kvoffload::PolicyKind::kArc ? KVO_POLICY_ARC : KVO_POLICY_LRU;
    r.arc_target = s.arc_target;
    r.recent = s.recent;
    r.frequent = s.frequent;
    r.ghost_recent = s.ghost_recent;
    r.ghost_frequent = s.ghost_frequent;
    for (const auto& t : s.tenants) {
      if (t.index != pool->pool.tenant_index()) continue;
      r.lookup_keys = t.lookup_keys;
      r.hits = t.hits;
      r.cross_engine_hits = t.cross_engine_hits;
      r.stores_prepared = t.stores_prepared;
      r.stores_committed = t.stores_committed;
      r.stores_aborted = t.stores_aborted;
      r.evictions = t.evictions;
      r.pins = t.pins;
      r.pinned_slots = t.pinned;
      r.occupancy = t.occupancy;
    }
    *out = r;
  });
}

}  // extern "C"
