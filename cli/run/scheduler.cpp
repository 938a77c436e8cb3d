// The scheduler of `kvoffload run` (scheduler.hpp): the offload stack, the ranks' start, the paced
// load generator and the report's figures. A run on a private region is one sequence (start,
// serve, stop, report) whose phases share its state: PrivateRun holds that state, one method per
// phase; the rank processes (ranks.cpp), the signals (interrupt.cpp) and the text report
// (report.cpp) are apart.
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

// The offload stack of a run on a private region: the region (background bring-up or blocking),
// an ARC Manager without events, and the file and remote tiers the options ask for.
StackConfig stack_config_for(const RunConfig& config, BringupMode bringup) {
  StackConfig stack_config;
  stack_config.region.engine_id = config.engine_id;
  stack_config.region.layout = {.num_chunks = config.num_chunks,
                                .slot_bytes = config.slot_bytes,
                                .world_size = config.world_size};
  if (!config.shm_dir.empty()) stack_config.region.shm_dir = config.shm_dir;
  stack_config.region.populate_threads = config.populate_threads;
  // Note [Progressive bring-up]: in background mode the scheduler's unranked mapping populates
  // nothing and its Manager starts with no ready slot; the loop below grows the ready prefix to
  // the rows every rank has made ready.
  stack_config.region.bringup = bringup;
  if (bringup == BringupMode::kBackground) stack_config.manager.ready_chunks = 0;
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
  return stack_config;
}

// The report's "remote" member: the remote tier's counters and the lookup budget it ran with.
nlohmann::json remote_json(const RemoteTier& remote, std::uint64_t lookup_budget_ms) {
  const RemoteStats rs = remote.remote_stats();
  return {{"url", remote.options().url.to_string()},
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
          {"lookup_budget_ms", lookup_budget_ms},
          {"nodes", rs.nodes},
          {"nodes_open", rs.nodes_open},
          {"auth_failures", rs.auth_failures}};
}

// What the secondary tiers did, read before the stack closes.
struct TierFigures {
  nlohmann::json remote;       // the remote tier's figures; null without one
  std::string remote_refused;  // the store refused the credentials during the run
  nlohmann::json promoted_from = nlohmann::json::object();
};

TierFigures tier_figures(const OffloadStack& stack, std::uint64_t lookup_budget_ms) {
  TierFigures out;
  for (const auto& tier : stack.tiers()) {
    // In this run a tier's gets are its promotions (nothing else reads the tiers).
    out.promoted_from[tier->name()] = tier->stats().gets_ok;
    if (const auto* remote = dynamic_cast<const RemoteTier*>(tier.get())) {
      const RemoteStats rs = remote->remote_stats();
      if (rs.auth_failures > 0) {
        out.remote_refused = "the remote tier's store refused the credentials " +
                             std::to_string(rs.auth_failures) +
                             " time(s); first: " + remote->first_auth_failure();
      }
      out.remote = remote_json(*remote, lookup_budget_ms);
    }
  }
  return out;
}

// The longest piece registration of any rank (background bring-up, from its "bye").
double longest_piece_figure(const nlohmann::json& byes) {
  double longest_piece = 0;
  for (const auto& b : byes) {
    if (b.contains("registration")) {
      longest_piece =
          std::max(longest_piece, b["registration"].value("longest_piece_seconds", 0.0));
    }
  }
  return longest_piece;
}

// The one-line failure of a run that served but did not verify everything, left its region
// behind, or never had the pool ready on every rank.
std::string unverified_failure(const Totals& t, bool ready, bool region_removed,
                               const std::filesystem::path& region_path) {
  std::vector<std::string> why;
  if (t.mismatched_bytes != 0)
    why.push_back(std::to_string(t.mismatched_bytes) +
                  " bytes loaded back did not match what was stored");
  if (t.failed_jobs != 0) why.push_back(std::to_string(t.failed_jobs) + " transfer jobs failed");
  if (t.verified_bytes != t.load_bytes && t.mismatched_bytes == 0 && t.failed_jobs == 0) {
    why.push_back("not every loaded byte was verified");
  }
  if (!ready) why.push_back("the pool never became ready on every rank");
  if (!region_removed) why.push_back("the region " + region_path.string() + " was not removed");
  std::string message = "failed: ";
  for (std::size_t i = 0; i < why.size(); ++i) message += (i == 0 ? "" : "; ") + why[i];
  if (!t.errors.empty()) message += " (first error: " + t.errors.front() + ")";
  return message;
}

