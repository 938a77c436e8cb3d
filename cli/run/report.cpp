// The text form of a `kvoffload run` report (format_report in scheduler.hpp): the figures the JSON
// report holds, one line per subject, and the verdict last.
#include <cstdint>
#include <ios>
#include <sstream>
#include <string>

#include "../cli.hpp"
#include "scheduler.hpp"

namespace kvoffload::run {

std::string format_report(const nlohmann::json& r) {
  std::ostringstream out;
  auto fixed = [](double v, int precision = 2) {
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(precision);
    s << v;
    return s.str();
  };
  auto bytes = [](const nlohmann::json& v) { return cli::human_bytes(v.get<std::uint64_t>()); };
  auto percent = [&](const nlohmann::json& v) { return fixed(100.0 * v.get<double>(), 1) + " %"; };
  out << "kvoffload run: engine " << r["engine_id"].get<std::string>() << ", backend "
      << r["backend"].get<std::string>() << ", " << r["world_size"] << " ranks, " << r["chunks"]
      << " chunks of " << bytes(r["slot_bytes"]) << " per rank (" << bytes(r["host_pool_bytes"])
      << " pool)\n";
  out << "  requests        " << r["requests"] << " (" << r["chunks_looked_up"]
      << " chunks looked up)\n";
  out << "  hit rate        " << percent(r["hit_rate"]) << " (" << r["hits"] << " hits, "
      << r["misses"] << " misses), " << r["evictions"] << " evictions, " << r["cannot_store"]
      << " requests could not store\n";
  if (!r["promoted_from"].empty()) {
    out << "  promoted        ";
    bool first = true;
    for (const auto& [tier, n] : r["promoted_from"].items()) {
      out << (first ? "" : ", ") << n << " from the " << tier << " tier";
      first = false;
    }
    out << "\n";
  }
  out << "  stored          " << bytes(r["store_bytes"]) << " at "
      << fixed(r["store_gbps"].get<double>()) << " GB/s\n";
  out << "  loaded          " << bytes(r["load_bytes"]) << " at "
      << fixed(r["load_gbps"].get<double>()) << " GB/s\n";
  out << "  populate        " << r["populate"]["method"].get<std::string>() << ", "
      << fixed(r["populate"]["seconds"].get<double>()) << " s; registration "
      << fixed(r["registration_seconds"].get<double>()) << " s\n";
  auto secs = [&](const nlohmann::json& v) {
    return v.is_null() ? std::string("never") : fixed(v.get<double>()) + " s";
  };
  out << "  bring-up        " << r["bringup"].get<std::string>()
      << ": pool ready on every rank after " << secs(r["pool_ready_seconds"])
      << ", first request served after " << secs(r["first_request_seconds"]);
  if (r["paced_seconds"].get<double>() > 0) {
    out << " (requests waited " << fixed(r["paced_seconds"].get<double>())
        << " s for room for one)";
  }
  out << "\n";
  const auto& coming_up = r["phases"]["coming_up"];
  const auto& ready = r["phases"]["ready"];
  auto phase = [&](const char* label, const nlohmann::json& p) {
    out << label << p["requests"] << " requests, hit rate " << percent(p["hit_rate"]) << ", "
        << p["cannot_store"] << " could not store\n";
  };
  if (coming_up["requests"].get<std::uint64_t>() > 0) {
    phase("  coming up       ", coming_up);
    phase("  once ready      ", ready);
  }
  if (r.contains("pool")) {
    const auto& p = r["pool"];
    out << "  node pool       " << p["name"].get<std::string>() << " ("
        << p.value("policy", std::string("lru")) << "): " << r["cross_engine_hits"]
        << " cross-engine hits (chunks another tenant stored), " << r["tenants"]
        << " tenants at most, " << p["tenants_at_end"] << " at the end; " << p["skipped_present"]
        << " stores skipped (present)\n";
  }
  out << "  verified        " << bytes(r["verified_bytes"]) << ", " << bytes(r["mismatched_bytes"])
      << " mismatched, " << r["failed_jobs"] << " failed jobs\n";
  if (r.contains("remote")) {
    const auto& m = r["remote"];
    out << "  remote tier     " << m["url"].get<std::string>() << ": " << m["stored"] << " stored, "
        << m["promoted"] << " promoted, " << m["misses"] << " misses (" << m["lookup_timeouts"]
        << " lookups past the " << m["lookup_budget_ms"] << " ms budget), " << m["corrupt"]
        << " corrupt, errors: " << m["put_errors"] << " put, " << m["get_errors"] << " get, "
        << m["lookup_errors"] << " lookup; " << m["breaker_opens"] << " breaker opens\n";
  }
  for (const auto& e : r["errors"]) out << "  error           " << e.get<std::string>() << "\n";
  std::string verdict;
  if (!r["all_verified"].get<bool>()) {
    verdict = "NOT all bytes verified";
  } else if (r["load_bytes"].get<std::uint64_t>() == 0) {
    verdict = "nothing was loaded back, so nothing was verified";
  } else {
    verdict = "every byte verified";
  }
  out << "  " << verdict
      << (r.contains("pool")
              ? (r["region_removed"].get<bool>() ? "; pool removed (last tenant out)"
                                                 : "; pool kept for its other tenants")
              : (r["region_removed"].get<bool>() ? "; region removed" : "; region NOT removed"))
      << (r["interrupted"].get<bool>() ? " (interrupted)" : "") << "\n";
  return out.str();
}

}  // namespace kvoffload::run
