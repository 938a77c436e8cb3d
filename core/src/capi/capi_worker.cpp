// C API over kvoffload::OffloadWorker (kvo_worker_*): one rank, progressive bring-up included.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <kvoffload/offload_stack.hpp>
#include <kvoffload/region.hpp>

#include "capi/capi_handles.hpp"
#include "capi/capi_internal.hpp"

using kvoffload::Error;
using kvoffload::ErrorCode;
using kvoffload::capi::enum_value;
using kvoffload::capi::guarded;
using kvoffload::capi::invalid_arg;

// The worker and the borrowed handle of its engine (kvo_worker_engine), made once.
struct kvo_worker {
  std::unique_ptr<kvoffload::OffloadWorker> worker;
  std::unique_ptr<kvo_engine> engine;
};

namespace {

const kvo_worker& worker_of(const kvo_worker_t* w, const char* function) {
  kvoffload::capi::require_arg(w, function, "worker");
  return *w;
}

kvoffload::WorkerConfig config_of(const kvo_worker_options* o, const char* fn) {
  if (o->struct_size != sizeof(kvo_worker_options)) {
    invalid_arg(fn, "options",
                "has struct_size " + std::to_string(o->struct_size) + ", expected " +
                    std::to_string(sizeof(kvo_worker_options)) +
                    " (initialise it with kvo_worker_options_init)");
  }
  if (o->region.struct_size != sizeof(kvo_region_options)) {
    invalid_arg(fn, "options->region",
                "has struct_size " + std::to_string(o->region.struct_size) + ", expected " +
                    std::to_string(sizeof(kvo_region_options)) +
                    " (kvo_worker_options_init initialises it)");
  }
  if (o->region.rank < 0) {
    invalid_arg(
        fn, "options->region.rank",
        "is " + std::to_string(o->region.rank) + "; a worker is one rank: use 0..world_size-1");
  }
  kvoffload::WorkerConfig c;
  c.region = kvoffload::capi::region_options_of(&o->region, fn);
  const auto mode = enum_value(o->bringup);
  if (mode != KVO_BRINGUP_BLOCKING && mode != KVO_BRINGUP_BACKGROUND) {
    invalid_arg(fn, "options->bringup",
                "is " + std::to_string(mode) +
                    "; use KVO_BRINGUP_BLOCKING (0) or KVO_BRINGUP_BACKGROUND (1)");
  }
  c.region.bringup = mode == KVO_BRINGUP_BACKGROUND ? kvoffload::BringupMode::kBackground
                                                    : kvoffload::BringupMode::kBlocking;
  if (o->bringup_piece_bytes == 0) invalid_arg(fn, "options->bringup_piece_bytes", "is 0; use > 0");
  if (o->bringup_first_piece_bytes == 0)
    invalid_arg(fn, "options->bringup_first_piece_bytes", "is 0; use > 0");
  c.region.bringup_piece_bytes = o->bringup_piece_bytes;
  c.region.bringup_first_piece_bytes = o->bringup_first_piece_bytes;
  c.backend = o->backend == nullptr ? "auto" : o->backend;
  if (o->device < -1) {
    invalid_arg(fn, "options->device",
                "is " + std::to_string(o->device) +
                    "; use a device ordinal >= 0 or -1 (rank mod the device count)");
  }
  if (o->device >= 0) c.devices = {o->device};
  if (o->num_groups != 0) {
    c.groups = kvoffload::capi::groups_of(o->groups, o->num_groups, fn);
  }
  if (o->cache_tensors != 0 || o->cache_num_blocks != 0 || o->cache_block_bytes != 0) {
    c.caches = kvoffload::DeviceCaches{.tensors = o->cache_tensors,
                                       .num_blocks = o->cache_num_blocks,
                                       .block_bytes = o->cache_block_bytes};
  }
  c.blocks_per_chunk = o->blocks_per_chunk;
  c.engine = kvoffload::capi::engine_options_of(o->engine, fn);
  return c;
}

}  // namespace

extern "C" {

kvo_status kvo_worker_options_init(kvo_worker_options* options) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    *options = kvo_worker_options{};
    options->struct_size = sizeof(kvo_worker_options);
    const kvo_status s = kvo_region_options_init(&options->region);
    if (s != KVO_OK) throw Error(ErrorCode::kInternal, "kvo_region_options_init failed");
    options->backend = "auto";
    options->device = -1;
    options->bringup = KVO_BRINGUP_BLOCKING;
    options->bringup_piece_bytes = kvoffload::kDefaultBringupPieceBytes;
    options->bringup_first_piece_bytes = kvoffload::kDefaultBringupFirstPieceBytes;
  });
}

