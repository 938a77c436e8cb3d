#include "monitor/prometheus.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

namespace kvoffload::cli {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Families are collected first so that each is written once with all its samples together, as
// the format requires, however the engines are iterated.
class Exposition {
 public:
  void counter(const std::string& name, const std::string& help, const Labels& labels,
               double value) {
    add(name, help, "counter", labels, value);
  }
  void gauge(const std::string& name, const std::string& help, const Labels& labels, double value) {
    add(name, help, "gauge", labels, value);
  }

  [[nodiscard]] std::string text() const {
    std::string out;
    for (const Family& f : families_) {
      out += "# HELP " + f.name + " " + f.help + "\n";
      out += "# TYPE " + f.name + " " + f.type + "\n";
      out += f.samples;
    }
    return out;
  }

 private:
  struct Family {
    std::string name;
    std::string help;
    std::string type;
    std::string samples;
  };

  void add(const std::string& name, const std::string& help, const char* type, const Labels& labels,
           double value) {
    auto [it, fresh] = index_.try_emplace(name, families_.size());
    if (fresh) families_.push_back(Family{name, help, type, {}});
    std::string& s = families_[it->second].samples;
    s += name;
    if (!labels.empty()) {
      s += '{';
      for (std::size_t i = 0; i < labels.size(); ++i) {
        if (i != 0) s += ',';
        s += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
      }
      s += '}';
    }
    s += ' ' + format_value(value) + '\n';
  }

  static std::string format_value(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    char buf[40];
    // Integral values print as integers (counters up to 2^53 are exact), others round-trip.
    if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
      (void)std::snprintf(buf, sizeof buf, "%.0f", v);
    } else {
      (void)std::snprintf(buf, sizeof buf, "%.17g", v);
    }
    return buf;
  }

  std::vector<Family> families_;
  std::map<std::string, std::size_t> index_;
};

double num(std::uint64_t v) {
  return static_cast<double>(v);
}

// kvoffload_lookup_keys_total of one tier (`tier` among the labels), one sample per result: the
// host pool and each secondary tier report the same family.
void lookup_keys(Exposition& x, const Labels& tier, std::uint64_t hit, std::uint64_t pending,
                 std::uint64_t miss) {
  for (const auto& [result, v] : {std::pair{"hit", hit}, {"pending", pending}, {"miss", miss}}) {
    Labels l = tier;
    l.emplace_back("result", result);
    x.counter("kvoffload_lookup_keys_total",
              "Keys looked up, by tier (region = the host pool; others: secondary tiers, asked "
              "for region misses) and result (hit, pending, miss)",
              l, num(v));
  }
}

void scheduler_metrics(Exposition& x, const Labels& e, const LiveScheduler& s) {
  x.gauge("kvoffload_scheduler_attached",
          "1 while a scheduler-side Manager publishes this region's occupancy, 0 before it "
          "attached or after it exited",
          e, s.attached && !s.detached ? 1 : 0);
  if (!s.attached) return;
  x.gauge("kvoffload_region_chunks_ready",
          "Chunk slots the manager may hand out (rows made ready on every rank)", e,
          num(s.ready_chunks));
  x.gauge("kvoffload_region_chunks_used", "Chunk slots holding a key (write-pending or ready)", e,
          num(s.used));
  x.gauge("kvoffload_region_chunks_write_pending", "Chunk slots with a store in flight", e,
          num(s.write_pending));
  x.gauge("kvoffload_region_chunks_pinned", "Ready chunk slots pinned by at least one load", e,
          num(s.pinned));
  Labels region = e;
  region.emplace_back("tier", "region");
  lookup_keys(x, region, s.hits, s.hits_pending, s.misses);
  x.counter("kvoffload_evictions_total", "Keys evicted from the host pool to make room", e,
            num(s.evictions));
  x.counter("kvoffload_stores_prepared_total", "Keys given a slot by prepare_store", e,
            num(s.stores_prepared));
  x.counter("kvoffload_stores_completed_total", "Stores completed successfully (keys)", e,
            num(s.stores_completed));
  x.counter("kvoffload_stores_failed_total", "Stores completed as failed (keys; slots freed)", e,
            num(s.stores_failed));
  x.counter("kvoffload_stores_skipped_threshold_total",
            "Keys not stored because they were looked up fewer than store_threshold times", e,
            num(s.stores_skipped_threshold));
  x.counter("kvoffload_cannot_store_total",
            "prepare_store calls that could not store (no free or evictable slot)", e,
            num(s.allocation_failures));
  x.counter("kvoffload_loads_prepared_total", "Key pins taken by prepare_load", e,
            num(s.loads_prepared));
  x.counter("kvoffload_loads_completed_total", "Key pins released by complete_load", e,
            num(s.loads_completed));
}

