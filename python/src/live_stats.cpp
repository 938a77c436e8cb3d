// kvoffload.snapshot_engines: the live statistics pages of a shm dir's regions, as `kvoffload
// region list`, `kvoffload top` and the exporter read them (core/include/kvoffload/live_stats.hpp):
// no lock, no role, so reading never disturbs the engines. Each entry is a dict (the page's
// fields by their C++ names), so a test or a script reads what an operator's tools show.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>  // the std::optional argument
#include <pybind11/stl/filesystem.h>

#include <kvoffload/live_stats.hpp>
#include <kvoffload/region.hpp>

#include "bindings.hpp"

namespace py = pybind11;

namespace kvoffload::python {
namespace {

py::dict scheduler_dict(const LiveScheduler& s) {
  py::dict d;
  d["attached"] = s.attached;
  d["detached"] = s.detached;
  d["pid"] = s.pid;
  d["attached_unix_seconds"] = s.attached_unix_seconds;
  d["num_chunks"] = s.num_chunks;
  d["ready_chunks"] = s.ready_chunks;
  d["used"] = s.used;
  d["write_pending"] = s.write_pending;
  d["pinned"] = s.pinned;
  d["lookup_keys"] = s.lookup_keys;
  d["hits"] = s.hits;
  d["hits_pending"] = s.hits_pending;
  d["misses"] = s.misses;
  d["stores_prepared"] = s.stores_prepared;
  d["stores_completed"] = s.stores_completed;
  d["stores_failed"] = s.stores_failed;
  d["stores_skipped_threshold"] = s.stores_skipped_threshold;
  d["allocation_failures"] = s.allocation_failures;
  d["evictions"] = s.evictions;
  d["loads_prepared"] = s.loads_prepared;
  d["loads_completed"] = s.loads_completed;
  return d;
}

py::dict direction_dict(const LiveDirection& x) {
  py::dict d;
  d["jobs_submitted"] = x.jobs_submitted;
  d["jobs_succeeded"] = x.jobs_succeeded;
  d["jobs_failed"] = x.jobs_failed;
  d["bytes"] = x.bytes;
  d["copy_seconds"] = x.copy_seconds;
  return d;
}

py::dict live_dict(const LiveStats& live) {
  py::dict d;
  d["version"] = live.version;
  d["consistent"] = live.consistent;
  d["scheduler"] = scheduler_dict(live.scheduler);
  py::list tiers;
  for (const LiveTier& t : live.tiers) {
    py::dict e;
    e["name"] = t.name;
    e["lookups"] = t.lookups;
    e["present"] = t.present;
    e["pending"] = t.pending;
    e["promoted"] = t.promoted;
    e["promote_failed"] = t.promote_failed;
    e["offloaded"] = t.offloaded;
    e["offload_failed"] = t.offload_failed;
    tiers.append(e);
  }
  d["tiers"] = tiers;
  py::list ranks;
  for (const LiveRank& r : live.ranks) {
    py::dict e;
    e["rank"] = r.rank;
    e["engine_attached"] = r.engine_attached;
    e["engine_detached"] = r.engine_detached;
    e["pid"] = r.pid;
    e["host_registered"] = r.host_registered;
    e["store"] = direction_dict(r.store);
    e["load"] = direction_dict(r.load);
    e["ready_chunks"] = r.bringup.ready_chunks;
    ranks.append(e);
  }
  d["ranks"] = ranks;
  return d;
}

}  // namespace

void bind_live_stats(py::module_& m) {
  m.def(
      "snapshot_engines",
      [](const std::optional<std::filesystem::path>& shm_dir) {
        std::vector<EngineSnapshot> snapshots;
        {
          py::gil_scoped_release release;
          snapshots = snapshot_engines(shm_dir ? *shm_dir : default_shm_dir());
        }
        py::list out;
        for (const EngineSnapshot& e : snapshots) {
          py::dict d;
          d["engine_id"] = e.region.engine_id;
          d["path"] = e.region.path;
          d["problem"] = e.region.problem;
          d["live"] = e.live ? py::object(live_dict(*e.live)) : py::object(py::none());
          d["live_problem"] = e.live_problem;
          out.append(d);
        }
        return out;
      },
      py::arg("shm_dir") = py::none(),
      "The regions of shm_dir (default: $KVOFFLOAD_SHM_DIR, else /dev/shm) with their live "
      "statistics pages, as `kvoffload region list` / `top` read them (no lock): a list of dicts "
      "{engine_id, path, problem, live: {version, consistent, scheduler: {...}, tiers: [...], "
      "ranks: [...]} or None, live_problem}");
}

}  // namespace kvoffload::python
