// C API over TransferEngine: the engine handle, its options, jobs and stats (kvo_engine_*). The
// runtime half, whose handle an engine is made on, is capi_runtime.cpp.
#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "capi/capi_handles.hpp"
#include "capi/capi_internal.hpp"
#include "capi/capi_stats.hpp"

using kvoffload::Error;
using kvoffload::ErrorCode;
using kvoffload::capi::enum_value;
using kvoffload::capi::guarded;
using kvoffload::capi::invalid_arg;
using kvoffload::capi::runtime_of;

namespace {

kvo_engine& engine_of(kvo_engine_t* e, const char* function) {
  kvoffload::capi::require_arg(e, function, "engine");
  return *e;
}

// Error strings of the results handed out by the latest poll/wait on this thread (a deque, so
// c_str() pointers stay valid while it grows).
std::deque<std::string>& result_errors() {
  thread_local std::deque<std::string> errors;
  return errors;
}

kvo_job_result to_c(const kvoffload::JobResult& r) {
  const char* error = "";
  if (!r.error.empty()) error = result_errors().emplace_back(r.error).c_str();
  return kvo_job_result{static_cast<uint64_t>(r.job_id),
                        r.direction == kvoffload::Direction::kStore ? KVO_STORE : KVO_LOAD,
                        r.success ? 1 : 0,
                        r.bytes,
                        r.seconds,
                        error};
}

}  // namespace

namespace kvoffload::capi {

std::vector<kvoffload::KvGroup> groups_of(const kvo_kv_group* groups, size_t num_groups,
                                          const char* function) {
  if (num_groups == 0) invalid_arg(function, "num_groups", "is 0; a layout has at least one group");
  kvoffload::capi::require_arg(groups, function, "groups");
  std::vector<kvoffload::KvGroup> out(num_groups);
  for (size_t g = 0; g < num_groups; ++g) {
    if (groups[g].num_tensors != 0 && groups[g].tensors == nullptr) {
      invalid_arg(function, ("groups[" + std::to_string(g) + "].tensors").c_str(),
                  "is NULL with num_tensors " + std::to_string(groups[g].num_tensors));
    }
    for (size_t t = 0; t < groups[g].num_tensors; ++t) {
      const kvo_device_tensor& d = groups[g].tensors[t];
      out[g].tensors.push_back({d.base, d.num_blocks, d.page_bytes, d.block_stride});
    }
  }
  return out;
}

// job_timing lives in what was calibrate's tail padding (kvoffload.h): the struct's size, which
// callers built against the older header pass as struct_size, must not change.
static_assert(sizeof(void*) != 8 || sizeof(kvo_engine_options) == 56,
              "kvo_engine_options changed size: callers built against the older header break");

kvoffload::EngineOptions engine_options_of(const kvo_engine_options* o, const char* function) {
  kvoffload::EngineOptions opts;
  if (o == nullptr) return opts;
  if (o->struct_size != sizeof(kvo_engine_options)) {
    invalid_arg(function, "options",
                "has struct_size " + std::to_string(o->struct_size) + ", expected " +
                    std::to_string(sizeof(kvo_engine_options)) +
                    " (initialise it with kvo_engine_options_init)");
  }
  opts.register_host = o->register_host != 0;
  opts.allow_kernel = o->allow_kernel != 0;
  opts.store_policy = {o->store_kernel_below_bytes, o->store_kernel_min_count};
  opts.load_policy = {o->load_kernel_below_bytes, o->load_kernel_min_count};
  opts.calibrate = o->calibrate != 0;
  opts.job_timing = o->job_timing != 0;
  return opts;
}

}  // namespace kvoffload::capi

extern "C" {

// ---- engine ------------------------------------------------------------------------------------

kvo_status kvo_engine_options_init(kvo_engine_options* options) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    const kvoffload::EngineOptions d;
    *options = kvo_engine_options{sizeof(kvo_engine_options),
                                  d.register_host ? 1 : 0,
                                  d.allow_kernel ? 1 : 0,
                                  d.store_policy.kernel_below_bytes,
                                  d.store_policy.kernel_min_count,
                                  d.load_policy.kernel_below_bytes,
                                  d.load_policy.kernel_min_count,
                                  d.calibrate ? 1 : 0,
                                  d.job_timing ? 1 : 0};
  });
}

