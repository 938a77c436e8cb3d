// The scheduler of `kvoffload run` (scheduler.hpp): the offload stack, the ranks' start, the paced
// load generator and the report's figures. Over 500 lines for one reason: run_scheduler is one
// sequence (start, serve, stop, report) whose steps share its locals; the rank processes
// (ranks.cpp), the signals (interrupt.cpp) and the text report (report.cpp) are apart.
#include "scheduler.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/geometry.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/platform.hpp>

#include "../cli.hpp"
#include "channel.hpp"
#include "interrupt.hpp"
#include "progress.hpp"
#include "ranks.hpp"
#include "util/log.hpp"
#include "workload.hpp"

namespace kvoffload::run {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json keys_json(std::span<const BlockKey> keys) {
  nlohmann::json out = nlohmann::json::array();
  for (const BlockKey& k : keys) out.push_back({k.hi(), k.lo()});
  return out;
}

template <typename Slots>
nlohmann::json job_json(std::uint64_t job, const Slots& slots,
                        std::span<const std::uint64_t> blocks, std::span<const BlockKey> keys) {
  nlohmann::json chunks = nlohmann::json::array();
  for (auto s : slots) chunks.push_back(static_cast<std::uint64_t>(s));
  return {{"job", job}, {"chunks", chunks}, {"blocks", blocks}, {"keys", keys_json(keys)}};
}

// Note [Run phases]: in background bring-up the scheduler starts before any row is ready on
// every rank. A request then can neither hit nor store, and the loop would replay thousands of
// such empty requests in a fraction of a second (an engine's requests come at the pace of its
// compute, not of an empty loop), so the figures would measure nothing. So the load generator is
// paced: it waits (paced_seconds) until the rows ready on every rank can hold one request, and
// then serves while the rest of the pool comes up. The report keeps the requests served while the
// pool was coming up apart from those served once it was ready on every rank.
// Note [Run stopped early]: a rank can die under the run (SIGKILL, the OOM killer, a crash). The
// scheduler learns it from the rank's channel (EOF or ECONNRESET on the next receive or send),
// stops the other ranks, reaps them all, and names the lost rank with its PID and what its wait
// status says (killed by signal N, exited with status N). The run then reports what it measured
// up to that point, as text and as the --json report with an `error` member, and exits 1.
struct Phase {
  std::uint64_t requests = 0, chunks_looked_up = 0, hits = 0, cannot_store = 0;

  [[nodiscard]] double hit_rate() const {
    return chunks_looked_up != 0 ? double(hits) / double(chunks_looked_up) : 0.0;
  }
  [[nodiscard]] nlohmann::json to_json() const {
    return {{"requests", requests},
            {"chunks_looked_up", chunks_looked_up},
            {"hits", hits},
            {"hit_rate", hit_rate()},
            {"cannot_store", cannot_store}};
  }
};

struct Totals {
  std::uint64_t requests = 0, chunks_looked_up = 0, hits = 0, promoted = 0;
  std::uint64_t store_bytes = 0, load_bytes = 0;
  double store_seconds = 0, load_seconds = 0;  // per job: the slowest rank's copy time
  std::uint64_t verified_bytes = 0, mismatched_bytes = 0, failed_jobs = 0, cannot_store = 0;
  Phase coming_up, ready;           // Note [Run phases]
  double paced_seconds = 0;         // the load generator waited for room for one request
  std::vector<std::string> errors;  // first few failure messages

