// C API over kvoffload::Region.
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <kvoffload/region.hpp>

#include "capi/capi_handles.hpp"
#include "capi/capi_internal.hpp"

using kvoffload::Error;
using kvoffload::ErrorCode;
using kvoffload::capi::guarded;
using kvoffload::capi::invalid_arg;

namespace {

const kvoffload::Region& open_region(const kvo_region_t* region, const char* function) {
  kvoffload::capi::require_arg(region, function, "region");
  if (!region->region.is_open()) {
    throw Error(ErrorCode::kState, std::string(function) + ": the region is closed");
  }
  return region->region;
}

}  // namespace

namespace kvoffload::capi {

RegionOptions region_options_of(const kvo_region_options* options, const char* fn) {
  KVO_ARG(options);
  if (options->struct_size != sizeof(kvo_region_options)) {
    invalid_arg(fn, "options",
                "has struct_size " + std::to_string(options->struct_size) + ", expected " +
                    std::to_string(sizeof(kvo_region_options)) +
                    " (initialise it with kvo_region_options_init)");
  }
  if (options->engine_id == nullptr) invalid_arg(fn, "options->engine_id", "is NULL");
  if (options->rank < KVO_UNRANKED) {
    invalid_arg(fn, "options->rank",
                "is " + std::to_string(options->rank) + "; use 0..world_size-1 or KVO_UNRANKED");
  }
  kvoffload::RegionOptions opts;
  opts.engine_id = options->engine_id;
  opts.layout.num_chunks = options->num_chunks;
  opts.layout.slot_bytes = options->slot_bytes;
  opts.layout.world_size = options->world_size;
  opts.layout.replicated = options->replicated != 0;
  opts.layout.slot_align = options->slot_align;
  if (options->rank != KVO_UNRANKED) opts.rank = static_cast<std::uint32_t>(options->rank);
  if (options->shm_dir != nullptr) opts.shm_dir = options->shm_dir;
  opts.join_timeout = std::chrono::milliseconds(options->join_timeout_ms);
  opts.populate_threads = options->populate_threads;
  opts.populate = options->populate != 0;
  return opts;
}

}  // namespace kvoffload::capi

extern "C" {

kvo_status kvo_region_options_init(kvo_region_options* options) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    *options = kvo_region_options{};
    options->struct_size = sizeof(kvo_region_options);
    options->world_size = 1;
    options->rank = KVO_UNRANKED;
    options->join_timeout_ms = 30'000;
    options->populate_threads = 1;
    options->populate = 1;
    options->slot_align = kvoffload::kDefaultSlotAlign;
  });
}

kvo_status kvo_region_create_or_join(const kvo_region_options* options, kvo_region_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    KVO_ARG(out);
    const kvoffload::RegionOptions opts = kvoffload::capi::region_options_of(options, fn);
    // Build the handle first so that a failed allocation cannot strand an attached region.
    auto handle = std::make_unique<kvo_region>(kvoffload::Region::create_or_join(opts));
    *out = handle.release();
  });
}

kvo_status kvo_region_geometry_get(const kvo_region_t* region, kvo_region_geometry* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out);
    const auto& g = r.geometry();
    *out = kvo_region_geometry{
        g.num_chunks(), g.slot_bytes(), g.world_size(), g.copies(),     g.replicated() ? 1 : 0,
        g.row_stride(), g.data_bytes(), g.page_size(),  g.slot_align(), g.slot_stride()};
  });
}

kvo_status kvo_region_role_get(const kvo_region_t* region, kvo_region_role* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out);
    *out = r.role() == kvoffload::RegionRole::kCreator ? KVO_ROLE_CREATOR : KVO_ROLE_JOINER;
  });
}

kvo_status kvo_region_path(const kvo_region_t* region, const char** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    open_region(region, fn);
    KVO_ARG(out);
    *out = region->path.c_str();
  });
}

kvo_status kvo_region_engine_id(const kvo_region_t* region, const char** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out);
    *out = r.engine_id().c_str();
  });
}

kvo_status kvo_region_rank(const kvo_region_t* region, int32_t* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out);
    *out = r.rank() ? static_cast<int32_t>(*r.rank()) : KVO_UNRANKED;
  });
}

kvo_status kvo_region_populate_report_get(const kvo_region_t* region, kvo_populate_report* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out);
    const auto& p = r.populate_report();
    kvo_populate_method method = KVO_POPULATE_NONE;
    if (p.method == kvoffload::PopulateMethod::kMadvise) method = KVO_POPULATE_MADVISE;
    if (p.method == kvoffload::PopulateMethod::kFallback) method = KVO_POPULATE_FALLBACK;
    *out = kvo_populate_report{method, p.bytes, p.seconds};
  });
}

kvo_status kvo_region_data(const kvo_region_t* region, void** out_data, uint64_t* out_bytes) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out_data);
    KVO_ARG(out_bytes);
    *out_data = r.data();
    *out_bytes = r.geometry().data_bytes();
  });
}

kvo_status kvo_region_slot(const kvo_region_t* region, uint64_t chunk, int32_t rank, void** out_ptr,
                           uint64_t* out_bytes) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out_ptr);
    KVO_ARG(out_bytes);
    if (rank < KVO_OWN_RANK) {
      invalid_arg(fn, "rank",
                  "is " + std::to_string(rank) + "; use 0..world_size-1 or KVO_OWN_RANK");
    }
    auto span = rank == KVO_OWN_RANK ? r.slot(chunk) : r.slot(chunk, static_cast<uint32_t>(rank));
    *out_ptr = span.data();
    *out_bytes = span.size();
  });
}

kvo_status kvo_region_row(const kvo_region_t* region, uint64_t chunk, void** out_ptr,
                          uint64_t* out_bytes) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    const auto& r = open_region(region, fn);
    KVO_ARG(out_ptr);
    KVO_ARG(out_bytes);
    auto span = r.row(chunk);
    *out_ptr = span.data();
    *out_bytes = span.size();
  });
}

kvo_status kvo_region_close(kvo_region_t* region) {
  if (region == nullptr) return KVO_OK;
  // close() never throws; the handle is freed whatever it reports, so the caller never leaks.
  const bool clean = region->region.close();
  delete region;
  if (!clean) {
    return kvoffload::capi::set_last_error(
        KVO_SYSTEM,
        "kvo_region_close: a teardown step failed (the log names it); the region "
        "is detached and the handle freed");
  }
  return KVO_OK;
}

kvo_status kvo_region_clean(const char* shm_dir, const char* engine_id, uint32_t* out_removed) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    std::filesystem::path dir = shm_dir != nullptr && *shm_dir != '\0'
                                    ? std::filesystem::path(shm_dir)
                                    : kvoffload::default_shm_dir();
    std::optional<std::string> id;
    if (engine_id != nullptr) id = engine_id;
    auto result = kvoffload::clean_regions(dir, id);
    if (out_removed != nullptr) *out_removed = static_cast<uint32_t>(result.removed.size());
  });
}

}  // extern "C"
