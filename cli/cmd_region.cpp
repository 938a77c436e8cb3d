// `kvoffload region create|list|clean` (docs/DESIGN.md §10.1): drive the shared host region from a
// shell.
//
// create: create or join the region, populate it, optionally --fill this rank's slots with a byte,
//         --check that every byte of them holds a byte (written by another process), and --hold
//         the region attached. The result (JSON or text) is printed before the hold starts, so a
//         script reading stdout knows the fill is done when the first line arrives.
//         --rank defaults to 0; --unranked maps as the scheduler does (no slot of its own):
//         --fill then writes the whole data (padding included), --check verifies every rank's slot.
//         Either way it takes that role (Note [Owners]): a rank or scheduler another live process
//         holds is refused, naming its PID.
//         SIGINT, SIGTERM or SIGHUP during --hold end the hold early: the region is released
//         normally (the last process out unlinks the file) and the command exits 0.
// list:   the regions in the shm dir with size, attached process count, stale flag, the PIDs
//         holding the scheduler role and each rank slot (read from /proc/locks), and each one's
//         occupancy from its live statistics page (read-only; list locks nothing).
// clean:  removes stale regions only; a region in use is never removed.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/live_stats.hpp>
#include <kvoffload/node_pool.hpp>
#include <kvoffload/region.hpp>

#include "cli.hpp"
#include "monitor/live_json.hpp"
#include "region_bytes.hpp"
#include "shm_fs.hpp"
#include "util/clock.hpp"

namespace kvoffload::cli {
namespace {

using Clock = std::chrono::steady_clock;

using util::seconds_since;

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(digits);
  out << value;
  return out.str();
}

std::string rate(std::uint64_t bytes, double seconds) {
  if (seconds <= 0.0) return "-";
  return human_bytes(static_cast<std::uint64_t>(static_cast<double>(bytes) / seconds)) + "/s";
}

// A BYTE value: decimal or 0x-prefixed hex, 0..255. Anything else is a usage error that names the
// flag and the value (main maps kInvalidArgument thrown while parsing to exit code 2).
std::uint8_t parse_byte(const std::string& flag, const std::string& text) {
  auto fail = [&]() -> std::uint8_t {
    throw_invalid(flag + " '" + text +
                  "': expected a byte value 0..255, decimal or 0x hex (e.g. 165 or 0xA5)");
  };
  const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  const std::string digits = hex ? text.substr(2) : text;
  if (digits.empty() || digits.size() > 3) return fail();
  unsigned value = 0;
  for (char ch : digits) {
    const auto c = static_cast<unsigned char>(ch);
    unsigned digit = 0;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (hex && c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    else if (hex && c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else
      return fail();
    value = value * (hex ? 16U : 10U) + digit;
  }
  if (value > 255) return fail();
  return static_cast<std::uint8_t>(value);
}

CLI::Option* add_byte_option(CLI::App& app, const std::string& name,
                             std::optional<std::uint8_t>& out, const std::string& description) {
  return app
      .add_option_function<std::string>(
          name, [&out, name](const std::string& text) { out = parse_byte(name, text); },
          description)
      ->type_name("BYTE");
}

std::filesystem::path resolve_shm_dir(const std::string& given) {
  return given.empty() ? default_shm_dir() : std::filesystem::path(given);
}

// ---------------------------------------------------------------------------------------------
// region create

struct CreateOptions {
  std::string engine_id;
  std::uint64_t chunks = 0;
  std::uint64_t slot_bytes = 0;
  std::uint32_t world_size = 1;
  std::uint32_t rank = 0;
  bool unranked = false;
  bool replicated = false;
  std::uint64_t slot_align = kDefaultSlotAlign;
  std::string shm_dir;
  double join_timeout_s = 30.0;
  unsigned threads = 1;
  std::optional<std::uint8_t> fill;
  std::optional<std::uint8_t> check;
  double hold_s = 0.0;
  bool json = false;
};

// Keeps the region attached for `seconds`, or until SIGINT/SIGTERM/SIGHUP. The signals are
// blocked and taken synchronously with sigtimedwait rather than by a handler, so nothing
// async-signal-unsafe runs and the Region destructor releases the region on the normal path.
// They stay blocked afterwards: a second Ctrl-C must not kill us half-way through the release.
// Returns the signal that ended the hold, or 0 when it ran its course.
int hold_attached(double seconds) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  if (const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0) {
    throw_system_error("pthread_sigmask", rc, "blocking SIGINT/SIGTERM for --hold");
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  for (;;) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return 0;
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(left);
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(secs.count());
    ts.tv_nsec = static_cast<long>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(left - secs).count());
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno == EAGAIN || errno == EINTR) continue;  // the loop re-checks the deadline
    throw_system_error("sigtimedwait", errno, "while holding the region");
  }
}