// The paced load generator's state: the requests, the device blocks they use, the buffers reused
// from one request to the next, the progress line.
struct LoadGenerator {
  explicit LoadGenerator(const RunConfig& config)
      : workload(config.seed, config.prefixes, config.prefix_chunks, config.unique_chunks),
        rng(config.seed * 7919 + 1),
        device_blocks(config.gpu_blocks),
        progress(config.duration_seconds, config.requests) {
    std::iota(device_blocks.begin(), device_blocks.end(), 0);
  }

  Workload workload;
  std::mt19937_64 rng;
  std::vector<std::uint64_t> device_blocks;
  std::vector<SlotIndex> load_slots;
  std::vector<BlockKey> store_keys;
  std::vector<SlotIndex> store_slots;
  std::uint64_t next_job = 1;
  Progress progress;
};

// What the ranks answered to one request: whether the load and the store succeeded (and
// verified) on every rank, and the slowest rank's copy time of each.
struct Replies {
  bool load_ok = true;
  bool store_ok = true;
  double load_seconds = 0, store_seconds = 0;
};

// Figures read once the run has stopped, before and after the stack closes.
struct Ending {
  std::string never_ready_verdict;  // Note [Run phases]: the pool never held one request
  ManagerStats manager;
  TieredStats store;
  TierFigures tiers;
  bool closed = false;
  bool region_removed = false;
  double seconds = 0;
  bool all_verified = false;
};

// One run on a private region, in its phases: the stack (constructor), the ranks' start, the
// paced requests, the wait for the rest of the bring-up, the ranks' stop, the report. The members
// are the run's state, shared by the phases; their order is the order they are torn down in.
class PrivateRun {
 public:
  explicit PrivateRun(const RunConfig& config)
      : config_(config),
        started_(Clock::now()),
        bringup_(parse_bringup_mode(config.bringup)),
        background_(bringup_ == BringupMode::kBackground),
        stack_(OffloadStack::build(stack_config_for(config, bringup_))),
        region_path_(stack_->region().path()),
        scheduler_populate_(stack_->region().populate_report()),
        need_(config.max_request_chunks()) {}

  RunOutcome run() {
    try {
      start_ranks();
      serve();
      wait_for_pool_ready();
    } catch (const std::exception& e) {
      // A rank died (SIGKILL, a crash) or the scheduler failed mid-run: stop the others, then
      // report what was measured until then with the cause (Note [Run stopped early]).
      graceful_ = false;
      stopped_early_ = e.what();
      failure_ = std::current_exception();
    }
    stop();
    const Ending ending = close();
    return outcome(ending, report(ending));
  }

 private:
  [[nodiscard]] double since_start() const {
    return std::chrono::duration<double>(Clock::now() - started_).count();
  }

  void start_ranks() {
    ranks_ = spawn_ranks(config_.world_size);
    for (std::uint32_t r = 0; r < config_.world_size; ++r) {
      send_to(ranks_[r], r, {{"op", "config"}, {"rank", r}, {"config", config_}});
    }
    for (std::uint32_t r = 0; r < config_.world_size; ++r) {
      rank_reports_.push_back(receive_from(ranks_[r], r, std::chrono::seconds(120)));
    }
  }

  // Grows the Manager's ready prefix; records when every row is ready on every rank. Never
  // blocks (one read of the readiness table per request).
  void track_readiness() {
    if (pool_ready_seconds_) return;
    Manager& manager = stack_->manager();
    const std::uint64_t ready = stack_->region().chunks_ready_on_all_ranks();
    if (background_ && ready > manager.ready_chunks()) manager.set_ready_chunks(ready);
    if (ready == config_.num_chunks) pool_ready_seconds_ = since_start();
  }

  [[nodiscard]] bool run_over() const {
    const double elapsed = since_start();
    return interrupted() || (config_.duration_seconds > 0 && elapsed >= config_.duration_seconds);
  }

