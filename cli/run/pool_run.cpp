// `kvoffload run --pool NAME`: the scheduler as a tenant of a node pool (Note [Run on a node
// pool]). The ranks, the workload, the device blocks and the verification are run's own
// (scheduler.cpp); only the index and the host bytes are the pool's.
//
// Note [Run on a node pool]: the scheduler attaches the pool (NodePool::attach: created by the
// first run, joined by the others, refused on another geometry or a live twin engine id) and each
// request is one lookup_and_prepare: the ready prefix is pinned for this tenant and loaded, the
// keys after it that nobody stored or is storing get writing slots and are stored; then the load's
// pins are dropped and the stores committed (or aborted when a rank failed). The ranks map the
// pool file's chunk bytes (the file's tail: its index stays out of their reach) and register all
// of it: the pool is laid out chunk-major (a chunk's ranks' slots side by side), so a rank's slots
// are not one contiguous range. A chunk another engine stored is loaded and verified like one of
// this run's own: the KV pattern depends only on the key, the rank, the layer and the position.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/node_pool.hpp>
#include <kvoffload/platform.hpp>

#include "channel.hpp"
#include "interrupt.hpp"
#include "ranks.hpp"
#include "scheduler.hpp"
#include "workload.hpp"

namespace kvoffload::run {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json job(std::uint64_t id, std::span<const std::uint32_t> slots,
                   std::span<const std::uint64_t> blocks, std::span<const BlockKey> keys) {
  nlohmann::json k = nlohmann::json::array();
  for (const BlockKey& key : keys) k.push_back({key.hi(), key.lo()});
  return {{"job", id}, {"chunks", slots}, {"blocks", blocks}, {"keys", k}};
}

// What every run on one pool must agree on: its geometry, and a fingerprint for run's KV pattern.
pool::PoolGeometry pool_geometry(const RunConfig& c) {
  return {.slot_bytes = c.slot_bytes,
          .slot_count = static_cast<std::uint32_t>(c.num_chunks),
          .world_size = c.world_size,
          .layout = "run-l" + std::to_string(c.layers) + "-b" + std::to_string(c.block_bytes) +
                    "-c" + std::to_string(c.blocks_per_chunk),
          .dtype = "u8",
          .fingerprint = "kvoffload-run kv_pattern v1"};
}

// attach(), its refusals worded with this program's flags.
pool::NodePool attach_pool(const RunConfig& c) {
  pool::PoolOptions o;
  o.name = c.pool;
  o.shm_dir = c.shm_dir;
  o.engine_id = c.engine_id;
  o.geometry = pool_geometry(c);
  o.policy = parse_policy_kind(c.pool_policy);
  o.cap_fraction = c.pool_cap_fraction;
  try {
    return pool::NodePool::attach(o);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kMismatch) {
      throw Error(e.code(), "--pool " + c.pool + ": " + e.what() +
                                "; every run on one pool needs the same --world-size, --layers, "
                                "--block-bytes, --blocks-per-chunk, --host-pool and "
                                "--pool-policy");
    }
    if (e.code() == ErrorCode::kInUse) {
      throw Error(e.code(),
                  "--engine-id " + c.engine_id + " on --pool " + c.pool + ": " + e.what());
    }
    throw Error(e.code(), "--pool " + c.pool + ": " + e.what(), e.sys_errno(), e.call());
  }
}

}  // namespace

