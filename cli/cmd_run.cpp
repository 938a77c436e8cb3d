// `kvoffload run`: the main job, an end-to-end offload cycle (see run/scheduler.hpp), and the
// hidden `run-worker` subcommand its rank processes run.
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <memory>

#include <kvoffload/region.hpp>

#include "cli.hpp"
#include "run/run_config.hpp"
#include "run/scheduler.hpp"
#include "run/worker.hpp"
#include "shm_fs.hpp"

namespace kvoffload::cli {
namespace {

// Ranges are checked as the command line is parsed (the messages name flag, value and range);
// RunConfig::finalize() then checks what depends on several flags (--gpu-blocks, --host-pool).
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

// The ranks and their KV cache: world size, layers, blocks, host pool, backend and devices.
void add_geometry_options(CLI::App& app, run::RunConfig& config) {
  app.add_option("--world-size", config.world_size, "Rank processes")
      ->capture_default_str()
      ->check(whole_range(1, 64));
  app.add_option("--layers", config.layers, "KV tensors per rank (one per layer)")
      ->capture_default_str()
      ->check(whole_range(1, 1024));
  add_size_option(app, "--block-bytes", config.block_bytes,
                  "Bytes of one GPU block of one layer on one rank (default 16K)", 1, 64ULL << 20);
  app.add_option("--blocks-per-chunk", config.blocks_per_chunk, "GPU blocks per host chunk")
      ->capture_default_str()
      ->check(whole_range(1, 1024));
  app.add_option("--gpu-blocks", config.gpu_blocks, "Device cache blocks per layer per rank")
      ->capture_default_str()
      ->check(whole_range(1, 1ULL << 32));
  add_size_option(app, "--host-pool", config.host_pool_bytes, "Host region size (default 64M)", 1,
                  kU64Max);
  app.add_option("--backend", config.backend, "host, sim, cuda, hip or auto (auto never picks sim)")
      ->capture_default_str();
  app.add_option(
      "--devices", config.devices,
      "Devices of the ranks, comma-separated (rank r takes entry r mod count); default: rank r "
      "on device r mod the device count");
}

// The requests: how long or how many, their prefixes and unique chunks, the seed.
void add_workload_options(CLI::App& app, run::RunConfig& config) {
  app.add_option("--duration", config.duration_seconds, "Seconds to run (0: use --requests)")
      ->capture_default_str()
      ->check(real_range(0.0, 24 * 3600.0, "seconds"));
  app.add_option("--requests", config.requests, "Requests to run (0: until --duration)")
      ->capture_default_str()
      ->check(whole_range(0, kU64Max));
  app.add_option("--prefixes", config.prefixes, "Distinct shared prefixes")
      ->capture_default_str()
      ->check(whole_range(1, 1U << 20));
  app.add_option("--prefix-chunks", config.prefix_chunks, "Longest shared prefix in chunks")
      ->capture_default_str()
      ->check(whole_range(1, 4096));
  app.add_option("--unique-chunks", config.unique_chunks, "Chunks unique to each request")
      ->capture_default_str()
      ->check(whole_range(0, 4096));
  app.add_option("--seed", config.seed, "Workload seed")
      ->capture_default_str()
      ->check(whole_range(0, kU64Max));
}

// Where the chunks go: the engine id and shm dir of the region, the file and remote tiers.
void add_store_options(CLI::App& app, run::RunConfig& config) {
  app.add_option("--engine-id", config.engine_id,
                 "Engine id: 1..128 of [A-Za-z0-9._-] (default run-<pid>)")
      ->type_name("ID")
      ->check(engine_id_check());
  app.add_option("--shm-dir", config.shm_dir,
                 "Directory of the region (default $KVOFFLOAD_SHM_DIR or /dev/shm)");
  app.add_option("--file-tier", config.file_tier,
                 "Directory of a secondary file tier (off by default)");
  add_size_option(app, "--file-tier-bytes", config.file_tier_bytes,
                  "Capacity of the file tier (default 1G)", 1, kU64Max);
  app.add_option("--remote-tier", config.remote_tier,
                 "Distributed tier shared with other engines: redis://host:port[/db], "
                 "redis-cluster://host:port[,...] or memcached://host:port[,...] (off by default)");
  app.add_option("--remote-lookup-budget", config.remote_lookup_budget_ms,
                 "Milliseconds a request waits for the remote store's existence answer before "
                 "the chunk counts as a miss")
      ->capture_default_str()
      ->check(whole_range(1, 60'000));
  add_size_option(app, "--memcached-item-size", config.memcached_item_bytes,
                  "memcached's item size limit, its -I (default 1M), for a memcached:// "
                  "--remote-tier: a slot plus a 64-byte header must fit",
                  1ULL << 10, 1ULL << 30);
}

// How the pool comes up (threads, background or blocking, pieces), and --pool instead of a
// private region.
void add_bringup_options(CLI::App& app, run::RunConfig& config) {
  app.add_option("--threads", config.populate_threads, "Populate threads")
      ->capture_default_str()
      ->check(whole_range(1, 256));
  app.add_option("--bringup", config.bringup,
                 "background: serve at once on the rows every rank made ready while the pool comes "
                 "up in pieces; blocking: bring the whole pool up first")
      ->capture_default_str();
  add_size_option(
      app, "--bringup-piece", config.bringup_piece_bytes,
      "Region bytes of the largest bring-up piece (default 1G; the first is 64M or this, "
      "whichever is less, and each next one doubles)",
      1, std::uint64_t{1} << 50);
  app.add_flag("--wait-for-tiers", config.wait_for_tiers,
               "Wait for the secondary tiers' writes after every request (with --bringup "
               "blocking the same seed then makes the same decisions on any machine)");
  app.add_option("--pool", config.pool,
                 "Run as a tenant of the node pool NAME (kvoffload_NAME.pool in the shm dir), "
                 "shared with every other run given the same --pool (each its own --engine-id, "
                 "the same geometry and --seed), instead of a private region")
      ->type_name("NAME");
  app.add_option("--pool-linger", config.pool_linger_seconds,
                 "With --pool: after the last request, stay attached (the chunks stay for runs "
                 "that join later) up to this many seconds, or until the other tenants seen "
                 "meanwhile have all left")
      ->capture_default_str()
      ->check(real_range(0.0, 24 * 3600.0, "seconds"));
  app.add_option("--pool-policy", config.pool_policy,
                 "With --pool: the node-wide eviction policy, lru or arc; fixed by the run that "
                 "creates the pool, a run asking for the other one is refused")
      ->capture_default_str();
  app.add_option("--pool-cap", config.pool_cap_fraction,
                 "With --pool: this run's cap, a fraction (0, 1] of the pool's chunks; at its cap "
                 "it evicts only its own chunks (0: no cap)")
      ->capture_default_str()
      ->check(real_range(0.0, 1.0, "of the pool"));
}

// The command itself, once the command line is parsed: the flags that depend on each other, the
// run, and its report or its failure.
int run_command(run::RunConfig& config, const CLI::App& app) {
  // Note [Run on a node pool]: the pool's chunk bytes exist in full once the
  // pool is attached, so its ranks bring up blocking.
  if (!config.pool.empty() && app.count("--bringup") > 0 && config.bringup == "background") {
    throw_invalid("--pool " + config.pool +
                  " and --bringup background cannot be combined: a run on a "
                  "node pool maps and registers the pool's chunk bytes before "
                  "its first request; drop --bringup");
  }
  if (!config.pool.empty()) config.bringup = "blocking";
  if (config.engine_id.empty()) config.engine_id = "run-" + std::to_string(::getpid());
  if (config.shm_dir.empty()) config.shm_dir = default_shm_dir().string();
  config.finalize();
  warn_if_disk_shm_dir(config.shm_dir);
  const run::RunOutcome outcome = run::run_scheduler(config);
  if (outcome.failure.empty()) {
    emit(config.json, outcome.report, run::format_report(outcome.report));
    return outcome.exit_code;
  }
  return emit_failure(config.json, outcome.report,
                      outcome.verdict_only ? std::string() : run::format_report(outcome.report),
                      "run_failed", "run: " + outcome.failure, outcome.exit_code);
}

const CommandRegistrar kRegisterRun("run", [](CLI::App& top) {
  auto* app = top.add_subcommand(
      "run",
      "End-to-end offload cycle: a scheduler and W rank processes share one region; requests with "
      "shared prefixes are stored, evicted under pressure and loaded back into other device "
      "blocks, "
      "and every byte that comes back is verified");
  auto config = std::make_shared<run::RunConfig>();
  add_geometry_options(*app, *config);
  add_workload_options(*app, *config);
  add_store_options(*app, *config);
  add_bringup_options(*app, *config);
  app->add_flag("--json", config->json, "Print one JSON object");
  return Command{app, [config, app] { return run_command(*config, *app); }};
});

const CommandRegistrar kRegisterWorker("run-worker", [](CLI::App& top) {
  auto* app = top.add_subcommand("run-worker", "A rank process of `kvoffload run` (internal)");
  app->group("");  // hidden from --help
  auto fd = std::make_shared<int>(-1);
  app->add_option("--fd", *fd, "Channel to the scheduler")
      ->required()
      ->check(whole_range(0, static_cast<std::uint64_t>(std::numeric_limits<int>::max())));
  return Command{app, [fd] { return run::run_worker(*fd); }};
});

}  // namespace
}  // namespace kvoffload::cli