  // Note [Run phases]: waits until the rows ready on every rank can hold one request. False
  // when the run is over first, or when a rank's bring-up ended short of it (never_serves_):
  // then the other ranks get a moment to end or pass one request too, so that the verdict
  // names every rank that failed, not only the first.
  bool wait_for_room() {
    const auto begin = Clock::now();
    const auto limit = begin + std::chrono::seconds(600);
    std::optional<Clock::time_point> settle_by;
    bool room = false;
    while (true) {
      track_readiness();
      if (pool_ready_seconds_ || stack_->manager().ready_chunks() >= need_) {
        room = true;
        break;
      }
      if (run_over()) break;
      bool any_ended = false;
      bool all_settled = true;
      for (std::uint32_t r = 0; r < config_.world_size; ++r) {
        const RankBringup b = stack_->region().rank_bringup(r);
        any_ended = any_ended || ended_short(b, need_);
        const bool ended = b.state == BringupState::kFailed || b.state == BringupState::kStopped;
        all_settled = all_settled && (ended || b.ready_chunks >= need_);
        // A rank that exited says so on its channel (EOF): receive_from names it.
        pollfd p{ranks_[r].channel->fd(), POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) (void)receive_from(ranks_[r], r, std::chrono::seconds(1));
      }
      if (any_ended) {
        if (!settle_by) settle_by = Clock::now() + std::chrono::seconds(2);
        if (all_settled || Clock::now() >= *settle_by) {
          never_serves_ = true;
          break;
        }
      }
      if (Clock::now() >= limit) {
        throw Error(ErrorCode::kTimeout,
                    "the pool could not hold one request (" + std::to_string(need_) +
                        " chunks) on every rank after 600 s of bring-up; the ranks' bring-up "
                        "is in rank_bringup of a --json run");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    t_.paced_seconds += std::chrono::duration<double>(Clock::now() - begin).count();
    return room;
  }

  // The paced requests, until the run is over, its request count is reached, or the pool will
  // never hold one request; then the tiers' writes finish.
  void serve() {
    LoadGenerator load(config_);
    while (!interrupted()) {
      if (config_.requests != 0 && t_.requests >= config_.requests) break;
      if (run_over()) break;

      track_readiness();
      if (!pool_ready_seconds_ && stack_->manager().ready_chunks() < need_ && !wait_for_room()) {
        break;
      }
      serve_request(load);
    }
    load.progress.finish();
    (void)stack_->store().drain();
  }

  void note_first_request() {
    if (!first_request_seconds_) first_request_seconds_ = since_start();
  }

  // One request: look it up, hand the ranks its load and its store, complete both.
  void serve_request(LoadGenerator& load) {
    Manager& manager = stack_->manager();
    TieredStore& store = stack_->store();
    const std::uint32_t bpc = config_.blocks_per_chunk;
    const double elapsed = since_start();
    Phase& phase = pool_ready_seconds_ ? t_.ready : t_.coming_up;
    const std::vector<BlockKey>& keys = load.workload.next();
    ++t_.requests;
    ++phase.requests;
    t_.chunks_looked_up += keys.size();
    phase.chunks_looked_up += keys.size();

    const std::size_t hit = look_up(keys);
    t_.hits += hit;
    phase.hits += hit;

    // Distinct device blocks for this request: the load's first, then the store's.
    // A partial Fisher-Yates shuffle: any permutation stays one, so no reset per request.
    const std::size_t blocks_needed = keys.size() * bpc;
    for (std::size_t i = 0; i < blocks_needed; ++i) {
      std::uniform_int_distribution<std::size_t> pick(i, load.device_blocks.size() - 1);
      std::swap(load.device_blocks[i], load.device_blocks[pick(load.rng)]);
    }
    const std::span<const std::uint64_t> all_blocks(load.device_blocks);

    nlohmann::json request{{"op", "request"}, {"id", t_.requests}};
    const auto hit_keys = std::span(keys).first(hit);
    if (hit > 0) {
      const auto slots = manager.prepare_load(hit_keys);
      load.load_slots.assign(slots.begin(), slots.end());
      request["load"] =
          job_json(load.next_job++, load.load_slots, all_blocks.first(hit * bpc), hit_keys);
    }
    const StorePlan plan = manager.prepare_store(std::span(keys).subspan(hit), hit_keys);
    load.store_keys.assign(plan.keys.begin(), plan.keys.end());
    load.store_slots.assign(plan.slots.begin(), plan.slots.end());
    if (!plan.ok()) {
      ++t_.cannot_store;
      ++phase.cannot_store;
    }
    if (!load.store_keys.empty()) {
      request["store"] =
          job_json(load.next_job++, load.store_slots,
                   all_blocks.subspan(hit * bpc, load.store_keys.size() * bpc), load.store_keys);
    }
    if (!request.contains("load") && !request.contains("store")) {
      // Served without the offload tier (nothing to load, no room to store).
      note_first_request();
      return;
    }

    const Replies replies = exchange(request);
    t_.load_seconds += replies.load_seconds;
    t_.store_seconds += replies.store_seconds;
    note_first_request();
    if (hit > 0) {
      manager.complete_load(hit_keys);
      if (!replies.load_ok) ++t_.failed_jobs;
    }
    if (!load.store_keys.empty()) {
      // A store that failed on any rank is not stored at all: its slots are freed.
      store.complete_store(load.store_keys, replies.store_ok);
      if (!replies.store_ok) ++t_.failed_jobs;
    }
    // --wait-for-tiers (RunConfig::wait_for_tiers) finishes the tiers' writes, releasing their
    // offload pins, before the next request looks anything up: what is evicted next, and so
    // what is promoted later, no longer depends on how fast the tiers write.
    if (config_.wait_for_tiers) {
      (void)store.drain();
    } else {
      (void)store.poll();
    }
    const ManagerStats ms = manager.stats();
    load.progress.update(t_.requests, elapsed,
                         t_.chunks_looked_up ? double(t_.hits) / double(t_.chunks_looked_up) : 0.0,
                         gbps(t_.store_bytes, t_.store_seconds),
                         gbps(t_.load_bytes, t_.load_seconds), ms.evictions);
  }

  // The request's hit prefix in the primary tier, after bringing back what a secondary tier holds
  // beyond it. A remote tier answers "pending" while its existence check is in flight: this asks
  // again, and it ends because the tier turns a pending answer into a miss once its lookup
  // budget is spent (never a stall). An engine would schedule other work meanwhile.
  std::size_t look_up(const std::vector<BlockKey>& keys) {
    Manager& manager = stack_->manager();
    TieredStore& store = stack_->store();
    TieredLookup found = store.lookup(keys);
    const auto give_up = Clock::now() +
                         2 * std::chrono::milliseconds(config_.remote_lookup_budget_ms) +
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
        for (const PromoteCompletion& c : store.drain()) t_.promoted += c.promoted.size();
      }
    }
    std::size_t hit = 0;
    while (hit < keys.size() && manager.state_of(keys[hit]) == LookupResult::kHit) ++hit;
    return hit;
  }