// The region the options ask for (the engine id was validated by region_path already).
RegionOptions create_options(const CreateOptions& o, const std::filesystem::path& shm_dir) {
  RegionOptions ropts;
  ropts.engine_id = o.engine_id;
  ropts.layout = RegionLayout{.num_chunks = o.chunks,
                              .slot_bytes = o.slot_bytes,
                              .world_size = o.world_size,
                              .replicated = o.replicated,
                              .slot_align = o.slot_align};
  if (!o.unranked) ropts.rank = o.rank;
  ropts.shm_dir = shm_dir;
  ropts.join_timeout = std::chrono::milliseconds(std::llround(o.join_timeout_s * 1000.0));
  ropts.populate_threads = o.threads;
  return ropts;
}

// The report of a region just created or joined, as JSON.
nlohmann::json created_json(const Region& region, const CreateOptions& o) {
  const RegionGeometry& geo = region.geometry();
  const PopulateReport& pop = region.populate_report();
  return {
      {"path", region.path().string()},
      {"engine_id", region.engine_id()},
      {"role", std::string(to_string(region.role()))},
      {"rank", region.rank() ? nlohmann::json(*region.rank()) : nlohmann::json()},
      {"world_size", geo.world_size()},
      {"replicated", geo.replicated()},
      {"chunks", geo.num_chunks()},
      {"slot_bytes", geo.slot_bytes()},
      {"slot_align", geo.slot_align()},
      {"slot_stride", geo.slot_stride()},
      {"copies", geo.copies()},
      {"row_stride", geo.row_stride()},
      {"data_bytes", geo.data_bytes()},
      {"populate", std::string(to_string(pop.method))},
      {"populate_bytes", pop.bytes},
      {"populate_seconds", pop.seconds},
      {"threads", o.threads},
  };
}

// The same as text (the fill, check and timing lines follow).
void write_created_text(std::ostream& text, const Region& region, const CreateOptions& o) {
  const RegionGeometry& geo = region.geometry();
  const PopulateReport& pop = region.populate_report();
  text << "region " << region.path().string() << ": " << to_string(region.role()) << ", "
       << (region.rank() ? "rank " + std::to_string(*region.rank()) + " of " +
                               std::to_string(geo.world_size())
                         : std::string("unranked"))
       << (geo.replicated() ? " (replicated layout)" : "") << "\n"
       << "  geometry: " << geo.num_chunks() << " chunks x row " << human_bytes(geo.row_stride())
       << " (slot " << human_bytes(geo.slot_bytes()) << " x " << geo.copies() << " cop"
       << (geo.copies() == 1 ? "y" : "ies") << ") = " << human_bytes(geo.data_bytes()) << "\n"
       << "  populate: " << to_string(pop.method) << ", " << human_bytes(pop.bytes) << " in "
       << fixed(pop.seconds, 3) << " s (" << rate(pop.bytes, pop.seconds) << ") with " << o.threads
       << " thread" << (o.threads == 1 ? "" : "s") << "\n";
}

