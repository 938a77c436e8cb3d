// `kvoffload top`: a live view of every engine on the node, read from the regions' live
// statistics pages (no lock, no role: the engines never notice it).
//
// On a terminal it takes the alternate screen and redraws every --interval seconds without
// flicker until q (or Ctrl-C, SIGTERM, SIGHUP), then gives the terminal back as it was. When
// standard output is not a terminal (a pipe, a file, a CI log) it prints one snapshot as plain
// text and exits, as `--once` does anywhere; `--json` prints one JSON object. `--frames N` stops
// after N frames (scripts and tests).
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <kvoffload/live_stats.hpp>
#include <kvoffload/node_pool.hpp>

#include "cli.hpp"
#include "monitor/live_json.hpp"
#include "monitor/terminal.hpp"
#include "monitor/top_view.hpp"

namespace kvoffload::cli {
namespace {

struct TopOptions {
  std::string shm_dir;
  double interval = 1.0;
  bool once = false;
  std::uint64_t frames = 0;  // 0: until q
  bool json = false;
};

std::string local_clock() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  (void)::localtime_r(&now, &tm);
  char buf[16];
  (void)std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

int run_top(const TopOptions& o) {
  const std::filesystem::path shm_dir =
      o.shm_dir.empty() ? default_shm_dir() : std::filesystem::path(o.shm_dir);
  if (o.json) {
    nlohmann::json engines = nlohmann::json::array();
    for (const EngineSnapshot& e : snapshot_engines(shm_dir)) engines.push_back(engine_json(e));
    nlohmann::json pools = nlohmann::json::array();
    for (const pool::PoolObservation& p : pool::observe_pools(shm_dir))
      pools.push_back(pool_json(p));
    emit(true, {{"shm_dir", shm_dir.string()}, {"engines", engines}, {"pools", pools}}, "");
    return kExitOk;
  }
  TopHeader header{.shm_dir = shm_dir, .interval_seconds = o.interval, .clock = local_clock()};
  RateTracker rates;
  if (o.once || ::isatty(STDOUT_FILENO) == 0) {
    // One snapshot, no escape sequences: what a pipe or a log wants.
    header.interactive = false;
    const std::vector<EngineSnapshot> engines = snapshot_engines(shm_dir);
    rates.update(engines, RateTracker::Clock::now());
    std::string text;
    for (const std::string& line : render_top(engines, rates, header)) text += line + "\n";
    for (const pool::PoolObservation& p : pool::observe_pools(shm_dir)) text += pool_text(p);
    std::cout << text << std::flush;
    return kExitOk;
  }

  TerminalScreen screen(STDIN_FILENO, STDOUT_FILENO);
  const auto interval = std::chrono::milliseconds(static_cast<std::int64_t>(o.interval * 1000));
  for (std::uint64_t frame = 1;; ++frame) {
    const std::vector<EngineSnapshot> engines = snapshot_engines(shm_dir);
    rates.update(engines, RateTracker::Clock::now());
    header.clock = local_clock();
    std::vector<std::string> lines = render_top(engines, rates, header);
    for (const pool::PoolObservation& p : pool::observe_pools(shm_dir)) {
      std::istringstream in(pool_text(p));
      for (std::string line; std::getline(in, line);) lines.push_back(line);
    }
    screen.draw(lines);
    if (o.frames != 0 && frame >= o.frames) return kExitOk;
    const auto next = std::chrono::steady_clock::now() + interval;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          next - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      const TerminalScreen::Event event = screen.wait(left);
      if (event == TerminalScreen::Event::kQuit) return kExitOk;
      if (event == TerminalScreen::Event::kSignal) return 128 + screen.signal_number();
      if (event == TerminalScreen::Event::kRedraw) break;
    }
  }
}

const CommandRegistrar kRegisterTop("top", [](CLI::App& top) {
  auto* app = top.add_subcommand(
      "top", "Live view of every engine on this node: occupancy, hits, GB/s, bring-up (q quits)");
  auto o = std::make_shared<TopOptions>();
  app->add_option("--shm-dir", o->shm_dir,
                  "Directory of the region files (default $KVOFFLOAD_SHM_DIR, else /dev/shm)")
      ->type_name("DIR");
  app->add_option("--interval", o->interval, "Seconds between frames (default 1)")
      ->check(real_range(0.05, 3600, "seconds"))
      ->type_name("SECONDS");
  app->add_flag("--once", o->once,
                "Print one snapshot as plain text and exit (the default when stdout is not a "
                "terminal)");
  app->add_option("--frames", o->frames, "Exit after N frames (default: until q)")
      ->check(whole_range(1, std::uint64_t{1} << 32))
      ->type_name("N");
  app->add_flag("--json", o->json, "Print one JSON object (every engine, as region list --json)");
  return Command{app, [o] { return run_top(*o); }};
});

}  // namespace
}  // namespace kvoffload::cli