  // Sends the request to every rank and collects their answers into the totals.
  Replies exchange(const nlohmann::json& request) {
    for (std::uint32_t r = 0; r < config_.world_size; ++r) send_to(ranks_[r], r, request);
    Replies out;
    for (std::uint32_t r = 0; r < config_.world_size; ++r) {
      const nlohmann::json done = receive_from(ranks_[r], r, std::chrono::seconds(300));
      if (done.contains("load")) {
        const auto& l = done["load"];
        const bool ok =
            l.at("success").get<bool>() && l.at("mismatched_bytes").get<std::uint64_t>() == 0;
        if (!l.at("success").get<bool>())
          t_.note_error("rank " + std::to_string(r) + " load: " + l.value("error", ""));
        out.load_ok = out.load_ok && ok;
        t_.load_bytes += l.at("bytes").get<std::uint64_t>();
        t_.verified_bytes += l.at("verified_bytes").get<std::uint64_t>();
        t_.mismatched_bytes += l.at("mismatched_bytes").get<std::uint64_t>();
        out.load_seconds = std::max(out.load_seconds, l.at("seconds").get<double>());
      }
      if (done.contains("store")) {
        const auto& s = done["store"];
        const bool ok = s.at("success").get<bool>();
        if (!ok) t_.note_error("rank " + std::to_string(r) + " store: " + s.value("error", ""));
        out.store_ok = out.store_ok && ok;
        t_.store_bytes += s.at("bytes").get<std::uint64_t>();
        out.store_seconds = std::max(out.store_seconds, s.at("seconds").get<double>());
      }
    }
    return out;
  }

