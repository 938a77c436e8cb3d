#pragma once
// The stats() dicts of the bindings: one key per field of stats_fields.h, in its order, with the
// C++ value (ints, floats; FLAG fields as bool), so Python sees every listed field.

#include <pybind11/pybind11.h>

#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/manager.hpp>
#include <kvoffload/remote_tier.hpp>
#include <kvoffload/stats_fields.h>
#include <kvoffload/tier.hpp>
#include <kvoffload/transfer_engine.hpp>

namespace kvoffload::python {

#define KVOFFLOAD_PY_STATS_ITEM_(kind, name) d[#name] = s.name;

inline pybind11::dict stats_dict(const EngineStats& s) {
  pybind11::dict d;
  KVOFFLOAD_ENGINE_STATS_FIELDS(KVOFFLOAD_PY_STATS_ITEM_)
  return d;
}

inline pybind11::dict stats_dict(const PolicyCounters& s) {
  pybind11::dict d;
  KVOFFLOAD_POLICY_COUNTERS_FIELDS(KVOFFLOAD_PY_STATS_ITEM_)
  return d;
}

// The manager's fields, then its policy counters as a nested dict under "policy".
inline pybind11::dict stats_dict(const ManagerStats& s) {
  pybind11::dict d;
  KVOFFLOAD_MANAGER_STATS_FIELDS(KVOFFLOAD_PY_STATS_ITEM_)
  d["policy"] = stats_dict(s.policy);
  return d;
}

inline pybind11::dict stats_dict(const TierStats& s) {
  pybind11::dict d;
  KVOFFLOAD_TIER_STATS_FIELDS(KVOFFLOAD_PY_STATS_ITEM_)
  return d;
}

inline pybind11::dict stats_dict(const RemoteStats& s) {
  pybind11::dict d;
  KVOFFLOAD_REMOTE_STATS_FIELDS(KVOFFLOAD_PY_STATS_ITEM_)
  return d;
}

#undef KVOFFLOAD_PY_STATS_ITEM_

}  // namespace kvoffload::python