void tier_metrics(Exposition& x, const Labels& e, const LiveTier& t) {
  Labels l = e;
  l.emplace_back("tier", t.name);
  lookup_keys(x, l, t.present, t.pending, t.misses());
  x.counter("kvoffload_tier_promoted_total", "Keys read back from a secondary tier into the pool",
            l, num(t.promoted));
  x.counter("kvoffload_tier_promote_failed_total",
            "Keys whose read from a secondary tier missed or failed", l, num(t.promote_failed));
  x.counter("kvoffload_tier_offloaded_total", "Keys written to a secondary tier", l,
            num(t.offloaded));
  x.counter("kvoffload_tier_offload_failed_total", "Keys a secondary tier failed to write", l,
            num(t.offload_failed));
}

void direction_metrics(Exposition& x, const Labels& r, const char* direction,
                       const LiveDirection& d) {
  Labels l = r;
  l.emplace_back("direction", direction);
  x.counter("kvoffload_transfer_bytes_total",
            "Bytes moved by succeeded jobs (store: device to host, load: host to device)", l,
            num(d.bytes));
  x.counter("kvoffload_transfer_copy_seconds_total",
            "Copy time on the transfer streams of succeeded jobs; bytes / this is the copy rate", l,
            d.copy_seconds);
  x.counter("kvoffload_transfer_jobs_submitted_total", "Jobs submitted to the transfer engine", l,
            num(d.jobs_submitted));
  x.counter("kvoffload_transfer_jobs_succeeded_total", "Jobs that completed successfully", l,
            num(d.jobs_succeeded));
  x.counter("kvoffload_transfer_jobs_failed_total",
            "Jobs that failed (a failed copy is never reported complete)", l, num(d.jobs_failed));
  x.gauge("kvoffload_transfer_jobs_in_flight", "Jobs submitted and not finished", l,
          num(d.jobs_in_flight()));
}