kvo_status kvo_engine_create_for_region(kvo_runtime_t* runtime, kvo_region_t* region, uint32_t rank,
                                        const kvo_kv_group* groups, size_t num_groups,
                                        uint32_t blocks_per_chunk,
                                        const kvo_engine_options* options, kvo_engine_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    KVO_ARG(region);
    KVO_ARG(out);
    auto g = kvoffload::capi::groups_of(groups, num_groups, fn);
    auto opts = kvoffload::capi::engine_options_of(options, fn);
    if (!region->region.is_open())
      throw Error(ErrorCode::kState, std::string(fn) + ": the region is closed");
    *out = std::make_unique<kvo_engine>(kvoffload::TransferEngine(*rt.runtime, region->region, rank,
                                                                  std::move(g), blocks_per_chunk,
                                                                  opts))
               .release();
  });
}

kvo_status kvo_engine_create(kvo_runtime_t* runtime, const kvo_host_slots* host,
                             const kvo_kv_group* groups, size_t num_groups,
                             uint32_t blocks_per_chunk, const kvo_engine_options* options,
                             kvo_engine_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    KVO_ARG(host);
    KVO_ARG(out);
    if (host->base == nullptr) invalid_arg(fn, "host->base", "is NULL");
    kvoffload::KvLayout layout;
    layout.groups = kvoffload::capi::groups_of(groups, num_groups, fn);
    layout.blocks_per_chunk = blocks_per_chunk;
    layout.host = kvoffload::HostSlots{static_cast<std::byte*>(host->base),
                                       host->buffer_bytes,
                                       host->num_chunks,
                                       host->row_stride,
                                       host->slot_offset,
                                       host->slot_bytes};
    auto opts = kvoffload::capi::engine_options_of(options, fn);
    *out = std::make_unique<kvo_engine>(
               kvoffload::TransferEngine(*rt.runtime, std::move(layout), opts))
               .release();
  });
}

void kvo_engine_destroy(kvo_engine_t* engine) {
  if (engine == nullptr || engine->borrowed) return;  // a worker's engine: kvo_worker_close
  engine->engine.shutdown();  // noexcept; the destructor would do it too, this states the order
  delete engine;
}

kvo_status kvo_engine_shutdown(kvo_engine_t* engine) {
  const char* const fn = __func__;
  return guarded(fn, [&] { engine_of(engine, fn).engine.shutdown(); });
}

kvo_status kvo_engine_submit(kvo_engine_t* engine, uint64_t job_id, kvo_direction direction,
                             const kvo_transfer_spec* spec, kvo_wait_on wait_on) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& e = engine_of(engine, fn);
    KVO_ARG(spec);
    if (enum_value(direction) != KVO_STORE && enum_value(direction) != KVO_LOAD) {
      invalid_arg(fn, "direction",
                  "is " + std::to_string(enum_value(direction)) + "; use KVO_STORE or KVO_LOAD");
    }
    if (spec->num_chunks != 0 && spec->chunks == nullptr) {
      invalid_arg(fn, "spec->chunks",
                  "is NULL with num_chunks " + std::to_string(spec->num_chunks));
    }
    if (spec->num_groups != 0 && spec->groups == nullptr) {
      invalid_arg(fn, "spec->groups",
                  "is NULL with num_groups " + std::to_string(spec->num_groups));
    }
    // Small per-call vector of spans (one per KV group, usually 1-2): the blocks are not copied.
    std::vector<std::span<const std::uint64_t>> groups(spec->num_groups);
    for (size_t g = 0; g < spec->num_groups; ++g) {
      const kvo_block_list& l = spec->groups[g];
      if (l.count != 0 && l.blocks == nullptr) {
        invalid_arg(fn, ("spec->groups[" + std::to_string(g) + "].blocks").c_str(),
                    "is NULL with count " + std::to_string(l.count));
      }
      groups[g] = {l.blocks, l.count};
    }
    kvoffload::TransferSpec s;
    s.chunks = {spec->chunks, spec->num_chunks};
    s.skip = spec->skip;
    s.group_blocks = groups;
    kvoffload::WaitOn w;
    switch (enum_value(wait_on.kind)) {
      case KVO_WAIT_NOTHING:
        break;
      case KVO_WAIT_STREAM:
        w = kvoffload::WaitOn::stream(kvoffload::StreamView::from_native(wait_on.handle));
        break;
      case KVO_WAIT_EVENT:
        if (wait_on.handle == 0) invalid_arg(fn, "wait_on.handle", "is 0 with KVO_WAIT_EVENT");
        w = kvoffload::WaitOn::event(kvoffload::EventView::from_native(wait_on.handle));
        break;
      default:
        invalid_arg(fn, "wait_on.kind", "is " + std::to_string(enum_value(wait_on.kind)));
    }
    e.engine.submit(
        kvoffload::JobId{job_id},
        direction == KVO_STORE ? kvoffload::Direction::kStore : kvoffload::Direction::kLoad, s, w);
  });
}