  // The bring-up may outlast the requests: wait for it here (no request waits on it), so that
  // pool_ready_seconds is always measured. A rank whose bring-up failed or stopped ends the wait.
  void wait_for_pool_ready() {
    const auto wait_until = Clock::now() + std::chrono::seconds(600);
    while (!never_serves_ && !pool_ready_seconds_ && !interrupted()) {
      track_readiness();
      if (pool_ready_seconds_) break;
      bool ended = false;
      for (std::uint32_t r = 0; r < config_.world_size; ++r) {
        const RankBringup b = stack_->region().rank_bringup(r);
        if (b.state == BringupState::kFailed || b.state == BringupState::kStopped) {
          t_.note_error("rank " + std::to_string(r) + " bring-up " +
                        std::string(to_string(b.state)) + " after " +
                        std::to_string(b.ready_chunks) + " of " +
                        std::to_string(config_.num_chunks) + " chunks" +
                        (b.sys_errno != 0 ? " (" + errno_name(b.sys_errno) + ")" : std::string()) +
                        "; its log has the error");
          ended = true;
        }
      }
      if (ended) break;
      if (Clock::now() >= wait_until) {
        t_.note_error("the pool was not ready on every rank after 600 s");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // Stops the ranks and, when the run stopped early, names the lost ones; a start-up failure
  // before anything was measured is rethrown as it came.
  void stop() {
    stop_ranks(ranks_, graceful_, &byes_);
    if (stopped_early_.empty()) return;
    // Note [Run stopped early]: the channel error ("closed its channel", ECONNRESET) says only
    // that a rank is gone; its wait status says which rank, which PID and how it ended.
    const std::string lost = describe_lost_ranks(ranks_);
    if (lost.empty() && t_.requests == 0) {
      // A start-up failure (a rank could not start: a bad device, a backend missing) before
      // anything was measured: the error alone, with its own code, as before.
      stack_->close();
      std::rethrow_exception(failure_);
    }
    if (!lost.empty()) stopped_early_ = lost + " (the scheduler saw: " + stopped_early_ + ")";
  }

  // Reads the last figures, closes the stack and checks that the region is gone.
  Ending close() {
    Ending out;
    out.never_ready_verdict =
        never_serves_ ? never_serves_verdict(config_.world_size, byes_, stack_->region(), need_)
                      : std::string();
    out.manager = stack_->manager().stats();
    out.store = stack_->store().stats();
    out.tiers = tier_figures(*stack_, config_.remote_lookup_budget_ms);
    out.closed = stack_->close();
    stack_.reset();
    std::error_code ec;
    out.region_removed = !std::filesystem::exists(region_path_, ec);
    out.seconds = since_start();
    out.all_verified =
        t_.mismatched_bytes == 0 && t_.failed_jobs == 0 && t_.verified_bytes == t_.load_bytes;
    return out;
  }

  [[nodiscard]] nlohmann::json report(const Ending& e) const {
    const Totals& t = t_;
    nlohmann::json out = geometry_report(config_, rank_reports_);
    out.update(nlohmann::json{
        // The rows the scheduler could hand out by the end: those ready on every rank.
        {"ready_chunks", e.manager.ready_chunks},
        {"region_path", region_path_.string()},
        {"requests", t.requests},
        {"chunks_looked_up", t.chunks_looked_up},
        {"hits", t.hits},
        {"misses", t.chunks_looked_up - t.hits},
        {"hit_rate", t.chunks_looked_up ? double(t.hits) / double(t.chunks_looked_up) : 0.0},
        {"evictions", e.manager.evictions},
        {"cannot_store", t.cannot_store},
        {"promoted", t.promoted},
        {"promoted_from", e.tiers.promoted_from},
        {"tier_offloads", e.store.offload_ok},
        {"store_bytes", t.store_bytes},
        {"load_bytes", t.load_bytes},
        {"store_gbps", gbps(t.store_bytes, t.store_seconds)},
        {"load_gbps", gbps(t.load_bytes, t.load_seconds)},
        {"verified_bytes", t.verified_bytes},
        {"mismatched_bytes", t.mismatched_bytes},
        {"failed_jobs", t.failed_jobs},
        {"all_verified", e.all_verified},
        {"populate", populate_figure(background_, scheduler_populate_, byes_)},
        {"ranks", rank_reports_},
        {"interrupted", interrupted()},
        {"region_removed", e.region_removed && e.closed},
        {"errors", t.errors},
        {"seconds", e.seconds}});
    out["registration_seconds"] = registration_figure(background_, rank_reports_, byes_);
    if (!e.tiers.remote.is_null()) out["remote"] = e.tiers.remote;
    out["bringup"] = config_.bringup;
    out["bringup_piece_bytes"] = config_.bringup_piece_bytes;
    out["wait_for_tiers"] = config_.wait_for_tiers;
    out["first_request_seconds"] =
        first_request_seconds_ ? nlohmann::json(*first_request_seconds_) : nlohmann::json();
    out["pool_ready_seconds"] =
        pool_ready_seconds_ ? nlohmann::json(*pool_ready_seconds_) : nlohmann::json();
    out["paced_seconds"] = t.paced_seconds;
    out["phases"] = {{"coming_up", t.coming_up.to_json()}, {"ready", t.ready.to_json()}};
    out["registration_longest_piece_seconds"] = longest_piece_figure(byes_);
    out["rank_bringup"] = byes_;
    return out;
  }

  // The exit code and the failure line: stopped early, interrupted, never served, credentials
  // refused, or not everything verified, in that order.
  [[nodiscard]] RunOutcome outcome(const Ending& e, nlohmann::json report_json) const {
    RunOutcome out{std::move(report_json), 0, {}, false};
    if (!stopped_early_.empty()) {
      out.exit_code = 1;
      char after[64];
      (void)std::snprintf(after, sizeof after,
                          "stopped after %.1f s and %llu requests: ", e.seconds,
                          static_cast<unsigned long long>(t_.requests));
      out.failure = after + stopped_early_;
      // Before the first request there is nothing measured to show: the line says it all.
      out.verdict_only = t_.requests == 0;
    } else if (interrupted()) {
      out.exit_code = 130;
    } else if (!e.never_ready_verdict.empty()) {
      out.exit_code = 1;
      char after[48];
      (void)std::snprintf(after, sizeof after, "stopped after %.1f s: ", e.seconds);
      out.failure = after + e.never_ready_verdict;
      out.verdict_only = true;
    } else if (!e.tiers.remote_refused.empty()) {
      out.exit_code = 1;
      out.failure = "failed: " + e.tiers.remote_refused;
    } else if (!e.all_verified || !e.region_removed || !pool_ready_seconds_) {
      out.exit_code = 1;
      out.failure =
          unverified_failure(t_, pool_ready_seconds_.has_value(), e.region_removed, region_path_);
    }
    return out;
  }

  const RunConfig& config_;
  const Clock::time_point started_;
  const BringupMode bringup_;
  const bool background_;
  std::unique_ptr<OffloadStack> stack_;
  const std::filesystem::path region_path_;
  const PopulateReport scheduler_populate_;
  const std::uint64_t need_;  // the chunks of the longest request

  std::vector<RankProcess> ranks_;
  Totals t_;
  std::optional<double> first_request_seconds_;  // until the first request was served
  std::optional<double> pool_ready_seconds_;     // until every row was ready on every rank
  // A rank's bring-up ended before the pool could hold one request (Note [Run phases]).
  bool never_serves_ = false;
  nlohmann::json byes_ = nlohmann::json::array();
  nlohmann::json rank_reports_ = nlohmann::json::array();
  bool graceful_ = true;
  std::string stopped_early_;  // why the run ended before its end (a rank died, a failure)
  std::exception_ptr failure_;
};

}  // namespace

RunOutcome run_scheduler(const RunConfig& config) {
  if (!config.pool.empty()) return run_pool_scheduler(config);
  const InterruptGuard interrupt_guard;  // and a new run starts uninterrupted
  PrivateRun run(config);
  return run.run();
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
