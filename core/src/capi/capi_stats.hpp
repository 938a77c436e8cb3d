#pragma once
// The C API's copies of the statistics structs: field by field through stats_fields.h, the list
// kvo_engine_stats and kvo_manager_stats are generated from, so C sees every listed field.

#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/kvoffload.h>
#include <kvoffload/manager.hpp>
#include <kvoffload/stats_fields.h>
#include <kvoffload/transfer_engine.hpp>

namespace kvoffload::capi {

#define KVOFFLOAD_CAPI_COPY_(kind, name) \
  out.name = static_cast<KVOFFLOAD_STATS_C_TYPE_##kind>(s.name);
#define KVOFFLOAD_CAPI_COPY_POLICY_(kind, name) \
  out.policy_##name = static_cast<KVOFFLOAD_STATS_C_TYPE_##kind>(s.policy.name);

[[nodiscard]] inline kvo_engine_stats to_c(const EngineStats& s) noexcept {
  kvo_engine_stats out{};
  KVOFFLOAD_ENGINE_STATS_FIELDS(KVOFFLOAD_CAPI_COPY_)
  return out;
}

[[nodiscard]] inline kvo_manager_stats to_c(const ManagerStats& s) noexcept {
  kvo_manager_stats out{};
  KVOFFLOAD_MANAGER_STATS_FIELDS(KVOFFLOAD_CAPI_COPY_)
  KVOFFLOAD_POLICY_COUNTERS_FIELDS(KVOFFLOAD_CAPI_COPY_POLICY_)
  return out;
}

#undef KVOFFLOAD_CAPI_COPY_
#undef KVOFFLOAD_CAPI_COPY_POLICY_

}  // namespace kvoffload::capi
