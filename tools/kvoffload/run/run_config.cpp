#include "run_config.hpp"

#include <kvoffload/error.hpp>
#include <kvoffload/geometry.hpp>
#include <kvoffload/platform.hpp>

#include <limits>
#include <string>

namespace kvoffload::run {

void RunConfig::finalize() {
  if (backend != "host" && backend != "cuda" && backend != "hip" && backend != "auto") {
    throw_invalid("--backend '" + backend + "' is not a backend; use host, cuda, hip or auto");
  }
  // The range of each flag is checked when the command line is parsed (cmd_run.cpp); what is
  // left depends on several flags together.
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
  const RegionGeometry one_row =
      RegionGeometry::compute({.num_chunks = 1, .slot_bytes = slot_bytes, .world_size = world_size},
                              platform::page_size());
  num_chunks = host_pool_bytes / one_row.row_stride();
  if (num_chunks < max_request_chunks()) {
    throw_invalid("--host-pool " + std::to_string(host_pool_bytes) + " holds " +
                  std::to_string(num_chunks) + " chunks of " + std::to_string(one_row.row_stride()) +
                  " bytes (world size x layers x block bytes x blocks per chunk, page-rounded); one "
                  "request needs " + std::to_string(max_request_chunks()) +
                  ": give a larger --host-pool or smaller blocks");
  }
}

void to_json(nlohmann::json& j, const RunConfig& c) {
  j = nlohmann::json{{"engine_id", c.engine_id},     {"shm_dir", c.shm_dir},
                     {"backend", c.backend},         {"world_size", c.world_size},
                     {"layers", c.layers},           {"block_bytes", c.block_bytes},
                     {"blocks_per_chunk", c.blocks_per_chunk},
                     {"gpu_blocks", c.gpu_blocks},   {"host_pool_bytes", c.host_pool_bytes},
                     {"seed", c.seed},               {"populate_threads", c.populate_threads},
                     {"slot_bytes", c.slot_bytes},   {"num_chunks", c.num_chunks}};
}

void from_json(const nlohmann::json& j, RunConfig& c) {
  j.at("engine_id").get_to(c.engine_id);
  j.at("shm_dir").get_to(c.shm_dir);
  j.at("backend").get_to(c.backend);
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
}

}  // namespace kvoffload::run