  void note_error(const std::string& e) {
    if (errors.size() < 5) errors.push_back(e);
  }
};

double gbps(std::uint64_t bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0.0;
}

bool ended_short(const RankBringup& b, std::uint64_t need) {
  return (b.state == BringupState::kFailed || b.state == BringupState::kStopped) &&
         b.ready_chunks < need;
}

// Why the pool will never hold one request: the ranks whose bring-up ended short of it, each with
// the error its "bye" reported (or the errno the region's readiness table kept), in one line.
std::string never_serves_verdict(std::uint32_t world_size, const nlohmann::json& byes,
                                 const Region& region, std::uint64_t need) {
  std::vector<std::uint32_t> ended;
  for (std::uint32_t r = 0; r < world_size; ++r) {
    if (ended_short(region.rank_bringup(r), need)) ended.push_back(r);
  }
  std::vector<std::string> why;
  for (const std::uint32_t r : ended) {
    std::string error;
    for (const auto& b : byes) {
      if (b.value("rank", world_size) == r && b.contains("bringup")) {
        error = b["bringup"].value("error", std::string());
      }
    }
    const RankBringup state = region.rank_bringup(r);
    if (error.empty()) {
      error = std::string(to_string(state.state)) +
              (state.sys_errno != 0 ? " (" + errno_name(state.sys_errno) + ")" : std::string());
    }
    for (char& c : error) {
      if (c == '\n') c = ' ';  // one line
    }
    why.push_back("rank " + std::to_string(r) + " after " + std::to_string(state.ready_chunks) +
                  " ready chunks: " + error);
  }
  std::string ranks;
  for (std::size_t i = 0; i < ended.size(); ++i) {
    ranks += (i == 0 ? "" : ", ") + std::to_string(ended[i]);
  }
  std::string out =
      "bring-up failed on " +
      (ended.size() == world_size && world_size > 1 ? std::string("every rank") : "rank " + ranks) +
      " before the pool could hold one request (" + std::to_string(need) +
      " chunks), so no request was served and nothing was stored, loaded or "
      "verified (";
  for (std::size_t i = 0; i < why.size(); ++i) out += (i == 0 ? "" : "; ") + why[i];
  return out + ")";
}

// The run's populate figure. Blocking: the scheduler's own mapping populated before the ranks
// started. Background: the scheduler populates nothing (Note [Progressive bring-up]) and each rank
// populates its columns piece by piece after its "ready", so the figure is the ranks' from their
// "bye": the method, the bytes of all ranks, the longest rank's seconds.
nlohmann::json populate_figure(bool background, const PopulateReport& scheduler,
                               const nlohmann::json& byes) {
  if (!background) {
    return {{"method", std::string(to_string(scheduler.method))},
            {"bytes", scheduler.bytes},
            {"seconds", scheduler.seconds}};
  }
  std::string method = std::string(to_string(PopulateMethod::kNone));
  std::uint64_t bytes = 0;
  double seconds = 0;
  for (const auto& b : byes) {
    if (!b.contains("populate")) continue;
    const auto& p = b["populate"];
    if (method == to_string(PopulateMethod::kNone)) method = p.value("method", method);
    bytes += p.value("bytes", std::uint64_t{0});
    seconds = std::max(seconds, p.value("seconds", 0.0));
  }
  return {{"method", method}, {"bytes", bytes}, {"seconds", seconds}};
}

// The longest rank's registration: of the whole region before its "ready" (blocking), or of its
// pieces as they came up (background, from its "bye").
double registration_figure(bool background, const nlohmann::json& ready,
                           const nlohmann::json& byes) {
  double longest = 0;
  if (!background) {
    for (const auto& r : ready) longest = std::max(longest, r.value("registration_seconds", 0.0));
    return longest;
  }
  for (const auto& b : byes) {
    if (b.contains("registration")) {
      longest = std::max(longest, b["registration"].value("seconds", 0.0));
    }
  }
  return longest;
}

}  // namespace

