// `kvoffload run --pool NAME`: the scheduler as a tenant of a node pool (Note [Run on a node
// pool]). The ranks, the workload, the device blocks and the verification are run's own
// (scheduler.cpp); only the index and the host bytes are the pool's.
//
// Note [Run on a node pool]: the scheduler attaches the pool (NodePool::attach: created by the
// first run, joined by the others, refused on another geometry or a live twin engine id) and each
// request is one lookup_and_prepare: the ready prefix is pinned for this tenant and loaded, the
// keys after it that nobody stored or is storing get writing slots and are stored; then the load's
// pins are dropped and the stores committed (or aborted when a rank failed). The pool is
// rank-major (Note [Pool layout]): each rank maps only its own range of the pool file
// (NodePool::rank_range: its slot of every chunk; the index stays out of its reach) and registers
// that, 1/W of the chunk bytes (`registered_bytes` per rank in rank_bringup). A chunk another
// engine stored is loaded and verified like one of
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

// What one run on a pool counts while it serves.
struct PoolRunTotals {
  std::uint64_t requests = 0, looked_up = 0, hits = 0, cross_hits = 0, cannot_store = 0;
  std::uint64_t store_bytes = 0, load_bytes = 0, verified = 0, mismatched = 0, failed_jobs = 0;
  std::uint64_t skipped_present = 0, skipped_writing = 0;
  double store_s = 0, load_s = 0;
  std::vector<std::string> errors;
};

// The scheduler of a run on a pool: serve() drives the workload through the ranks, linger()
// stays for later runs, finish() stops the ranks, detaches and reports.
class PoolRun {
 public:
  PoolRun(RunConfig& config, pool::NodePool& pool, Clock::time_point started)
      : config_(config), pool_(pool), started_(started) {}

  void start_ranks() {
    ranks_ = spawn_ranks(config_.world_size);
    for (std::uint32_t r = 0; r < config_.world_size; ++r) {
      send_to(ranks_[r], r, {{"op", "config"}, {"rank", r}, {"config", config_}});
    }
    for (std::uint32_t r = 0; r < config_.world_size; ++r) {
      rank_reports_.push_back(receive_from(ranks_[r], r, std::chrono::seconds(120)));
    }
    ready_seconds_ = seconds_since_start();
  }

  void serve() {
    Workload workload(config_.seed, config_.prefixes, config_.prefix_chunks, config_.unique_chunks);
    std::mt19937_64 rng(config_.seed * 7919 + 1);
    device_blocks_.resize(config_.gpu_blocks);
    std::iota(device_blocks_.begin(), device_blocks_.end(), 0);
    while (!run_over() && (config_.requests == 0 || t_.requests < config_.requests)) {
      serve_one(workload.next(), rng);
      if (t_.requests % 64 == 0) (void)note_tenants();
    }
    (void)note_tenants();
  }