RunOutcome run_pool_scheduler(RunConfig config) {
  const InterruptGuard interrupt_guard;
  const auto started = Clock::now();
  if (config.num_chunks > 0x7FFFFFFFULL) {
    throw_invalid("--host-pool " + std::to_string(config.host_pool_bytes) + " would hold " +
                  std::to_string(config.num_chunks) +
                  " chunks; a node pool holds at most 2^31: give a smaller --host-pool");
  }
  pool::NodePool pool = attach_pool(config);
  const std::filesystem::path pool_file = pool.path();
  config.pool_slot_stride = pool.chunk_stride();
  config.pool_row_stride =
      config.num_chunks >= 2
          ? static_cast<std::uint64_t>(pool.chunk(1, 0) - pool.chunk(0, 0))
          : (config.world_size * pool.chunk_stride() + platform::page_size() - 1) /
                platform::page_size() * platform::page_size();

  std::uint64_t requests = 0, looked_up = 0, hits = 0, cross_hits = 0, cannot_store = 0;
  std::uint64_t store_bytes = 0, load_bytes = 0, verified = 0, mismatched = 0, failed_jobs = 0;
  std::uint64_t skipped_present = 0, skipped_writing = 0;
  double store_s = 0, load_s = 0;
  std::vector<std::string> errors;
  std::set<std::string> peers;  // other engines seen attached
  std::uint32_t most_tenants = 1;
  bool lingering = false;  // then each engine seen joining is said on stderr
  // Engines seen joining while this run lingered: once they have all left, so does this run.
  std::set<std::string> joined_meanwhile;
  auto note_tenants = [&] {
    const pool::PoolStats s = pool.stats();
    most_tenants = std::max<std::uint32_t>(most_tenants, s.tenants.size());
    std::size_t still_here = 0;  // of joined_meanwhile
    for (const auto& t : s.tenants) {
      if (t.engine_id == config.engine_id) continue;
      if (peers.insert(t.engine_id).second && lingering) {
        joined_meanwhile.insert(t.engine_id);
        (void)std::fprintf(stderr, "kvoffload run: engine %s (PID %d) joined pool %s\n",
                           t.engine_id.c_str(), static_cast<int>(t.pid), config.pool.c_str());
        (void)std::fflush(stderr);
      }
      if (joined_meanwhile.count(t.engine_id) != 0) ++still_here;
    }
    return still_here;
  };
  std::optional<double> ready_seconds, first_request_seconds;
  std::vector<RankProcess> ranks;
  nlohmann::json rank_reports = nlohmann::json::array();
  nlohmann::json byes = nlohmann::json::array();
  bool graceful = true;
  std::string stopped_early;
  std::exception_ptr failure;
  try {
    ranks = spawn_ranks(config.world_size);
    for (std::uint32_t r = 0; r < config.world_size; ++r) {
      send_to(ranks[r], r, {{"op", "config"}, {"rank", r}, {"config", config}});
    }
    for (std::uint32_t r = 0; r < config.world_size; ++r) {
      rank_reports.push_back(receive_from(ranks[r], r, std::chrono::seconds(120)));
    }
    ready_seconds = std::chrono::duration<double>(Clock::now() - started).count();
    Workload workload(config.seed, config.prefixes, config.prefix_chunks, config.unique_chunks);
    std::mt19937_64 rng(config.seed * 7919 + 1);
    std::vector<std::uint64_t> device_blocks(config.gpu_blocks);
    std::iota(device_blocks.begin(), device_blocks.end(), 0);
    const std::uint32_t bpc = config.blocks_per_chunk;
    std::vector<std::uint32_t> load_slots, store_slots;
    std::vector<BlockKey> store_keys;
    std::uint64_t next_job = 1;
    auto run_over = [&] {
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      return interrupted() || (config.duration_seconds > 0 && elapsed >= config.duration_seconds);
    };
    while (!run_over() && (config.requests == 0 || requests < config.requests)) {
      const std::vector<BlockKey>& keys = workload.next();
      ++requests;
      looked_up += keys.size();
      const pool::NodePool::Cycle cycle = pool.lookup_and_prepare(keys, /*pin=*/true);
      const std::size_t hit = cycle.lookup.hits;
      hits += hit;
      cross_hits += cycle.lookup.cross_engine_hits;
      load_slots.assign(cycle.lookup.slots.begin(), cycle.lookup.slots.end());
      store_slots.assign(cycle.store.slots.begin(), cycle.store.slots.end());
      store_keys.clear();
      for (const std::uint32_t p : cycle.store.positions) store_keys.push_back(keys[p]);
      skipped_present += cycle.store.skipped_present;
      skipped_writing += cycle.store.skipped_writing;
      if (cycle.store.skipped_no_room + cycle.store.skipped_cap > 0) ++cannot_store;
      if (hit == 0 && store_keys.empty()) continue;

      const std::size_t blocks_needed = (hit + store_keys.size()) * bpc;
      for (std::size_t i = 0; i < blocks_needed; ++i) {
        std::uniform_int_distribution<std::size_t> pick(i, device_blocks.size() - 1);
        std::swap(device_blocks[i], device_blocks[pick(rng)]);
      }
      const std::span<const std::uint64_t> all_blocks(device_blocks);
      nlohmann::json request{{"op", "request"}, {"id", requests}};
      if (hit > 0) {
        request["load"] =
            job(next_job++, load_slots, all_blocks.first(hit * bpc), std::span(keys).first(hit));
      }
      if (!store_keys.empty()) {
        request["store"] = job(next_job++, store_slots,
                               all_blocks.subspan(hit * bpc, store_keys.size() * bpc), store_keys);
      }
      bool load_ok = true, store_ok = true;
      double ls = 0, ss = 0;
      for (std::uint32_t r = 0; r < config.world_size; ++r) send_to(ranks[r], r, request);
      for (std::uint32_t r = 0; r < config.world_size; ++r) {
        const nlohmann::json done = receive_from(ranks[r], r, std::chrono::seconds(300));
        if (done.contains("load")) {
          const auto& l = done["load"];
          if (!l.at("success").get<bool>() && errors.size() < 5)
            errors.push_back("rank " + std::to_string(r) + " load: " + l.value("error", ""));
          load_ok = load_ok && l.at("success").get<bool>() &&
                    l.at("mismatched_bytes").get<std::uint64_t>() == 0;
          load_bytes += l.at("bytes").get<std::uint64_t>();
          verified += l.at("verified_bytes").get<std::uint64_t>();
          mismatched += l.at("mismatched_bytes").get<std::uint64_t>();
          ls = std::max(ls, l.at("seconds").get<double>());
        }
        if (done.contains("store")) {
          const auto& s = done["store"];
          if (!s.at("success").get<bool>() && errors.size() < 5)
            errors.push_back("rank " + std::to_string(r) + " store: " + s.value("error", ""));
          store_ok = store_ok && s.at("success").get<bool>();
          store_bytes += s.at("bytes").get<std::uint64_t>();
          ss = std::max(ss, s.at("seconds").get<double>());
        }
      }
      load_s += ls;
      store_s += ss;
      if (!first_request_seconds) {
        first_request_seconds = std::chrono::duration<double>(Clock::now() - started).count();
      }
      if (hit > 0) {
        pool.unpin(load_slots);
        if (!load_ok) ++failed_jobs;
      }
      if (!store_keys.empty()) {
        // A store that failed on any rank is not stored at all: its slots go back to free.
        if (store_ok) {
          pool.commit_stores(store_slots);
        } else {
          pool.abort_stores(store_slots);
          ++failed_jobs;
        }
      }
      if (requests % 64 == 0) (void)note_tenants();
    }
    (void)note_tenants();
    if (config.pool_linger_seconds > 0 && !interrupted()) {
      // Say so on stderr (a test or a script waits for this line before it starts the next run).
      (void)std::fprintf(
          stderr, "kvoffload run: %llu requests served; staying on pool %s for up to %.0f s\n",
          static_cast<unsigned long long>(requests), config.pool.c_str(),
          config.pool_linger_seconds);
      (void)std::fflush(stderr);
      lingering = true;
      const auto until =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(config.pool_linger_seconds));
      while (Clock::now() < until && !interrupted()) {
        const std::size_t still_here = note_tenants();
        if (!joined_meanwhile.empty() && still_here == 0) break;  // they came and went
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const std::exception& e) {
    graceful = false;
    stopped_early = e.what();
    failure = std::current_exception();
  }
  stop_ranks(ranks, graceful, &byes);
  if (!stopped_early.empty()) {
    const std::string lost = describe_lost_ranks(ranks);
    if (lost.empty() && requests == 0) {
      pool.detach();
      std::rethrow_exception(failure);
    }
    if (!lost.empty()) stopped_early = lost + " (the scheduler saw: " + stopped_early + ")";
  }
  pool::TenantStats mine;
  std::uint64_t tenants_now = 0;
  try {
    const pool::PoolStats s = pool.stats();
    tenants_now = s.tenants.size();
    for (const auto& t : s.tenants) {
      if (t.index == pool.tenant_index()) mine = t;
    }
  } catch (const std::exception& e) {
    if (errors.size() < 5) errors.emplace_back(std::string("pool stats: ") + e.what());
  }
  pool.detach();
  std::error_code ec;
  const bool pool_removed = !std::filesystem::exists(pool_file, ec);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const bool all_verified = mismatched == 0 && failed_jobs == 0 && verified == load_bytes;
  auto gbps = [](std::uint64_t b, double s) { return s > 0 ? b / s / 1e9 : 0.0; };
  const double hit_rate = looked_up ? double(hits) / double(looked_up) : 0.0;
  const nlohmann::json phase{{"requests", requests},
                             {"chunks_looked_up", looked_up},
                             {"hits", hits},
                             {"hit_rate", hit_rate},
                             {"cannot_store", cannot_store}};
  std::uint64_t registered = 0;
  for (const auto& b : byes) registered += b.value("registered_bytes", std::uint64_t{0});
  nlohmann::json report = geometry_report(config, rank_reports);
  report.update(nlohmann::json{{"ready_chunks", config.num_chunks},
                               {"region_path", pool_file.string()},
                               {"requests", requests},
                               {"chunks_looked_up", looked_up},
                               {"hits", hits},
                               {"cross_engine_hits", cross_hits},
                               {"misses", looked_up - hits},
                               {"hit_rate", hit_rate},
                               {"evictions", mine.evictions},
                               {"cannot_store", cannot_store},
                               {"promoted", 0},
                               {"promoted_from", nlohmann::json::object()},
                               {"tier_offloads", 0},
                               {"store_bytes", store_bytes},
                               {"load_bytes", load_bytes},
                               {"store_gbps", gbps(store_bytes, store_s)},
                               {"load_gbps", gbps(load_bytes, load_s)},
                               {"verified_bytes", verified},
                               {"mismatched_bytes", mismatched},
                               {"failed_jobs", failed_jobs},
                               {"all_verified", all_verified},
                               {"populate", {{"method", "pool"}, {"bytes", 0}, {"seconds", 0.0}}},
                               {"ranks", rank_reports},
                               {"interrupted", interrupted()},
                               {"region_removed", pool_removed},
                               {"errors", errors},
                               {"seconds", seconds}});
  double registration = 0;
  for (const auto& r : rank_reports)
    registration = std::max(registration, r.value("registration_seconds", 0.0));
  report["registration_seconds"] = registration;
  report["bringup"] = "blocking";
  report["bringup_piece_bytes"] = config.bringup_piece_bytes;
  report["wait_for_tiers"] = false;
  report["first_request_seconds"] =
      first_request_seconds ? nlohmann::json(*first_request_seconds) : nlohmann::json();
  report["pool_ready_seconds"] = ready_seconds ? nlohmann::json(*ready_seconds) : nlohmann::json();
  report["paced_seconds"] = 0.0;
  report["phases"] = {{"coming_up",
                       {{"requests", 0},
                        {"chunks_looked_up", 0},
                        {"hits", 0},
                        {"hit_rate", 0.0},
                        {"cannot_store", 0}}},
                      {"ready", phase}};
  report["registration_longest_piece_seconds"] = registration;
  report["rank_bringup"] = byes;
  report["registered_bytes"] = registered;
  report["pool"] = {{"name", config.pool},
                    {"path", pool_file.string()},
                    {"policy", config.pool_policy},
                    {"cap_slots", mine.cap_slots},
                    {"tenant_index", mine.index},
                    {"tenants_at_end", tenants_now},
                    {"most_tenants", most_tenants},
                    {"peers_seen", std::vector<std::string>(peers.begin(), peers.end())},
                    {"cross_engine_hits", cross_hits},
                    {"stores_committed", mine.stores_committed},
                    {"stores_aborted", mine.stores_aborted},
                    {"skipped_present", skipped_present},
                    {"skipped_writing", skipped_writing},
                    {"removed", pool_removed}};
  report["tenants"] = most_tenants;

  RunOutcome outcome{report, 0, {}, false};
  if (!stopped_early.empty()) {
    outcome.exit_code = 1;
    char after[64];
    (void)std::snprintf(after, sizeof after, "stopped after %.1f s and %llu requests: ", seconds,
                        static_cast<unsigned long long>(requests));
    outcome.failure = after + stopped_early;
    outcome.verdict_only = requests == 0;
  } else if (interrupted()) {
    outcome.exit_code = 130;
  } else if (!all_verified) {
    outcome.exit_code = 1;
    std::string why = "failed: ";
    if (mismatched != 0) {
      why += std::to_string(mismatched) + " bytes loaded back did not match what was stored";
    } else if (failed_jobs != 0) {
      why += std::to_string(failed_jobs) + " transfer jobs failed";
    } else {
      why += "not every loaded byte was verified";
    }
    if (!errors.empty()) why += " (first error: " + errors.front() + ")";
    outcome.failure = why;
  }
  return outcome;
}

}  // namespace kvoffload::run
