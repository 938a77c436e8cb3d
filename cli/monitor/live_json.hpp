#pragma once
// The live statistics of an engine (kvoffload/live_stats.hpp) as JSON and as short text, shared by
// `region list`, `top` and the exporter's tests.

#include <string>

#include <nlohmann/json.hpp>

#include <kvoffload/live_stats.hpp>
#include <kvoffload/node_pool.hpp>

namespace kvoffload::cli {

// {"consistent", "scheduler": {...}, "tiers": [...], "ranks": [...]}; field names follow the
// Prometheus metric names of the exporter where they exist.
nlohmann::json live_json(const LiveStats& live);

// One region as `region list --json` lists it: path, engine_id, bytes, attached, stale, complete,
// the geometry when the header is readable, `problem` for an entry that is not a region, and
// `live` (live_json) or `live_problem`.
nlohmann::json engine_json(const EngineSnapshot& engine);

// One line: "used 12 of 64 chunks (18.8 %), 0 write-pending, 3 pinned, 64 ready; hits 10, misses
// 5 (66.7 %); 3 evictions; bring-up 2 of 2 ranks ready"; "no scheduler attached" where none is.
std::string occupancy_text(const LiveStats& live);

// One node pool as `region list --json` and `top --json` list it: path, name, stale, problem,
// slot_count/free/writing/ready/pinned, the geometry, and tenants (engine_id, pid, alive,
// occupancy, pinned, pins, hits, cross_engine_hits, lookup_keys, evictions).
nlohmann::json pool_json(const pool::PoolObservation& pool);

// Lines for the text views: "pool NAME  in use  3 of 8 slots free, 5 ready, 1 pinned  PATH"
// then one per tenant.
std::string pool_text(const pool::PoolObservation& pool);

// "12.3 %" of part / whole, "-" when whole is 0.
std::string percent(std::uint64_t part, std::uint64_t whole);

}  // namespace kvoffload::cli
