#include "monitor/live_json.hpp"

#include <cstdio>

namespace kvoffload::cli {
namespace {

nlohmann::json direction_json(const LiveDirection& d) {
  return {{"jobs_submitted", d.jobs_submitted},
          {"jobs_succeeded", d.jobs_succeeded},
          {"jobs_failed", d.jobs_failed},
          {"jobs_in_flight", d.jobs_in_flight()},
          {"bytes", d.bytes},
          {"copy_seconds", d.copy_seconds},
          {"copy_gbps", d.copy_gbps()}};
}

}  // namespace

std::string percent(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return "-";
  char buf[32];
  (void)std::snprintf(buf, sizeof buf, "%.1f %%",
                      100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

nlohmann::json live_json(const LiveStats& live) {
  const LiveScheduler& s = live.scheduler;
  nlohmann::json scheduler{{"attached", s.attached},
                           {"detached", s.detached},
                           {"pid", s.pid},
                           {"attached_unix_seconds", s.attached_unix_seconds},
                           {"chunks", s.num_chunks},
                           {"ready_chunks", s.ready_chunks},
                           {"used", s.used},
                           {"write_pending", s.write_pending},
                           {"pinned", s.pinned},
                           {"lookup_keys", s.lookup_keys},
                           {"hits", s.hits},
                           {"hits_pending", s.hits_pending},
                           {"misses", s.misses},
                           {"stores_prepared", s.stores_prepared},
                           {"stores_completed", s.stores_completed},
                           {"stores_failed", s.stores_failed},
                           {"stores_skipped_threshold", s.stores_skipped_threshold},
                           {"cannot_store", s.allocation_failures},
                           {"evictions", s.evictions},
                           {"loads_prepared", s.loads_prepared},
                           {"loads_completed", s.loads_completed}};
  nlohmann::json tiers = nlohmann::json::array();
  for (const LiveTier& t : live.tiers) {
    tiers.push_back({{"name", t.name},
                     {"lookups", t.lookups},
                     {"hits", t.present},
                     {"pending", t.pending},
                     {"misses", t.misses()},
                     {"promoted", t.promoted},
                     {"promote_failed", t.promote_failed},
                     {"offloaded", t.offloaded},
                     {"offload_failed", t.offload_failed}});
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const LiveRank& r : live.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"attached", r.engine_attached},
                     {"detached", r.engine_detached},
                     {"pid", r.pid},
                     {"attached_unix_seconds", r.attached_unix_seconds},
                     {"host_registered", r.host_registered},
                     {"bringup",
                      {{"state", std::string(to_string(r.bringup.state))},
                       {"ready_chunks", r.bringup.ready_chunks},
                       {"errno", r.bringup.sys_errno},
                       {"populated_bytes", r.bringup_populated_bytes},
                       {"pieces", r.bringup_pieces},
                       {"seconds", r.bringup_seconds}}},
                     {"store", direction_json(r.store)},
                     {"load", direction_json(r.load)}});
  }
  return {{"version", live.version},
          {"consistent", live.consistent},
          {"scheduler", std::move(scheduler)},
          {"tiers", std::move(tiers)},
          {"ranks", std::move(ranks)}};
}

nlohmann::json engine_json(const EngineSnapshot& engine) {
  const RegionInfo& r = engine.region;
  nlohmann::json item{
      {"path", r.path.string()}, {"engine_id", r.engine_id}, {"bytes", r.file_bytes},
      {"attached", r.attached},  {"stale", r.stale},         {"complete", r.complete},
  };
  if (r.geometry) {
    item["chunks"] = r.geometry->num_chunks();
    item["slot_bytes"] = r.geometry->slot_bytes();
    item["world_size"] = r.geometry->world_size();
    item["replicated"] = r.geometry->replicated();
    item["row_stride"] = r.geometry->row_stride();
    item["data_bytes"] = r.geometry->data_bytes();
  }
  if (!r.problem.empty()) item["problem"] = r.problem;
  if (engine.live) {
    item["live"] = live_json(*engine.live);
  } else if (r.problem.empty()) {
    item["live_problem"] = engine.live_problem;
  }
  return item;
}