  void linger() {
    if (config_.pool_linger_seconds <= 0 || interrupted()) return;
    // Say so on stderr (a test or a script waits for this line before it starts the next run).
    (void)std::fprintf(stderr,
                       "kvoffload run: %llu requests served; staying on pool %s for up to %.0f s\n",
                       static_cast<unsigned long long>(t_.requests), config_.pool.c_str(),
                       config_.pool_linger_seconds);
    (void)std::fflush(stderr);
    lingering_ = true;
    const auto until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(config_.pool_linger_seconds));
    while (Clock::now() < until && !interrupted()) {
      const std::size_t still_here = note_tenants();
      if (!joined_meanwhile_.empty() && still_here == 0) break;  // they came and went
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Stops the ranks and detaches; rethrows a failure that came before any request was served.
  // graceful: false when `stopped` (what stopped the run) and `failure` say why.
  RunOutcome finish(bool graceful, const std::string& stopped, const std::exception_ptr& failure) {
    stop_ranks(ranks_, graceful, &byes_);
    std::string stopped_early = stopped;
    if (!graceful) {
      const std::string lost = describe_lost_ranks(ranks_);
      if (lost.empty() && t_.requests == 0) {
        pool_.detach();
        std::rethrow_exception(failure);
      }
      if (!lost.empty()) stopped_early = lost + " (the scheduler saw: " + stopped_early + ")";
    }
    pool::TenantStats mine;
    std::uint64_t tenants_now = 0;
    try {
      const pool::PoolStats s = pool_.stats();
      tenants_now = s.tenants.size();
      for (const auto& t : s.tenants) {
        if (t.index == pool_.tenant_index()) mine = t;
      }
    } catch (const std::exception& e) {
      if (t_.errors.size() < 5) t_.errors.emplace_back(std::string("pool stats: ") + e.what());
    }
    const std::filesystem::path pool_file = pool_.path();
    pool_.detach();
    std::error_code ec;
    const bool pool_removed = !std::filesystem::exists(pool_file, ec);
    const double seconds = seconds_since_start();
    nlohmann::json r = report(mine, tenants_now, pool_removed, pool_file, seconds);
    return outcome(std::move(r), !graceful, stopped_early, seconds);
  }

 private:
  [[nodiscard]] double seconds_since_start() const {
    return std::chrono::duration<double>(Clock::now() - started_).count();
  }
  [[nodiscard]] bool run_over() const {
    return interrupted() ||
           (config_.duration_seconds > 0 && seconds_since_start() >= config_.duration_seconds);
  }

  // Records the other tenants seen (named on stderr while lingering); returns how many of those
  // that joined while this run lingered are still attached.
  std::size_t note_tenants() {
    const pool::PoolStats s = pool_.stats();
    most_tenants_ = std::max<std::uint32_t>(most_tenants_, s.tenants.size());
    std::size_t still_here = 0;
    for (const auto& t : s.tenants) {
      if (t.engine_id == config_.engine_id) continue;
      if (peers_.insert(t.engine_id).second && lingering_) {
        joined_meanwhile_.insert(t.engine_id);
        (void)std::fprintf(stderr, "kvoffload run: engine %s (PID %d) joined pool %s\n",
                           t.engine_id.c_str(), static_cast<int>(t.pid), config_.pool.c_str());
        (void)std::fflush(stderr);
      }
      if (joined_meanwhile_.count(t.engine_id) != 0) ++still_here;
    }
    return still_here;
  }

  // One request: one lookup_and_prepare, the load of the pinned prefix and the stores on every
  // rank, then unpin and commit (or abort when a rank's store failed).
  void serve_one(const std::vector<BlockKey>& keys, std::mt19937_64& rng) {
    ++t_.requests;
    t_.looked_up += keys.size();
    const pool::NodePool::Cycle cycle = pool_.lookup_and_prepare(keys, /*pin=*/true);
    const std::size_t hit = cycle.lookup.hits;
    t_.hits += hit;
    t_.cross_hits += cycle.lookup.cross_engine_hits;
    load_slots_.assign(cycle.lookup.slots.begin(), cycle.lookup.slots.end());
    store_slots_.assign(cycle.store.slots.begin(), cycle.store.slots.end());
    store_keys_.clear();
    for (const std::uint32_t p : cycle.store.positions) store_keys_.push_back(keys[p]);
    t_.skipped_present += cycle.store.skipped_present;
    t_.skipped_writing += cycle.store.skipped_writing;
    if (cycle.store.skipped_no_room + cycle.store.skipped_cap > 0) ++t_.cannot_store;
    if (hit == 0 && store_keys_.empty()) return;

    const std::uint32_t bpc = config_.blocks_per_chunk;
    const std::size_t blocks_needed = (hit + store_keys_.size()) * bpc;
    for (std::size_t i = 0; i < blocks_needed; ++i) {
      std::uniform_int_distribution<std::size_t> pick(i, device_blocks_.size() - 1);
      std::swap(device_blocks_[i], device_blocks_[pick(rng)]);
    }
    const std::span<const std::uint64_t> all_blocks(device_blocks_);
    nlohmann::json request{{"op", "request"}, {"id", t_.requests}};
    if (hit > 0) {
      request["load"] =
          job(next_job_++, load_slots_, all_blocks.first(hit * bpc), std::span(keys).first(hit));
    }
    if (!store_keys_.empty()) {
      request["store"] = job(next_job_++, store_slots_,
                             all_blocks.subspan(hit * bpc, store_keys_.size() * bpc), store_keys_);
    }
    const auto [load_ok, store_ok] = run_on_ranks(request);
    if (!first_request_seconds_) first_request_seconds_ = seconds_since_start();
    if (hit > 0) {
      pool_.unpin(load_slots_);
      if (!load_ok) ++t_.failed_jobs;
    }
    if (!store_keys_.empty()) {
      // A store that failed on any rank is not stored at all: its slots go back to free.
      if (store_ok) {
        pool_.commit_stores(store_slots_);
      } else {
        pool_.abort_stores(store_slots_);
        ++t_.failed_jobs;
      }
    }
  }

  // Sends the request to every rank and adds up their replies; {load ok, store ok}.
  std::pair<bool, bool> run_on_ranks(const nlohmann::json& request) {
    bool load_ok = true, store_ok = true;
    double ls = 0, ss = 0;
    for (std::uint32_t r = 0; r < config_.world_size; ++r) send_to(ranks_[r], r, request);
    for (std::uint32_t r = 0; r < config_.world_size; ++r) {
      const nlohmann::json done = receive_from(ranks_[r], r, std::chrono::seconds(300));
      if (done.contains("load")) {
        const auto& l = done["load"];
        if (!l.at("success").get<bool>() && t_.errors.size() < 5)
          t_.errors.push_back("rank " + std::to_string(r) + " load: " + l.value("error", ""));
        load_ok = load_ok && l.at("success").get<bool>() &&
                  l.at("mismatched_bytes").get<std::uint64_t>() == 0;
        t_.load_bytes += l.at("bytes").get<std::uint64_t>();
        t_.verified += l.at("verified_bytes").get<std::uint64_t>();
        t_.mismatched += l.at("mismatched_bytes").get<std::uint64_t>();
        ls = std::max(ls, l.at("seconds").get<double>());
      }
      if (done.contains("store")) {
        const auto& st = done["store"];
        if (!st.at("success").get<bool>() && t_.errors.size() < 5)
          t_.errors.push_back("rank " + std::to_string(r) + " store: " + st.value("error", ""));
        store_ok = store_ok && st.at("success").get<bool>();
        t_.store_bytes += st.at("bytes").get<std::uint64_t>();
        ss = std::max(ss, st.at("seconds").get<double>());
      }
    }
    t_.load_s += ls;
    t_.store_s += ss;
    return {load_ok, store_ok};
  }

  [[nodiscard]] bool all_verified() const {
    return t_.mismatched == 0 && t_.failed_jobs == 0 && t_.verified == t_.load_bytes;
  }

  nlohmann::json report(const pool::TenantStats& mine, std::uint64_t tenants_now, bool pool_removed,
                        const std::filesystem::path& pool_file, double seconds) const {
    auto gbps = [](std::uint64_t b, double s) { return s > 0 ? b / s / 1e9 : 0.0; };
    const double hit_rate = t_.looked_up ? double(t_.hits) / double(t_.looked_up) : 0.0;
    std::uint64_t registered = 0;
    for (const auto& b : byes_) registered += b.value("registered_bytes", std::uint64_t{0});
    nlohmann::json report = geometry_report(config_, rank_reports_);
    report.update(nlohmann::json{{"ready_chunks", config_.num_chunks},
                                 {"region_path", pool_file.string()},
                                 {"requests", t_.requests},
                                 {"chunks_looked_up", t_.looked_up},
                                 {"hits", t_.hits},
                                 {"cross_engine_hits", t_.cross_hits},
                                 {"misses", t_.looked_up - t_.hits},
                                 {"hit_rate", hit_rate},
                                 {"evictions", mine.evictions},
                                 {"cannot_store", t_.cannot_store},
                                 {"promoted", 0},
                                 {"promoted_from", nlohmann::json::object()},
                                 {"tier_offloads", 0},
                                 {"store_bytes", t_.store_bytes},
                                 {"load_bytes", t_.load_bytes},
                                 {"store_gbps", gbps(t_.store_bytes, t_.store_s)},
                                 {"load_gbps", gbps(t_.load_bytes, t_.load_s)},
                                 {"verified_bytes", t_.verified},
                                 {"mismatched_bytes", t_.mismatched},
                                 {"failed_jobs", t_.failed_jobs},
                                 {"all_verified", all_verified()},
                                 {"populate", {{"method", "pool"}, {"bytes", 0}, {"seconds", 0.0}}},
                                 {"ranks", rank_reports_},
                                 {"interrupted", interrupted()},
                                 {"region_removed", pool_removed},
                                 {"errors", t_.errors},
                                 {"seconds", seconds}});
    double registration = 0;
    for (const auto& r : rank_reports_)
      registration = std::max(registration, r.value("registration_seconds", 0.0));
    report["registration_seconds"] = registration;
    report["bringup"] = "blocking";
    report["bringup_piece_bytes"] = config_.bringup_piece_bytes;
    report["wait_for_tiers"] = false;
    report["first_request_seconds"] =
        first_request_seconds_ ? nlohmann::json(*first_request_seconds_) : nlohmann::json();
    report["pool_ready_seconds"] =
        ready_seconds_ ? nlohmann::json(*ready_seconds_) : nlohmann::json();
    report["paced_seconds"] = 0.0;
    const nlohmann::json phase{{"requests", t_.requests},
                               {"chunks_looked_up", t_.looked_up},
                               {"hits", t_.hits},
                               {"hit_rate", hit_rate},
                               {"cannot_store", t_.cannot_store}};
    report["phases"] = {{"coming_up",
                         {{"requests", 0},
                          {"chunks_looked_up", 0},
                          {"hits", 0},
                          {"hit_rate", 0.0},
                          {"cannot_store", 0}}},
                        {"ready", phase}};
    report["registration_longest_piece_seconds"] = registration;
    report["rank_bringup"] = byes_;
    report["registered_bytes"] = registered;
    report["pool"] = {{"name", config_.pool},
                      {"path", pool_file.string()},
                      {"policy", config_.pool_policy},
                      {"cap_slots", mine.cap_slots},
                      {"tenant_index", mine.index},
                      {"tenants_at_end", tenants_now},
                      {"most_tenants", most_tenants_},
                      {"peers_seen", std::vector<std::string>(peers_.begin(), peers_.end())},
                      {"cross_engine_hits", t_.cross_hits},
                      {"stores_committed", mine.stores_committed},
                      {"stores_aborted", mine.stores_aborted},
                      {"skipped_present", t_.skipped_present},
                      {"skipped_writing", t_.skipped_writing},
                      {"removed", pool_removed},
                      // Note [Pool layout]: the chunk bytes, and the range each rank registers.
                      {"chunk_area_bytes", config_.pool_rank_stride * config_.world_size},
                      {"rank_range_bytes", config_.pool_rank_stride}};
    report["tenants"] = most_tenants_;
    return report;
  }

  [[nodiscard]] RunOutcome outcome(nlohmann::json report, bool stopped,
                                   const std::string& stopped_early, double seconds) const {
    RunOutcome outcome{std::move(report), 0, {}, false};
    if (stopped) {
      outcome.exit_code = 1;
      char after[64];
      (void)std::snprintf(after, sizeof after, "stopped after %.1f s and %llu requests: ", seconds,
                          static_cast<unsigned long long>(t_.requests));
      outcome.failure = after + stopped_early;
      outcome.verdict_only = t_.requests == 0;
    } else if (interrupted()) {
      outcome.exit_code = 130;
    } else if (!all_verified()) {
      outcome.exit_code = 1;
      std::string why = "failed: ";
      if (t_.mismatched != 0) {
        why += std::to_string(t_.mismatched) + " bytes loaded back did not match what was stored";
      } else if (t_.failed_jobs != 0) {
        why += std::to_string(t_.failed_jobs) + " transfer jobs failed";
      } else {
        why += "not every loaded byte was verified";
      }
      if (!t_.errors.empty()) why += " (first error: " + t_.errors.front() + ")";
      outcome.failure = why;
    }
    return outcome;
  }

  RunConfig& config_;
  pool::NodePool& pool_;
  Clock::time_point started_;
  PoolRunTotals t_;
  std::set<std::string> peers_;  // other engines seen attached
  std::uint32_t most_tenants_ = 1;
  bool lingering_ = false;  // then each engine seen joining is said on stderr
  // Engines seen joining while this run lingered: once they have all left, so does this run.
  std::set<std::string> joined_meanwhile_;
  std::optional<double> ready_seconds_, first_request_seconds_;
  std::vector<RankProcess> ranks_;
  nlohmann::json rank_reports_ = nlohmann::json::array();
  nlohmann::json byes_ = nlohmann::json::array();
  std::vector<std::uint64_t> device_blocks_;
  std::vector<std::uint32_t> load_slots_, store_slots_;
  std::vector<BlockKey> store_keys_;
  std::uint64_t next_job_ = 1;
};

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
  // Each rank maps only its own range of the rank-major pool (Note [Pool layout]).
  const pool::RankRange rank0 = pool.rank_range(0);
  config.pool_slot_stride = rank0.slot_stride;
  config.pool_rank_stride = rank0.bytes;
  config.pool_data_offset = rank0.file_offset;
  PoolRun run(config, pool, started);
  bool graceful = true;
  std::string stopped_early;
  std::exception_ptr failure;
  try {
    run.start_ranks();
    run.serve();
    run.linger();
  } catch (const std::exception& e) {
    graceful = false;
    stopped_early = e.what();
    failure = std::current_exception();
  }
  return run.finish(graceful, stopped_early, failure);
}

}  // namespace kvoffload::run