kvo_status kvo_worker_create(const kvo_worker_options* options, kvo_worker_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    KVO_ARG(out);
    const kvoffload::WorkerConfig config = config_of(options, fn);
    auto handle = std::make_unique<kvo_worker>();  // first: a failed allocation strands nothing
    handle->worker = kvoffload::OffloadWorker::build(config);
    handle->engine = std::make_unique<kvo_engine>(&handle->worker->engine());
    *out = handle.release();
  });
}

kvo_status kvo_worker_engine(kvo_worker_t* worker, kvo_engine_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(out);
    *out = worker_of(worker, fn).engine.get();
  });
}

kvo_status kvo_worker_device(const kvo_worker_t* worker, int* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(out);
    *out = worker_of(worker, fn).worker->device();
  });
}

kvo_status kvo_worker_geometry_get(const kvo_worker_t* worker, kvo_region_geometry* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(out);
    const kvoffload::RegionGeometry& g = worker_of(worker, fn).worker->region().geometry();
    *out = kvo_region_geometry{
        g.num_chunks(), g.slot_bytes(), g.world_size(), g.copies(),     g.replicated() ? 1 : 0,
        g.row_stride(), g.data_bytes(), g.page_size(),  g.slot_align(), g.slot_stride()};
  });
}

kvo_status kvo_worker_slot(const kvo_worker_t* worker, uint64_t chunk, void** out_ptr,
                           uint64_t* out_bytes) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(out_ptr);
    KVO_ARG(out_bytes);
    const std::span<std::byte> s = worker_of(worker, fn).worker->region().slot(chunk);
    *out_ptr = s.data();
    *out_bytes = s.size();
  });
}

kvo_status kvo_worker_cache_block(const kvo_worker_t* worker, uint32_t tensor, uint64_t block,
                                  uint64_t* out_ptr) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(out_ptr);
    const kvoffload::OffloadWorker& w = *worker_of(worker, fn).worker;
    if (w.caches().empty()) {
      throw Error(
          ErrorCode::kState,
          std::string(fn) + ": the worker allocated no caches (the engine gave its groups)");
    }
    if (tensor >= w.caches().size()) {
      invalid_arg(fn, "tensor",
                  "is " + std::to_string(tensor) + "; the caches have " +
                      std::to_string(w.caches().size()) + " tensor(s)");
    }
    const kvoffload::DeviceTensor& t = w.groups()[0].tensors[tensor];
    if (block >= t.num_blocks) {
      invalid_arg(fn, "block",
                  "is " + std::to_string(block) + "; a tensor has " + std::to_string(t.num_blocks) +
                      " block(s)");
    }
    *out_ptr = t.base + block * t.block_stride;
  });
}

kvo_status kvo_worker_bringup_get(const kvo_worker_t* worker, kvo_worker_bringup* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(out);
    kvoffload::OffloadWorker& w = *worker_of(worker, fn).worker;
    kvoffload::Region& region = w.region();
    const kvoffload::BringupStatus b = region.bringup_status();
    const kvoffload::WorkerRegistration r = w.registration();
    kvo_worker_bringup o{};
    o.state = static_cast<kvo_bringup_state>(b.state);
    o.ready_chunks = b.ready_chunks;
    o.num_chunks = b.num_chunks;
    o.ready_bytes = b.ready_chunks * region.geometry().row_stride();
    o.pieces = r.pieces;
    o.registered_bytes = r.bytes;
    o.seconds = b.seconds;
    o.register_seconds = r.seconds;
    o.longest_piece_seconds = r.longest_piece_seconds;
    o.error_status = b.error ? static_cast<int>(b.error->code()) : KVO_OK;
    *out = o;
  });
}

kvo_status kvo_worker_wait_bringup(const kvo_worker_t* worker) {
  const char* const fn = __func__;
  return guarded(fn, [&] { worker_of(worker, fn).worker->region().wait_bringup(); });
}

kvo_status kvo_worker_close(kvo_worker_t* worker) {
  if (worker == nullptr) return KVO_OK;
  const std::unique_ptr<kvo_worker> owned(worker);
  const bool ok = owned->worker->close();  // noexcept: engine drains, pieces, region, runtime
  owned->engine.reset();
  if (!ok) {
    return kvoffload::capi::set_last_error(
        KVO_SYSTEM, "kvo_worker_close: a teardown step failed (logged); the worker is freed");
  }
  return KVO_OK;
}

}  // extern "C"