std::string occupancy_text(const LiveStats& live) {
  std::string out;
  const LiveScheduler& s = live.scheduler;
  if (s.attached) {
    if (s.detached) out += "scheduler exited; last seen: ";
    out += "used " + std::to_string(s.used) + " of " + std::to_string(s.num_chunks) + " chunks (" +
           percent(s.used, s.num_chunks) + "), " + std::to_string(s.write_pending) +
           " write-pending, " + std::to_string(s.pinned) + " pinned, " +
           std::to_string(s.ready_chunks) + " ready; hits " + std::to_string(s.hits) + ", misses " +
           std::to_string(s.misses) + " (" + percent(s.hits, s.hits + s.misses) + " hit); " +
           std::to_string(s.evictions) + " evictions";
  } else {
    out += "no scheduler attached";
  }
  std::size_t ready = 0;
  std::uint64_t failed = 0;
  for (const LiveRank& r : live.ranks) {
    if (r.bringup.state == BringupState::kReady) ++ready;
    failed += r.store.jobs_failed + r.load.jobs_failed;
  }
  out += "; bring-up " + std::to_string(ready) + " of " + std::to_string(live.ranks.size()) +
         " ranks ready";
  if (failed != 0) out += "; " + std::to_string(failed) + " failed jobs";
  return out;
}

nlohmann::json pool_json(const pool::PoolObservation& p) {
  nlohmann::json j{{"path", p.path.string()}, {"name", p.name}};
  if (!p.problem.empty()) {
    j["problem"] = p.problem;
    return j;
  }
  const pool::PoolStats& s = p.stats;
  j["stale"] = p.stale;
  j["slot_count"] = s.slot_count;
  j["free"] = s.free;
  j["writing"] = s.writing;
  j["ready"] = s.ready;
  j["pinned"] = s.pinned;
  j["repairs"] = s.repairs;
  j["tenants_reclaimed"] = s.tenants_reclaimed;
  j["geometry"] = {{"slot_bytes", p.geometry.slot_bytes},
                   {"world_size", p.geometry.world_size},
                   {"layout", p.geometry.layout},
                   {"dtype", p.geometry.dtype},
                   {"fingerprint", p.geometry.fingerprint}};
  nlohmann::json tenants = nlohmann::json::array();
  for (const pool::TenantStats& t : s.tenants) {
    tenants.push_back({{"engine_id", t.engine_id},
                       {"pid", t.pid},
                       {"alive", t.alive},
                       {"occupancy", t.occupancy},
                       {"pinned", t.pinned},
                       {"pins", t.pins},
                       {"hits", t.hits},
                       {"cross_engine_hits", t.cross_engine_hits},
                       {"lookup_keys", t.lookup_keys},
                       {"evictions", t.evictions},
                       {"cap_slots", t.cap_slots}});
  }
  j["tenants"] = tenants;
  return j;
}

std::string pool_text(const pool::PoolObservation& p) {
  std::ostringstream out;
  out << "pool " << p.name << "  ";
  if (!p.problem.empty()) {
    out << "not a pool: " << p.problem << "  " << p.path.string() << "\n";
    return out.str();
  }
  const pool::PoolStats& s = p.stats;
  out << (p.stale ? "stale" : "in use") << "  " << s.tenants.size() << " tenants, " << s.free
      << " of " << s.slot_count << " slots free, " << s.ready << " ready, " << s.writing
      << " writing, " << s.pinned << " pinned  " << p.path.string() << "\n";
  for (const pool::TenantStats& t : s.tenants) {
    out << "    tenant " << t.engine_id << "  pid " << t.pid << (t.alive ? "" : " (dead)")
        << "  occupancy " << t.occupancy << ", " << t.pinned << " pinned (" << t.pins
        << " pins); hits " << t.hits << " of " << t.lookup_keys << " keys, " << t.cross_engine_hits
        << " cross-engine\n";
  }
  return out.str();
}

}  // namespace kvoffload::cli