RunOutcome run_scheduler(const RunConfig& config) {
  if (!config.pool.empty()) return run_pool_scheduler(config);
  const InterruptGuard interrupt_guard;  // and a new run starts uninterrupted
  const auto started = Clock::now();

  StackConfig stack_config;
  stack_config.region.engine_id = config.engine_id;
  stack_config.region.layout = {.num_chunks = config.num_chunks,
                                .slot_bytes = config.slot_bytes,
                                .world_size = config.world_size};
  if (!config.shm_dir.empty()) stack_config.region.shm_dir = config.shm_dir;
  stack_config.region.populate_threads = config.populate_threads;
  const BringupMode bringup = parse_bringup_mode(config.bringup);
  const bool background = bringup == BringupMode::kBackground;
  // Note [Progressive bring-up]: in background mode the scheduler's unranked mapping populates
  // nothing and its Manager starts with no ready slot; the loop below grows the ready prefix to
  // the rows every rank has made ready.
  stack_config.region.bringup = bringup;
  if (background) stack_config.manager.ready_chunks = 0;
  stack_config.manager.num_chunks = config.num_chunks;
  stack_config.manager.policy = PolicyKind::kArc;
  stack_config.manager.record_events = false;
  if (!config.file_tier.empty()) {
    FileTierOptions tier;
    tier.root = config.file_tier;
    tier.capacity_bytes = config.file_tier_bytes;
    stack_config.file_tiers.push_back(tier);
  }
  if (!config.remote_tier.empty()) {
    RemoteTierOptions remote;
    remote.url = RemoteUrl::parse(config.remote_tier);
    remote.lookup_timeout = std::chrono::milliseconds(config.remote_lookup_budget_ms);
    if (config.memcached_item_bytes != 0) remote.memcached_item_max = config.memcached_item_bytes;
    remote.geometry = {
        .slot_bytes = config.slot_bytes,
        .world_size = config.world_size,
        .tensor_layout = "kvoffload-run layers=" + std::to_string(config.layers),
        .block_bytes = config.block_bytes,
        .blocks_per_chunk = config.blocks_per_chunk,
        .dtype = "u8",
        .slot_stride = RegionGeometry::compute(stack_config.region.layout, platform::page_size())
                           .slot_stride()};
    stack_config.remote_tiers.push_back(remote);
  }
  std::unique_ptr<OffloadStack> stack = OffloadStack::build(stack_config);
  const std::filesystem::path region_path = stack->region().path();
  const PopulateReport scheduler_populate = stack->region().populate_report();

  std::vector<RankProcess> ranks;
  Totals t;
  std::optional<double> first_request_seconds;  // until the first request was served
  std::optional<double> pool_ready_seconds;     // until every row was ready on every rank
  // A rank's bring-up ended before the pool could hold one request (Note [Run phases]).
  bool never_serves = false;
  nlohmann::json byes = nlohmann::json::array();
  nlohmann::json rank_reports = nlohmann::json::array();
  bool graceful = true;
  std::string stopped_early;  // why the run ended before its end (a rank died, a failure)
  std::exception_ptr failure;
  const std::uint64_t need = config.max_request_chunks();
  try {
    ranks = spawn_ranks(config.world_size);
    for (std::uint32_t r = 0; r < config.world_size; ++r) {
      send_to(ranks[r], r, {{"op", "config"}, {"rank", r}, {"config", config}});
    }
    for (std::uint32_t r = 0; r < config.world_size; ++r) {
      rank_reports.push_back(receive_from(ranks[r], r, std::chrono::seconds(120)));
    }

    Manager& manager = stack->manager();
    TieredStore& store = stack->store();
    const Region& region = stack->region();
    // Grows the Manager's ready prefix; records when every row is ready on every rank. Never
    // blocks (one read of the readiness table per request).
    auto track_readiness = [&] {
      if (pool_ready_seconds) return;
      const std::uint64_t ready = region.chunks_ready_on_all_ranks();
      if (background && ready > manager.ready_chunks()) manager.set_ready_chunks(ready);
      if (ready == config.num_chunks) {
        pool_ready_seconds = std::chrono::duration<double>(Clock::now() - started).count();
      }
    };
    auto run_over = [&] {
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      return interrupted() || (config.duration_seconds > 0 && elapsed >= config.duration_seconds);
    };
    // Note [Run phases]: waits until the rows ready on every rank can hold one request. False
    // when the run is over first, or when a rank's bring-up ended short of it (never_serves):
    // then the other ranks get a moment to end or pass one request too, so that the verdict
    // names every rank that failed, not only the first.
    auto wait_for_room = [&]() -> bool {
      const auto begin = Clock::now();
      const auto limit = begin + std::chrono::seconds(600);
      std::optional<Clock::time_point> settle_by;
      bool room = false;
      while (true) {
        track_readiness();
        if (pool_ready_seconds || manager.ready_chunks() >= need) {
          room = true;
          break;
        }
        if (run_over()) break;
        bool any_ended = false;
        bool all_settled = true;
        for (std::uint32_t r = 0; r < config.world_size; ++r) {
          const RankBringup b = region.rank_bringup(r);
          any_ended = any_ended || ended_short(b, need);
          const bool ended = b.state == BringupState::kFailed || b.state == BringupState::kStopped;
          all_settled = all_settled && (ended || b.ready_chunks >= need);
          // A rank that exited says so on its channel (EOF): receive_from names it.
          pollfd p{ranks[r].channel->fd(), POLLIN, 0};
          if (::poll(&p, 1, 0) > 0) (void)receive_from(ranks[r], r, std::chrono::seconds(1));
        }
        if (any_ended) {
          if (!settle_by) settle_by = Clock::now() + std::chrono::seconds(2);
          if (all_settled || Clock::now() >= *settle_by) {
            never_serves = true;
            break;
          }
        }
        if (Clock::now() >= limit) {
          throw Error(ErrorCode::kTimeout,
                      "the pool could not hold one request (" + std::to_string(need) +
                          " chunks) on every rank after 600 s of bring-up; the ranks' bring-up "
                          "is in rank_bringup of a --json run");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      t.paced_seconds += std::chrono::duration<double>(Clock::now() - begin).count();
      return room;
    };
    Workload workload(config.seed, config.prefixes, config.prefix_chunks, config.unique_chunks);
    std::mt19937_64 rng(config.seed * 7919 + 1);
    std::vector<std::uint64_t> device_blocks(config.gpu_blocks);
    std::iota(device_blocks.begin(), device_blocks.end(), 0);
    std::vector<SlotIndex> load_slots;
    std::vector<BlockKey> store_keys;
    std::vector<SlotIndex> store_slots;
    std::uint64_t next_job = 1;
    Progress progress(config.duration_seconds, config.requests);
    const std::uint32_t bpc = config.blocks_per_chunk;

    while (!interrupted()) {
      if (config.requests != 0 && t.requests >= config.requests) break;
      if (run_over()) break;

      track_readiness();
      if (!pool_ready_seconds && manager.ready_chunks() < need && !wait_for_room()) break;
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      Phase& phase = pool_ready_seconds ? t.ready : t.coming_up;
      const std::vector<BlockKey>& keys = workload.next();
      ++t.requests;
      ++phase.requests;
      t.chunks_looked_up += keys.size();
      phase.chunks_looked_up += keys.size();

      // Bring back what a secondary tier holds beyond the primary prefix, then look again.
      // A remote tier answers "pending" while its existence check is in flight: this loop asks
      // again, and it ends because the tier turns a pending answer into a miss once its lookup
      // budget is spent (never a stall). An engine would schedule other work meanwhile.
      TieredLookup found = store.lookup(keys);
      const auto give_up = Clock::now() +
                           2 * std::chrono::milliseconds(config.remote_lookup_budget_ms) +
                           std::chrono::seconds(1);  // a safety net: the tier ends it first
      while (found.pending > 0 && Clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        found = store.lookup(keys);
      }
      manager.touch(keys);
      if (found.available_prefix > found.primary_prefix) {
        const auto missing = std::span(keys).subspan(found.primary_prefix,
                                                     found.available_prefix - found.primary_prefix);
        const PromoteTicket ticket =
            store.promote(missing, std::span(keys).first(found.primary_prefix));
        if (ticket.id != 0) {
          for (const PromoteCompletion& c : store.drain()) t.promoted += c.promoted.size();
        }
      }
      std::size_t hit = 0;
      while (hit < keys.size() && manager.state_of(keys[hit]) == LookupResult::kHit) ++hit;
      t.hits += hit;
      phase.hits += hit;

      // Distinct device blocks for this request: the load's first, then the store's.
      // A partial Fisher-Yates shuffle: any permutation stays one, so no reset per request.
      const std::size_t blocks_needed = keys.size() * bpc;
      for (std::size_t i = 0; i < blocks_needed; ++i) {
        std::uniform_int_distribution<std::size_t> pick(i, device_blocks.size() - 1);
        std::swap(device_blocks[i], device_blocks[pick(rng)]);
      }
      const std::span<const std::uint64_t> all_blocks(device_blocks);

      nlohmann::json request{{"op", "request"}, {"id", t.requests}};
      const auto hit_keys = std::span(keys).first(hit);
      if (hit > 0) {
        const auto slots = manager.prepare_load(hit_keys);
        load_slots.assign(slots.begin(), slots.end());
        request["load"] = job_json(next_job++, load_slots, all_blocks.first(hit * bpc), hit_keys);
      }
      const StorePlan plan = manager.prepare_store(std::span(keys).subspan(hit), hit_keys);
      store_keys.assign(plan.keys.begin(), plan.keys.end());
      store_slots.assign(plan.slots.begin(), plan.slots.end());
      if (!plan.ok()) {
        ++t.cannot_store;
        ++phase.cannot_store;
      }
      if (!store_keys.empty()) {
        request["store"] =
            job_json(next_job++, store_slots,
                     all_blocks.subspan(hit * bpc, store_keys.size() * bpc), store_keys);
      }
      if (!request.contains("load") && !request.contains("store")) {
        // Served without the offload tier (nothing to load, no room to store).
        if (!first_request_seconds) {
          first_request_seconds = std::chrono::duration<double>(Clock::now() - started).count();
        }
        continue;
      }

      for (std::uint32_t r = 0; r < config.world_size; ++r) send_to(ranks[r], r, request);
      bool load_ok = true;
      bool store_ok = true;
      double load_s = 0, store_s = 0;
      for (std::uint32_t r = 0; r < config.world_size; ++r) {
        const nlohmann::json done = receive_from(ranks[r], r, std::chrono::seconds(300));
        if (done.contains("load")) {
          const auto& l = done["load"];
          const bool ok =
              l.at("success").get<bool>() && l.at("mismatched_bytes").get<std::uint64_t>() == 0;
          if (!l.at("success").get<bool>())
            t.note_error("rank " + std::to_string(r) + " load: " + l.value("error", ""));
          load_ok = load_ok && ok;
          t.load_bytes += l.at("bytes").get<std::uint64_t>();
          t.verified_bytes += l.at("verified_bytes").get<std::uint64_t>();
          t.mismatched_bytes += l.at("mismatched_bytes").get<std::uint64_t>();
          load_s = std::max(load_s, l.at("seconds").get<double>());
        }
        if (done.contains("store")) {
          const auto& s = done["store"];
          const bool ok = s.at("success").get<bool>();
          if (!ok) t.note_error("rank " + std::to_string(r) + " store: " + s.value("error", ""));
          store_ok = store_ok && ok;
          t.store_bytes += s.at("bytes").get<std::uint64_t>();
          store_s = std::max(store_s, s.at("seconds").get<double>());
        }
      }
      t.load_seconds += load_s;
      t.store_seconds += store_s;
      if (!first_request_seconds) {
        first_request_seconds = std::chrono::duration<double>(Clock::now() - started).count();
      }
      if (hit > 0) {
        manager.complete_load(hit_keys);
        if (!load_ok) ++t.failed_jobs;
      }
      if (!store_keys.empty()) {
        // A store that failed on any rank is not stored at all: its slots are freed.
        store.complete_store(store_keys, store_ok);
        if (!store_ok) ++t.failed_jobs;
      }
      // --wait-for-tiers (RunConfig::wait_for_tiers) finishes the tiers' writes, releasing their
      // offload pins, before the next request looks anything up: what is evicted next, and so
      // what is promoted later, no longer depends on how fast the tiers write.
      if (config.wait_for_tiers) {
        (void)store.drain();
      } else {
        (void)store.poll();
      }
      const ManagerStats ms = manager.stats();
      progress.update(t.requests, elapsed,
                      t.chunks_looked_up ? double(t.hits) / double(t.chunks_looked_up) : 0.0,
                      gbps(t.store_bytes, t.store_seconds), gbps(t.load_bytes, t.load_seconds),
                      ms.evictions);
    }
    progress.finish();
    (void)store.drain();
    // The bring-up may outlast the requests: wait for it here (no request waits on it), so that
    // pool_ready_seconds is always measured. A rank whose bring-up failed or stopped ends the wait.
    const auto wait_until = Clock::now() + std::chrono::seconds(600);
    while (!never_serves && !pool_ready_seconds && !interrupted()) {
      track_readiness();
      if (pool_ready_seconds) break;
      bool ended = false;
      for (std::uint32_t r = 0; r < config.world_size; ++r) {
        const RankBringup b = region.rank_bringup(r);
        if (b.state == BringupState::kFailed || b.state == BringupState::kStopped) {
          t.note_error("rank " + std::to_string(r) + " bring-up " +
                       std::string(to_string(b.state)) + " after " +
                       std::to_string(b.ready_chunks) + " of " + std::to_string(config.num_chunks) +
                       " chunks" +
                       (b.sys_errno != 0 ? " (" + errno_name(b.sys_errno) + ")" : std::string()) +
                       "; its log has the error");
          ended = true;
        }
      }
      if (ended) break;
      if (Clock::now() >= wait_until) {
        t.note_error("the pool was not ready on every rank after 600 s");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  } catch (const std::exception& e) {
    // A rank died (SIGKILL, a crash) or the scheduler failed mid-run: stop the others, then
    // report what was measured until then with the cause (Note [Run stopped early]).
    graceful = false;
    stopped_early = e.what();
    failure = std::current_exception();
  }

  stop_ranks(ranks, graceful, &byes);
  if (!stopped_early.empty()) {
    // Note [Run stopped early]: the channel error ("closed its channel", ECONNRESET) says only
    // that a rank is gone; its wait status says which rank, which PID and how it ended.
    const std::string lost = describe_lost_ranks(ranks);
    if (lost.empty() && t.requests == 0) {
      // A start-up failure (a rank could not start: a bad device, a backend missing) before
      // anything was measured: the error alone, with its own code, as before.
      stack->close();
      std::rethrow_exception(failure);
    }
    if (!lost.empty()) stopped_early = lost + " (the scheduler saw: " + stopped_early + ")";
  }
  const std::string never_ready_verdict =
      never_serves ? never_serves_verdict(config.world_size, byes, stack->region(), need)
                   : std::string();
  const ManagerStats ms = stack->manager().stats();
  const TieredStats ts = stack->store().stats();
  nlohmann::json remote_json;
  std::string remote_refused;  // the store refused the credentials during the run
  nlohmann::json promoted_from = nlohmann::json::object();
  for (const auto& tier : stack->tiers()) {
    // In this run a tier's gets are its promotions (nothing else reads the tiers).
    promoted_from[tier->name()] = tier->stats().gets_ok;
    if (const auto* remote = dynamic_cast<const RemoteTier*>(tier.get())) {
      const RemoteStats rs = remote->remote_stats();
      if (rs.auth_failures > 0) {
        remote_refused = "the remote tier's store refused the credentials " +
                         std::to_string(rs.auth_failures) +
                         " time(s); first: " + remote->first_auth_failure();
      }
      remote_json = {{"url", remote->options().url.to_string()},
                     {"promoted", rs.loaded},
                     {"stored", rs.stored},
                     {"misses", rs.misses()},
                     {"corrupt", rs.corrupt},
                     {"errors", rs.errors()},
                     {"lookups", rs.lookups},
                     {"lookup_present", rs.lookup_present},
                     {"lookup_absent", rs.lookup_absent},
                     {"lookup_timeouts", rs.lookup_timeouts},
                     {"lookup_errors", rs.lookup_errors},
                     {"get_misses", rs.get_misses},
                     {"get_errors", rs.get_errors},
                     {"put_errors", rs.put_errors},
                     {"breaker_opens", rs.breaker_opens},
                     {"lookup_budget_ms", config.remote_lookup_budget_ms},
                     {"nodes", rs.nodes},
                     {"nodes_open", rs.nodes_open},
                     {"auth_failures", rs.auth_failures}};
    }
  }
  const bool closed = stack->close();
  stack.reset();
  std::error_code ec;
  const bool region_removed = !std::filesystem::exists(region_path, ec);

  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const bool all_verified =
      t.mismatched_bytes == 0 && t.failed_jobs == 0 && t.verified_bytes == t.load_bytes;
  nlohmann::json report = geometry_report(config, rank_reports);
  report.update(nlohmann::json{
      // The rows the scheduler could hand out by the end: those ready on every rank.
      {"ready_chunks", ms.ready_chunks},
      {"region_path", region_path.string()},
      {"requests", t.requests},
      {"chunks_looked_up", t.chunks_looked_up},
      {"hits", t.hits},
      {"misses", t.chunks_looked_up - t.hits},
      {"hit_rate", t.chunks_looked_up ? double(t.hits) / double(t.chunks_looked_up) : 0.0},
      {"evictions", ms.evictions},
      {"cannot_store", t.cannot_store},
      {"promoted", t.promoted},
      {"promoted_from", promoted_from},
      {"tier_offloads", ts.offload_ok},
      {"store_bytes", t.store_bytes},
      {"load_bytes", t.load_bytes},
      {"store_gbps", gbps(t.store_bytes, t.store_seconds)},
      {"load_gbps", gbps(t.load_bytes, t.load_seconds)},
      {"verified_bytes", t.verified_bytes},
      {"mismatched_bytes", t.mismatched_bytes},
      {"failed_jobs", t.failed_jobs},
      {"all_verified", all_verified},
      {"populate", populate_figure(background, scheduler_populate, byes)},
      {"ranks", rank_reports},
      {"interrupted", interrupted()},
      {"region_removed", region_removed && closed},
      {"errors", t.errors},
      {"seconds", seconds}});
  report["registration_seconds"] = registration_figure(background, rank_reports, byes);
  if (!remote_json.is_null()) report["remote"] = remote_json;
  report["bringup"] = config.bringup;
  report["bringup_piece_bytes"] = config.bringup_piece_bytes;
  report["wait_for_tiers"] = config.wait_for_tiers;
  report["first_request_seconds"] =
      first_request_seconds ? nlohmann::json(*first_request_seconds) : nlohmann::json();
  report["pool_ready_seconds"] =
      pool_ready_seconds ? nlohmann::json(*pool_ready_seconds) : nlohmann::json();
  report["paced_seconds"] = t.paced_seconds;
  report["phases"] = {{"coming_up", t.coming_up.to_json()}, {"ready", t.ready.to_json()}};
  double longest_piece = 0;
  for (const auto& b : byes) {
    if (b.contains("registration")) {
      longest_piece =
          std::max(longest_piece, b["registration"].value("longest_piece_seconds", 0.0));
    }
  }
  report["registration_longest_piece_seconds"] = longest_piece;
  report["rank_bringup"] = byes;

  RunOutcome outcome{report, 0, {}, false};
  if (!stopped_early.empty()) {
    outcome.exit_code = 1;
    char after[64];
    (void)std::snprintf(after, sizeof after, "stopped after %.1f s and %llu requests: ", seconds,
                        static_cast<unsigned long long>(t.requests));
    outcome.failure = after + stopped_early;
    // Before the first request there is nothing measured to show: the line says it all.
    outcome.verdict_only = t.requests == 0;
  } else if (interrupted()) {
    outcome.exit_code = 130;
  } else if (!never_ready_verdict.empty()) {
    outcome.exit_code = 1;
    char after[48];
    (void)std::snprintf(after, sizeof after, "stopped after %.1f s: ", seconds);
    outcome.failure = after + never_ready_verdict;
    outcome.verdict_only = true;
  } else if (!remote_refused.empty()) {
    outcome.exit_code = 1;
    outcome.failure = "failed: " + remote_refused;
  } else if (!all_verified || !region_removed || !pool_ready_seconds) {
    outcome.exit_code = 1;
    std::vector<std::string> why;
    if (t.mismatched_bytes != 0)
      why.push_back(std::to_string(t.mismatched_bytes) +
                    " bytes loaded back did not match what was stored");
    if (t.failed_jobs != 0) why.push_back(std::to_string(t.failed_jobs) + " transfer jobs failed");
    if (t.verified_bytes != t.load_bytes && t.mismatched_bytes == 0 && t.failed_jobs == 0) {
      why.push_back("not every loaded byte was verified");
    }
    if (!pool_ready_seconds) why.push_back("the pool never became ready on every rank");
    if (!region_removed) why.push_back("the region " + region_path.string() + " was not removed");
    std::string message = "failed: ";
    for (std::size_t i = 0; i < why.size(); ++i) message += (i == 0 ? "" : "; ") + why[i];
    if (!t.errors.empty()) message += " (first error: " + t.errors.front() + ")";
    outcome.failure = message;
  }
  return outcome;
}

nlohmann::json geometry_report(const RunConfig& config, const nlohmann::json& rank_reports) {
  return {{"engine_id", config.engine_id},
          {"backend", rank_reports.empty() ? config.backend
                                           : rank_reports[0].value("backend", config.backend)},
          {"world_size", config.world_size},
          {"layers", config.layers},
          {"block_bytes", config.block_bytes},
          {"blocks_per_chunk", config.blocks_per_chunk},
          {"chunks", config.num_chunks},
          {"slot_bytes", config.slot_bytes},
          {"host_pool_bytes", config.host_pool_bytes}};
}

}  // namespace kvoffload::run