kvo_status kvo_engine_poll(kvo_engine_t* engine, kvo_job_result* out, size_t capacity,
                           size_t* out_count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& e = engine_of(engine, fn);
    KVO_ARG(out_count);
    if (capacity != 0) KVO_ARG(out);
    result_errors().clear();
    std::lock_guard lock(e.mutex);
    for (auto& r : e.engine.poll()) e.undelivered.push_back(std::move(r));
    const size_t n = std::min(capacity, e.undelivered.size());
    for (size_t i = 0; i < n; ++i) {
      out[i] = to_c(e.undelivered.front());
      e.undelivered.pop_front();
    }
    *out_count = n;
  });
}

kvo_status kvo_engine_wait(kvo_engine_t* engine, const uint64_t* job_ids, size_t count,
                           kvo_job_result* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& e = engine_of(engine, fn);
    if (count == 0) return;
    KVO_ARG(job_ids);
    KVO_ARG(out);
    result_errors().clear();
    // Results already collected by a poll that had no room for them are answered from there;
    // the engine only knows about the rest.
    std::vector<kvoffload::JobResult> found(count);
    std::vector<bool> have(count, false);
    std::vector<kvoffload::JobId> rest;
    {
      std::lock_guard lock(e.mutex);
      for (size_t i = 0; i < count; ++i) {
        auto it = std::find_if(e.undelivered.begin(), e.undelivered.end(),
                               [&](const kvoffload::JobResult& r) {
                                 return static_cast<uint64_t>(r.job_id) == job_ids[i];
                               });
        if (it != e.undelivered.end()) {
          found[i] = std::move(*it);
          have[i] = true;
          e.undelivered.erase(it);
        } else {
          rest.push_back(kvoffload::JobId{job_ids[i]});
        }
      }
    }
    std::vector<kvoffload::JobResult> waited;
    try {
      waited = e.engine.wait(rest);
    } catch (...) {
      // Put back what we took so a failed wait (unknown id) loses no result.
      std::lock_guard lock(e.mutex);
      for (size_t i = 0; i < count; ++i) {
        if (have[i]) e.undelivered.push_back(std::move(found[i]));
      }
      throw;
    }
    for (size_t i = 0, w = 0; i < count; ++i) out[i] = to_c(have[i] ? found[i] : waited[w++]);
  });
}

kvo_status kvo_engine_wait_all(kvo_engine_t* engine, kvo_job_result* out, size_t capacity,
                               size_t* out_count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& e = engine_of(engine, fn);
    KVO_ARG(out_count);
    if (capacity != 0) KVO_ARG(out);
    result_errors().clear();
    auto results = e.engine.wait_all();
    std::lock_guard lock(e.mutex);
    for (auto& r : results) e.undelivered.push_back(std::move(r));
    const size_t n = std::min(capacity, e.undelivered.size());
    for (size_t i = 0; i < n; ++i) {
      out[i] = to_c(e.undelivered.front());
      e.undelivered.pop_front();
    }
    *out_count = n;
  });
}

kvo_status kvo_engine_stats_get(const kvo_engine_t* engine, kvo_engine_stats* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(engine);
    KVO_ARG(out);
    const kvoffload::EngineStats s = engine->engine.stats();
    *out = kvoffload::capi::to_c(s);
  });
}

}  // extern "C"