int run_create(const CreateOptions& o) {
  const std::filesystem::path shm_dir = resolve_shm_dir(o.shm_dir);
  // Validates the engine id before anything else (kInvalidArgument: a usage error).
  const std::filesystem::path path = region_path(shm_dir, o.engine_id);
  if (!o.unranked && o.rank >= o.world_size) {
    throw_invalid("--rank " + std::to_string(o.rank) + " must be less than --world-size " +
                  std::to_string(o.world_size) + " (ranks are 0.." +
                  std::to_string(o.world_size - 1) +
                  "); use --unranked to map the region without a slot of its own");
  }

  const RegionOptions ropts = create_options(o, shm_dir);

  const auto start = Clock::now();
  warn_if_disk_shm_dir(shm_dir);
  Region region = Region::create_or_join(ropts);
  const double attach_seconds = seconds_since(start);

  nlohmann::json out = created_json(region, o);
  std::ostringstream text;
  write_created_text(text, region, o);

  if (o.fill) {
    const auto t0 = Clock::now();
    const std::uint64_t bytes = fill_region(region, *o.fill, o.threads);
    const double s = seconds_since(t0);
    out["fill"] = *o.fill;
    out["filled_bytes"] = bytes;
    out["fill_seconds"] = s;
    text << "  fill " << hex_byte(*o.fill) << ": " << human_bytes(bytes) << " in " << fixed(s, 3)
         << " s (" << rate(bytes, s) << ")\n";
  }
  if (o.check) {
    const auto t0 = Clock::now();
    const std::uint64_t bytes = check_region(region, *o.check, o.threads);
    const double s = seconds_since(t0);
    out["check"] = *o.check;
    out["checked_bytes"] = bytes;
    out["check_seconds"] = s;
    text << "  check " << hex_byte(*o.check) << ": ok, " << human_bytes(bytes) << " in "
         << fixed(s, 3) << " s\n";
  }
  const double total_seconds = seconds_since(start);
  out["attach_seconds"] = attach_seconds;
  out["seconds"] = total_seconds;
  out["hold_seconds"] = o.hold_s;
  text << "  took " << fixed(total_seconds, 3) << " s (create/join + populate "
       << fixed(attach_seconds, 3) << " s)\n";
  if (o.hold_s > 0) {
    text << "holding for " << fixed(o.hold_s, 1) << " s (Ctrl-C or SIGTERM releases it early)\n";
  }
  emit(o.json, out, text.str());

  if (o.hold_s > 0) {
    const int sig = hold_attached(o.hold_s);
    if (!o.json) {
      std::cout << (sig != 0 ? std::string("hold ended by SIG") + sigabbrev_np(sig)
                             : std::string("hold ended"))
                << "; releasing the region" << std::endl;
    }
  }
  if (!region.close()) {
    throw Error(ErrorCode::kSystem,
                "releasing " + path.string() +
                    " failed at some step (the log above names it); the file "
                    "may remain and `kvoffload region clean` removes it once stale");
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// region list / clean

struct ListOptions {
  std::string shm_dir;
  bool json = false;
};

int run_list(const ListOptions& o) {
  const std::filesystem::path shm_dir = resolve_shm_dir(o.shm_dir);
  // Read-only, no lock: the live page is mapped PROT_READ (Note [Live stats]).
  const std::vector<EngineSnapshot> engines = snapshot_engines(shm_dir);
  nlohmann::json items = nlohmann::json::array();
  std::ostringstream text;
  if (engines.empty()) text << "no regions in " << shm_dir.string() << "\n";
  for (const EngineSnapshot& engine : engines) {
    const RegionInfo& r = engine.region;
    items.push_back(engine_json(engine));
    nlohmann::json& item = items.back();
    // Roles held now (ranks, then the scheduler) and their PIDs; 0: not recorded yet.
    nlohmann::json owners = nlohmann::json::array();
    std::string owners_text;
    for (const RegionOwner& owner : r.owners) {
      owners.push_back({{"role", owner.rank ? "rank" : "scheduler"},
                        {"rank", owner.rank ? nlohmann::json(*owner.rank) : nlohmann::json()},
                        {"pid", owner.pid}});
      owners_text += std::string(owners_text.empty() ? "" : ", ") +
                     (owner.rank ? "rank " + std::to_string(*owner.rank) : "scheduler") + " pid " +
                     (owner.pid != 0 ? std::to_string(owner.pid) : "?");
    }
    item["owners"] = owners;
    if (!r.problem.empty()) {  // named like a region, but not one we could read: say why, go on
      text << r.engine_id << "  not a region: " << r.problem << "  " << r.path.string() << "\n";
      continue;
    }
    text << r.engine_id << "  " << human_bytes(r.file_bytes) << "  " << r.attached << " attached  "
         << (r.stale ? "stale" : "in use") << (r.complete ? "" : ", incomplete");
    if (r.geometry) {
      text << "  (" << r.geometry->num_chunks() << " chunks x "
           << human_bytes(r.geometry->slot_bytes()) << " x " << r.geometry->copies() << ")";
    }
    text << "  " << r.path.string() << "\n";
    if (!owners_text.empty()) text << "  held by: " << owners_text << "\n";
    text << "    "
         << (engine.live ? occupancy_text(*engine.live) : "live state: " + engine.live_problem)
         << "\n";
  }
  // The node pools, read the same way: no lock, no tenant slot (Note [Pool observer]).
  nlohmann::json pools = nlohmann::json::array();
  for (const pool::PoolObservation& p : pool::observe_pools(shm_dir)) {
    pools.push_back(pool_json(p));
    text << pool_text(p);
  }
  emit(o.json, nlohmann::json{{"shm_dir", shm_dir.string()}, {"regions", items}, {"pools", pools}},
       text.str());
  return kExitOk;
}

struct CleanOptions {
  std::string shm_dir;
  std::optional<std::string> engine_id;
  bool json = false;
};

int run_clean(const CleanOptions& o) {
  const std::filesystem::path shm_dir = resolve_shm_dir(o.shm_dir);
  if (o.engine_id) (void)region_path(shm_dir, *o.engine_id);  // validates the id (usage error)
  const CleanResult result = clean_regions(shm_dir, o.engine_id);
  nlohmann::json removed = nlohmann::json::array();
  nlohmann::json kept = nlohmann::json::array();
  std::ostringstream text;
  for (const auto& p : result.removed) {
    removed.push_back(p.string());
    text << "removed " << p.string() << " (stale)\n";
  }
  for (const auto& p : result.kept) {
    kept.push_back(p.string());
    text << "kept    " << p.string() << " (in use)\n";
  }
  nlohmann::json skipped = nlohmann::json::array();
  // Stale node pools (nobody attached), by the joiners' rule (remove_stale_pool); not with
  // --engine-id, which names one engine's region.
  bool any_pool = false;
  if (!o.engine_id) {
    for (const pool::PoolObservation& p : pool::observe_pools(shm_dir)) {
      any_pool = true;
      try {
        if (pool::remove_stale_pool(p.path)) {
          removed.push_back(p.path.string());
          text << "removed " << p.path.string() << " (stale pool)\n";
        } else {
          kept.push_back(p.path.string());
          text << "kept    " << p.path.string() << " (pool in use)\n";
        }
      } catch (const std::exception& e) {
        skipped.push_back({{"path", p.path.string()}, {"reason", e.what()}});
        text << "skipped " << p.path.string() << " (" << e.what() << ")\n";
      }
    }
  }
  for (const auto& sk : result.skipped) {
    skipped.push_back({{"path", sk.path.string()}, {"reason", sk.reason}});
    text << "skipped " << sk.path.string() << " (" << sk.reason << ")\n";
  }
  if (result.removed.empty() && result.kept.empty() && result.skipped.empty() && !any_pool) {
    text << "no regions" << (o.engine_id ? " of engine " + *o.engine_id : std::string()) << " in "
         << shm_dir.string() << "\n";
  }
  emit(o.json, nlohmann::json{{"removed", removed}, {"kept", kept}, {"skipped", skipped}},
       text.str());
  return kExitOk;
}

const std::string kShmDirHelp =
    "Directory of the region files (default $KVOFFLOAD_SHM_DIR, else /dev/shm)";

const CommandRegistrar kRegisterRegion("region", [](CLI::App& top) {
  auto* app = top.add_subcommand("region", "Create, join, list and clean shared host regions");
  app->require_subcommand(1);

  auto* create = app->add_subcommand(
      "create",
      "Create or join a region, populate it, optionally fill/check this rank's slots and hold it");
  auto c = std::make_shared<CreateOptions>();
  create->add_option("--engine-id", c->engine_id, "Engine id: 1..128 of [A-Za-z0-9._-]")
      ->required()
      ->type_name("ID")
      ->check(engine_id_check());
  create->add_option("--chunks", c->chunks, "Number of chunks (rows)")
      ->required()
      ->type_name("N")
      // The flag's own range; what fits is the region geometry's and the filesystem's call.
      ->check(whole_range(1, std::numeric_limits<std::uint64_t>::max()));
  add_size_option(*create, "--slot-bytes", c->slot_bytes,
                  "Bytes of one rank's slot per chunk (K/M/G)", 1, 1ULL << 40)
      ->required();
  create->add_option("--world-size", c->world_size, "Ranks sharing the region (default 1)")
      ->type_name("C")
      ->check(whole_range(1, std::numeric_limits<std::uint32_t>::max()));
  auto* rank =
      create
          ->add_option("--rank", c->rank,
                       "This process's rank (default 0); one live process per rank")
          ->type_name("R")
          ->check(whole_range(0, std::numeric_limits<std::uint32_t>::max() - 1));  // < --world-size
  auto* unranked = create->add_flag(
      "--unranked", c->unranked,
      "Map without a rank, as the engine's scheduler (one live process at a time)");
  rank->excludes(unranked);
  create->add_flag("--replicated", c->replicated,
                   "Replicated (MLA) layout: all ranks share slot 0");
  add_size_option(*create, "--slot-align", c->slot_align,
                  "Alignment of every slot: a power of two from 16 to the page size (default 256)");
  create->add_option("--shm-dir", c->shm_dir, kShmDirHelp)->type_name("DIR");
  create
      ->add_option("--join-timeout", c->join_timeout_s,
                   "Seconds a joiner waits for the creator to finish (default 30)")
      ->type_name("SECONDS")
      ->check(real_range(0.0, 1e9, "seconds"));
  create->add_option("--threads", c->threads, "Threads for populate, fill and check (default 1)")
      ->type_name("T")
      ->check(whole_range(1, 1024));
  add_byte_option(*create, "--fill", c->fill,
                  "Write BYTE over this rank's slots (unranked: all data)");
  add_byte_option(*create, "--check", c->check,
                  "Verify every byte of this rank's slots (unranked: every slot) equals BYTE");
  create->add_option("--hold", c->hold_s, "Stay attached this many seconds (SIGINT/SIGTERM end it)")
      ->type_name("SECONDS")
      ->check(real_range(0.0, 1e9, "seconds"));
  create->add_flag("--json", c->json, "Print one JSON object");

  auto* list = app->add_subcommand(
      "list", "List regions with size, attached processes, stale flag, role holders and occupancy");
  auto l = std::make_shared<ListOptions>();
  list->add_option("--shm-dir", l->shm_dir, kShmDirHelp)->type_name("DIR");
  list->add_flag("--json", l->json, "Print one JSON object");

  auto* clean = app->add_subcommand("clean", "Remove stale regions (never one in use)");
  auto k = std::make_shared<CleanOptions>();
  clean->add_option("--shm-dir", k->shm_dir, kShmDirHelp)->type_name("DIR");
  clean->add_option("--engine-id", k->engine_id, "Only this engine's region")
      ->type_name("ID")
      ->check(engine_id_check());
  clean->add_flag("--json", k->json, "Print one JSON object");

  return Command{app, [=] {
                   if (create->parsed()) return run_create(*c);
                   if (list->parsed()) return run_list(*l);
                   if (clean->parsed()) return run_clean(*k);
                   throw_invalid("region: expected a subcommand: create, list or clean");
                 }};
});

}  // namespace
}  // namespace kvoffload::cli