void rank_metrics(Exposition& x, const Labels& e, const LiveRank& r) {
  Labels l = e;
  l.emplace_back("rank", std::to_string(r.rank));
  x.gauge("kvoffload_rank_engine_attached",
          "1 while a rank's transfer engine publishes, 0 before it attached or after it exited", l,
          r.engine_attached && !r.engine_detached ? 1 : 0);
  x.gauge("kvoffload_rank_host_registered",
          "1 when the rank's host memory is registered with the device (copy kernel possible)", l,
          r.host_registered ? 1 : 0);
  direction_metrics(x, l, "store", r.store);
  direction_metrics(x, l, "load", r.load);
  x.gauge("kvoffload_bringup_ready_chunks", "Rows of the region made ready on the rank", l,
          num(r.bringup.ready_chunks));
  for (const BringupState s : {BringupState::kPending, BringupState::kRunning, BringupState::kReady,
                               BringupState::kFailed, BringupState::kStopped}) {
    Labels st = l;
    st.emplace_back("state", std::string(to_string(s)));
    x.gauge("kvoffload_bringup_state", "The rank's bring-up state (1 for the current one)", st,
            r.bringup.state == s ? 1 : 0);
  }
  x.gauge("kvoffload_bringup_populated_bytes", "Bytes the rank's bring-up has populated", l,
          num(r.bringup_populated_bytes));
  x.gauge("kvoffload_bringup_seconds",
          "Seconds from the rank's start until its last bring-up piece (or its end)", l,
          r.bringup_seconds);
}

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string prometheus_text(const std::vector<EngineSnapshot>& engines,
                            const std::vector<pool::PoolObservation>& pools) {
  Exposition x;
  x.gauge("kvoffload_regions", "Region files in the shm dir (every engine of the node)", {},
          num(engines.size()));
  for (const EngineSnapshot& engine : engines) {
    const RegionInfo& r = engine.region;
    const Labels e{{"engine_id", r.engine_id}};
    Labels info = e;
    info.emplace_back("path", r.path.string());
    info.emplace_back("problem", r.problem);
    x.gauge("kvoffload_region_info",
            "One per region file, with its path and, for an entry that is not a readable region, "
            "why",
            info, 1);
    if (!r.problem.empty()) continue;
    x.gauge("kvoffload_region_size_bytes", "Size of the region file", e, num(r.file_bytes));
    x.gauge("kvoffload_region_attached_processes",
            "Processes attached to the region (its liveness lock, from /proc/locks)", e,
            r.attached);
    x.gauge("kvoffload_region_stale", "1 when no process is attached (region clean removes it)", e,
            r.stale ? 1 : 0);
    if (r.geometry) {
      x.gauge("kvoffload_region_chunks", "Chunk slots (rows) of the region", e,
              num(r.geometry->num_chunks()));
      x.gauge("kvoffload_region_slot_bytes", "Bytes of one rank's slot of one chunk", e,
              num(r.geometry->slot_bytes()));
      x.gauge("kvoffload_region_world_size", "Ranks of the engine", e, r.geometry->world_size());
    }
    x.gauge("kvoffload_live_stats_readable",
            "1 when the region's live statistics page was read (0: see region list for why)", e,
            engine.live ? 1 : 0);
    if (!engine.live) continue;
    const LiveStats& live = *engine.live;
    x.gauge("kvoffload_live_stats_consistent",
            "1 when every block of the page was copied outside a write (0: a writer died "
            "mid-write)",
            e, live.consistent ? 1 : 0);
    scheduler_metrics(x, e, live.scheduler);
    for (const LiveTier& t : live.tiers) tier_metrics(x, e, t);
    for (const LiveRank& rank : live.ranks) rank_metrics(x, e, rank);
  }
  x.gauge("kvoffload_pools", "Node pool files in the shm dir", {}, num(pools.size()));
  for (const pool::PoolObservation& p : pools) {
    const Labels l{{"pool", p.name}};
    Labels info = l;
    info.emplace_back("path", p.path.string());
    info.emplace_back("problem", p.problem);
    x.gauge("kvoffload_pool_info",
            "One per node pool file, with its path and, for one that is not readable, why", info,
            1);
    if (!p.problem.empty()) continue;
    const pool::PoolStats& s = p.stats;
    x.gauge("kvoffload_pool_stale", "1 when no tenant is alive (region clean removes it)", l,
            p.stale ? 1 : 0);
    x.gauge("kvoffload_pool_slots", "Chunk slots of the pool", l, num(s.slot_count));
    x.gauge("kvoffload_pool_slots_free", "Free chunk slots", l, num(s.free));
    x.gauge("kvoffload_pool_slots_writing", "Chunk slots being written", l, num(s.writing));
    x.gauge("kvoffload_pool_slots_ready", "Chunk slots ready (loadable by every tenant)", l,
            num(s.ready));
    x.gauge("kvoffload_pool_slots_pinned", "Ready slots pinned by at least one tenant", l,
            num(s.pinned));
    x.gauge("kvoffload_pool_tenants", "Tenant records in use (alive or not yet reclaimed)", l,
            num(s.tenants.size()));
    x.counter("kvoffload_pool_repairs_total", "Index repairs after a dead holder or tenant", l,
              num(s.repairs));
    for (const pool::TenantStats& t : s.tenants) {
      Labels tl = l;
      tl.emplace_back("engine_id", t.engine_id);
      x.gauge("kvoffload_pool_tenant_pid", "The tenant's process ID", tl, t.pid);
      x.gauge("kvoffload_pool_tenant_alive", "1 while the tenant's process runs", tl,
              t.alive ? 1 : 0);
      x.gauge("kvoffload_pool_tenant_occupancy_slots",
              "Slots the tenant owns now (writing + ready)", tl, num(t.occupancy));
      x.gauge("kvoffload_pool_tenant_pinned_slots", "Slots the tenant pins now", tl, num(t.pinned));
      x.counter("kvoffload_pool_tenant_pins_total", "Pins the tenant took", tl, num(t.pins));
      x.counter("kvoffload_pool_tenant_lookup_keys_total", "Keys the tenant looked up", tl,
                num(t.lookup_keys));
      x.counter("kvoffload_pool_tenant_hits_total", "Lookup hits of the tenant", tl, num(t.hits));
      x.counter("kvoffload_pool_tenant_cross_engine_hits_total",
                "Hits on chunks another engine stored", tl, num(t.cross_engine_hits));
    }
  }
  return x.text();
}

}  // namespace kvoffload::cli
