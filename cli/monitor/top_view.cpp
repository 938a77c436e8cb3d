#include "monitor/top_view.hpp"

#include <cstdio>

#include <kvoffload/error.hpp>

#include "monitor/live_json.hpp"

namespace kvoffload::cli {
namespace {

std::string printf_string(const char* format, auto... args) {
  char buf[256];
  (void)std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

// "1.2k", "34.5M": counts for a narrow column.
std::string count(std::uint64_t v) {
  if (v < 10'000) return std::to_string(v);
  static constexpr const char* kUnits[] = {"k", "M", "G", "T", "P"};
  double d = static_cast<double>(v);
  int unit = -1;
  while (d >= 1000.0 && unit < 4) {
    d /= 1000.0;
    ++unit;
  }
  return printf_string("%.1f%s", d, kUnits[unit]);
}

std::string bytes(std::uint64_t v) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double d = static_cast<double>(v);
  int unit = 0;
  while (d >= 1024.0 && unit < 5) {
    d /= 1024.0;
    ++unit;
  }
  return unit == 0 ? printf_string("%.0f B", d) : printf_string("%.2f %s", d, kUnits[unit]);
}

std::string gbps(double v) {
  return v < 0 ? std::string("-") : printf_string("%.2f", v);
}

std::string bringup_text(const LiveRank& r, std::uint64_t num_chunks) {
  std::string s = std::string(to_string(r.bringup.state));
  if (r.bringup.state != BringupState::kPending) {
    s += " " + std::to_string(r.bringup.ready_chunks) + "/" + std::to_string(num_chunks);
  }
  if (r.bringup.sys_errno != 0) s += " (" + errno_name(r.bringup.sys_errno) + ")";
  return s;
}

std::string rank_pid(const LiveRank& r) {
  if (!r.engine_attached) return "-";
  return std::to_string(r.pid) + (r.engine_detached ? " (exited)" : "");
}

void engine_lines(const EngineSnapshot& e, const RateTracker& rates,
                  std::vector<std::string>& out) {
  const RegionInfo& r = e.region;
  if (!r.problem.empty()) {
    out.push_back(r.engine_id + "  not a region: " + r.problem);
    return;
  }
  std::string head = r.engine_id + "  " +
                     (r.stale ? std::string("stale (no process attached)")
                              : "in use, " + std::to_string(r.attached) + " attached");
  if (r.geometry) {
    head += "  " + std::to_string(r.geometry->world_size()) + " ranks x " +
            std::to_string(r.geometry->num_chunks()) + " chunks x " +
            bytes(r.geometry->slot_bytes()) + "  (" + bytes(r.file_bytes) + ")";
  }
  if (!r.complete) head += "  being created";
  out.push_back(head);
  if (!e.live) {
    out.push_back("  live state: " + e.live_problem);
    return;
  }
  const LiveStats& live = *e.live;
  const LiveScheduler& s = live.scheduler;
  if (!s.attached) {
    out.push_back("  scheduler  none attached");
  } else {
    out.push_back("  scheduler  pid " + std::to_string(s.pid) + (s.detached ? " (exited)" : "") +
                  "  used " + std::to_string(s.used) + "/" + std::to_string(s.num_chunks) + " (" +
                  percent(s.used, s.num_chunks) + ")  write-pending " +
                  std::to_string(s.write_pending) + "  pinned " + std::to_string(s.pinned) +
                  "  ready " + std::to_string(s.ready_chunks) + "/" + std::to_string(s.num_chunks));
    out.push_back("  region     hits " + count(s.hits) + "  pending " + count(s.hits_pending) +
                  "  misses " + count(s.misses) + "  (" + percent(s.hits, s.hits + s.misses) +
                  " hit)  evictions " + count(s.evictions) + "  cannot store " +
                  count(s.allocation_failures) + "  stores failed " + count(s.stores_failed));
  }
  for (const LiveTier& t : live.tiers) {
    out.push_back("  tier       " + t.name + "  hits " + count(t.present) + "  pending " +
                  count(t.pending) + "  misses " + count(t.misses()) + "  promoted " +
                  count(t.promoted) + " (" + count(t.promote_failed) + " failed)  offloaded " +
                  count(t.offloaded) + " (" + count(t.offload_failed) + " failed)");
  }
  const std::uint64_t chunks = r.geometry ? r.geometry->num_chunks() : 0;
  out.push_back(printf_string("  %4s  %-14s %-18s %10s %8s %10s %8s %10s %10s %6s %6s", "RANK",
                              "PID", "BRING-UP", "STORE GB/s", "(COPY)", "LOAD GB/s", "(COPY)",
                              "STORED", "LOADED", "FLIGHT", "FAILED"));
  for (const LiveRank& rank : live.ranks) {
    const std::string copy_store = "(" + gbps(rank.store.copy_gbps()) + ")";
    const std::string copy_load = "(" + gbps(rank.load.copy_gbps()) + ")";
    out.push_back(printf_string(
        "  %4u  %-14s %-18s %10s %8s %10s %8s %10s %10s %6s %6s", rank.rank, rank_pid(rank).c_str(),
        bringup_text(rank, chunks).c_str(), gbps(rates.rate(r.engine_id, rank.rank, true)).c_str(),
        copy_store.c_str(), gbps(rates.rate(r.engine_id, rank.rank, false)).c_str(),
        copy_load.c_str(), bytes(rank.store.bytes).c_str(), bytes(rank.load.bytes).c_str(),
        count(rank.store.jobs_in_flight() + rank.load.jobs_in_flight()).c_str(),
        count(rank.store.jobs_failed + rank.load.jobs_failed).c_str()));
  }
  if (!live.consistent) out.push_back("  (a writer was interrupted mid-write: values may be torn)");
}

}  // namespace

void RateTracker::update(const std::vector<EngineSnapshot>& engines, Clock::time_point now) {
  std::map<std::pair<std::string, std::uint32_t>, Sample> next;
  rates_.clear();
  for (const EngineSnapshot& e : engines) {
    if (!e.live) continue;
    for (const LiveRank& r : e.live->ranks) {
      const auto key = std::make_pair(e.region.engine_id, r.rank);
      const Sample sample{r.store.bytes, r.load.bytes, now};
      if (auto it = last_.find(key); it != last_.end()) {
        const double dt = std::chrono::duration<double>(now - it->second.at).count();
        const bool restarted = sample.store_bytes < it->second.store_bytes ||
                               sample.load_bytes < it->second.load_bytes;
        if (dt > 0 && !restarted) {
          rates_[key] = {
              static_cast<double>(sample.store_bytes - it->second.store_bytes) / dt / 1e9,
              static_cast<double>(sample.load_bytes - it->second.load_bytes) / dt / 1e9};
        }
      }
      next[key] = sample;
    }
  }
  last_ = std::move(next);
}

double RateTracker::rate(const std::string& engine_id, std::uint32_t rank, bool store) const {
  const auto it = rates_.find(std::make_pair(engine_id, rank));
  if (it == rates_.end()) return -1.0;
  return store ? it->second.first : it->second.second;
}

std::vector<std::string> render_top(const std::vector<EngineSnapshot>& engines,
                                    const RateTracker& rates, const TopHeader& header) {
  std::vector<std::string> out;
  out.push_back("kvoffload top  " + header.shm_dir.string() + "  " +
                std::to_string(engines.size()) + (engines.size() == 1 ? " engine" : " engines") +
                "  " + header.clock + "  every " + printf_string("%.1f", header.interval_seconds) +
                " s" + (header.interactive ? "  (q quits)" : ""));
  if (engines.empty()) {
    out.emplace_back("");
    out.push_back("no engines: no regions in " + header.shm_dir.string());
  }
  for (const EngineSnapshot& e : engines) {
    out.emplace_back("");
    engine_lines(e, rates, out);
  }
  return out;
}

}  // namespace kvoffload::cli
