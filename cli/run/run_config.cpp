#include "run_config.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/geometry.hpp>
#include <kvoffload/node_pool.hpp>
#include <kvoffload/platform.hpp>
#include <kvoffload/remote_tier.hpp>

#include "../cli.hpp"
#include "../shm_fs.hpp"

namespace kvoffload::run {
namespace {

[[noreturn]] void bad_device(const std::string& list, const std::string& item) {
  throw_invalid("--devices '" + list + "': '" + item +
                "' is not a device number; give comma-separated numbers from 0 to 1023, e.g. 0,1");
}

// "0,1,3" as numbers; kInvalidArgument naming the entry otherwise.
std::vector<int> parse_devices(const std::string& list) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 1023) bad_device(list, item);
    out.push_back(static_cast<int>(v));
    pos = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<int> RunConfig::device_list() const {
  return devices.empty() ? std::vector<int>{} : parse_devices(devices);
}

void RunConfig::check_device_bytes() const {
  // Each rank allocates --layers device tensors of --gpu-blocks x --block-bytes: a product that
  // cannot exist is refused here, naming the flags, not as a failed allocation of N bytes.
  const std::string product = "--gpu-blocks " + std::to_string(gpu_blocks) + " x --block-bytes " +
                              cli::format_size(block_bytes) + " x --layers " +
                              std::to_string(layers);
  const std::uint64_t max_u64 = std::numeric_limits<std::uint64_t>::max();
  if (gpu_blocks > max_u64 / block_bytes || gpu_blocks * block_bytes > max_u64 / layers) {
    throw_invalid(product +
                  " of device memory per rank overflows 64 bits; give fewer --gpu-blocks");
  }
  const std::uint64_t per_rank = gpu_blocks * block_bytes * layers;
  // The host and sim backends keep "device" memory in this machine's RAM: more than it has can
  // never be allocated. A GPU's own memory is checked when the rank allocates it.
  // --backend auto (the default) is the host backend on a machine without a GPU backend: asked
  // only when the size is past the RAM, so a fitting run never probes a device here.
  const std::uint64_t ram = cli::physical_memory_bytes();
  const bool past_ram = ram != 0 && (per_rank > ram || per_rank * world_size > ram);
  std::string in_ram = backend;
  if (past_ram && backend == "auto") in_ram = probe_backend("auto").name;
  if (in_ram == "host" || in_ram == "sim") {
    if (past_ram) {
      throw_invalid(product + " = " + cli::human_bytes(per_rank) + " of device memory per rank (" +
                    std::to_string(world_size) + " ranks) is more than this machine's " +
                    cli::human_bytes(ram) + " of RAM, where the " + in_ram + " backend" +
                    (backend == "auto" ? " (--backend auto here)" : "") +
                    " keeps it; give fewer --gpu-blocks");
    }
  }
}

void RunConfig::finalize() {
  // The range of each flag is checked when the command line is parsed (cmd_run.cpp); what is
  // left depends on several flags together, or is not a number.
  if (backend != "host" && backend != "sim" && backend != "cuda" && backend != "hip" &&
      backend != "auto") {
    throw_invalid("--backend '" + backend + "' is not a backend; use host, sim, cuda, hip or auto");
  }
  if (!devices.empty()) (void)parse_devices(devices);
  if (bringup != "background" && bringup != "blocking") {
    throw_invalid("--bringup '" + bringup + "' is not a bring-up mode; use background or blocking");
  }
  std::optional<RemoteUrl> remote_url;
  if (!remote_tier.empty()) {
    try {
      remote_url = RemoteUrl::parse(remote_tier);
    } catch (const Error& e) {
      throw_invalid(std::string("--remote-tier: ") + e.what());
    }
  }
  const bool memcached = remote_url && remote_url->kind == RemoteKind::kMemcached;
  if (memcached_item_bytes != 0 && !memcached) {
    throw_invalid("--memcached-item-size " + cli::format_size(memcached_item_bytes) +
                  " applies to a memcached:// --remote-tier only" +
                  (remote_url ? "; this run's is " + remote_url->to_string()
                              : std::string("; this run has no --remote-tier")));
  }
  if (!pool.empty()) {
    try {
      (void)pool::pool_path(shm_dir.empty() ? std::string(".") : shm_dir, pool);
    } catch (const Error& e) {
      throw_invalid("--pool '" + pool + "': " + e.what());
    }
    // Note [Run on a node pool]: the pool is the only host tier of such a run.
    if (!file_tier.empty()) {
      throw_invalid("--pool " + pool + " and --file-tier " + file_tier +
                    " cannot be combined: a run on a node pool has no secondary tiers; drop one");
    }
    if (!remote_tier.empty()) {
      throw_invalid("--pool " + pool + " and --remote-tier " + remote_tier +
                    " cannot be combined: a run on a node pool has no secondary tiers; drop one");
    }
    if (pool_policy != "lru" && pool_policy != "arc") {
      throw_invalid("--pool-policy '" + pool_policy + "' is unknown; it must be lru or arc");
    }
  } else if (pool_linger_seconds != 0) {
    throw_invalid("--pool-linger applies to a run on a node pool only; this run has no --pool");
  } else if (pool_policy != "lru") {
    throw_invalid(
        "--pool-policy applies to a run on a node pool only; this run has no --pool "
        "(a private region's Manager uses ARC)");
  } else if (pool_cap_fraction != 0) {
    throw_invalid("--pool-cap applies to a run on a node pool only; this run has no --pool");
  }
  if (duration_seconds == 0 && requests == 0) {
    throw_invalid("--duration 0 needs --requests N > 0, or the run would never end");
  }
  // A request's load and store use disjoint device blocks: both must fit in the cache.
  const std::uint64_t needed_blocks = 2 * max_request_chunks() * blocks_per_chunk;
  if (gpu_blocks < needed_blocks || gpu_blocks > (1ULL << 32)) {
    throw_invalid("--gpu-blocks " + std::to_string(gpu_blocks) + " cannot hold one request: " +
                  "allowed " + std::to_string(needed_blocks) + ".." + std::to_string(1ULL << 32) +
                  " (2 x (prefix-chunks + unique-chunks) x blocks-per-chunk)");
  }
  const std::uint64_t max_u64 = std::numeric_limits<std::uint64_t>::max();
  if (block_bytes > max_u64 / layers || block_bytes * layers > max_u64 / blocks_per_chunk) {
    throw_invalid("--layers x --block-bytes x --blocks-per-chunk overflows");
  }
  slot_bytes = block_bytes * layers * blocks_per_chunk;
  check_device_bytes();
  if (memcached) {
    // Checked here, before anything is created, so the message names this program's flag
    // (RemoteTierOptions::validate() names the library's field).
    const std::uint64_t item = memcached_item_bytes != 0 ? memcached_item_bytes : 1ULL << 20;
    const std::uint64_t value = remote_value_bytes(slot_bytes);
    if (value > item) {
      const std::uint64_t mib = (value + 1024 + (1ULL << 20) - 1) >> 20;
      throw_invalid("--remote-tier " + remote_url->to_string() + ": a value is " +
                    cli::human_bytes(value) + " (a slot of " + cli::human_bytes(slot_bytes) +
                    " + its 64-byte header), larger than memcached's item size " +
                    cli::human_bytes(item) +
                    (memcached_item_bytes != 0 ? std::string(" (--memcached-item-size)")
                                               : std::string(" (memcached's default -I)")) +
                    "; start memcached with -I " + std::to_string(mib) +
                    "m or more and pass --memcached-item-size " + std::to_string(mib) +
                    "M, or make slots smaller (--layers x --block-bytes x --blocks-per-chunk)");
    }
  }
  const RegionGeometry one_row = RegionGeometry::compute(
      {.num_chunks = 1, .slot_bytes = slot_bytes, .world_size = world_size}, platform::page_size());
  num_chunks = host_pool_bytes / one_row.row_stride();
  // The Manager's slot limit (manager.cpp): a SlotIndex is 32 bits and kNoSlot is reserved.
  constexpr std::uint64_t kMaxManagerChunks = 0xFFFFFFFEULL;
  if (num_chunks > kMaxManagerChunks) {
    throw_invalid(
        "--host-pool " + cli::format_size(host_pool_bytes) + " would hold " +
        std::to_string(num_chunks) + " chunks of " + cli::format_size(one_row.row_stride()) +
        "; at most " + std::to_string(kMaxManagerChunks) +
        " chunks are allowed (a slot index is 32 bits): give at most --host-pool " +
        cli::human_bytes(kMaxManagerChunks * one_row.row_stride()) + ", or larger chunks");
  }
  if (num_chunks < max_request_chunks()) {
    throw_invalid(
        "--host-pool " + cli::human_bytes(host_pool_bytes) + " holds " +
        std::to_string(num_chunks) + " chunks of " + cli::human_bytes(one_row.row_stride()) +
        " (world size x layers x block bytes x blocks per chunk, page-rounded); one "
        "request needs " +
        std::to_string(max_request_chunks()) + ": give a larger --host-pool (at least " +
        cli::human_bytes(max_request_chunks() * one_row.row_stride()) + ") or smaller blocks");
  }
}

void to_json(nlohmann::json& j, const RunConfig& c) {
  j = nlohmann::json{{"engine_id", c.engine_id},
                     {"shm_dir", c.shm_dir},
                     {"backend", c.backend},
                     {"devices", c.devices},
                     {"world_size", c.world_size},
                     {"layers", c.layers},
                     {"block_bytes", c.block_bytes},
                     {"blocks_per_chunk", c.blocks_per_chunk},
                     {"gpu_blocks", c.gpu_blocks},
                     {"host_pool_bytes", c.host_pool_bytes},
                     {"seed", c.seed},
                     {"populate_threads", c.populate_threads},
                     {"slot_bytes", c.slot_bytes},
                     {"num_chunks", c.num_chunks},
                     {"bringup", c.bringup},
                     {"bringup_piece_bytes", c.bringup_piece_bytes},
                     {"pool", c.pool},
                     {"pool_slot_stride", c.pool_slot_stride},
                     {"pool_rank_stride", c.pool_rank_stride},
                     {"pool_data_offset", c.pool_data_offset}};
}

void from_json(const nlohmann::json& j, RunConfig& c) {
  j.at("engine_id").get_to(c.engine_id);
  j.at("shm_dir").get_to(c.shm_dir);
  j.at("backend").get_to(c.backend);
  j.at("devices").get_to(c.devices);
  j.at("world_size").get_to(c.world_size);
  j.at("layers").get_to(c.layers);
  j.at("block_bytes").get_to(c.block_bytes);
  j.at("blocks_per_chunk").get_to(c.blocks_per_chunk);
  j.at("gpu_blocks").get_to(c.gpu_blocks);
  j.at("host_pool_bytes").get_to(c.host_pool_bytes);
  j.at("seed").get_to(c.seed);
  j.at("populate_threads").get_to(c.populate_threads);
  j.at("slot_bytes").get_to(c.slot_bytes);
  j.at("num_chunks").get_to(c.num_chunks);
  j.at("bringup").get_to(c.bringup);
  j.at("bringup_piece_bytes").get_to(c.bringup_piece_bytes);
  j.at("pool").get_to(c.pool);
  j.at("pool_slot_stride").get_to(c.pool_slot_stride);
  j.at("pool_rank_stride").get_to(c.pool_rank_stride);
  j.at("pool_data_offset").get_to(c.pool_data_offset);
}

}  // namespace kvoffload::run
