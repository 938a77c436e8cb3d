#pragma once
// Configuration of `kvoffload run`, the end-to-end offload cycle (docs/OPERATING.md: "The main
// job").
// The scheduler validates it, derives the geometry, and sends it to every worker as JSON.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvoffload::run {

struct RunConfig {
  std::string engine_id;         // default run-<pid>
  std::string shm_dir;           // empty: default_shm_dir()
  std::string backend = "auto";  // host | sim | cuda | hip | auto
  // Devices of the ranks, comma-separated (rank r takes entry r mod count); empty: rank r on
  // device r mod the backend's device count.
  std::string devices;
  std::uint32_t world_size = 2;           // rank processes
  std::uint32_t layers = 8;               // KV tensors per rank (one per layer, K and V packed)
  std::uint64_t block_bytes = 16 * 1024;  // bytes of one GPU block of one layer on one rank
  std::uint32_t blocks_per_chunk = 4;
  std::uint64_t gpu_blocks = 512;  // device cache blocks per layer per rank
  std::uint64_t host_pool_bytes = 64ULL << 20;
  double duration_seconds = 5.0;    // 0: no time limit (then requests must be > 0)
  std::uint64_t requests = 0;       // 0: until duration
  std::uint32_t prefixes = 16;      // distinct shared prefixes in the workload
  std::uint32_t prefix_chunks = 8;  // longest shared prefix, in chunks
  std::uint32_t unique_chunks = 2;  // chunks unique to each request
  std::uint64_t seed = 1;
  std::string file_tier;  // non-empty: a secondary file tier under this directory
  std::uint64_t file_tier_bytes = 1ULL << 30;  // its capacity (oldest records go beyond it)
  std::string remote_tier;  // non-empty: a distributed tier at this URL (redis://...)
  // How long a request waits for the store's existence answer before it counts as a miss
  // (RemoteTierOptions::lookup_timeout).
  std::uint64_t remote_lookup_budget_ms = 50;
  // memcached's item size limit (its -I) for a memcached:// remote tier; 0: not given, memcached's
  // default of 1 MiB (RemoteTierOptions::memcached_item_max).
  std::uint64_t memcached_item_bytes = 0;
  // Wait after every request until the secondary tiers finished writing what it stored (and its
  // offload pins are released) before the next request. Without it the next requests race the
  // tiers' asynchronous writes: a chunk still being written is pinned, so what is evicted (and
  // later promoted) depends on the machine's speed. With it (and --bringup blocking) the same
  // seed makes the same decisions on any machine; the tiers' write time then counts in the run.
  bool wait_for_tiers = false;
  unsigned populate_threads = 1;
  // Note [Progressive bring-up]: "background" serves from the start on the rows every rank made
  // ready; "blocking" populates and registers everything before the first request.
  std::string bringup = "background";
  std::uint64_t bringup_piece_bytes = 1ULL << 30;
  bool json = false;
  // Note [Run on a node pool]: non-empty: the scheduler is a tenant of the node pool of this name
  // (kvoffload_<pool>.pool in shm_dir) instead of owning a private region; the ranks map the
  // pool's chunk bytes.
  std::string pool;
  // After its last request, a run on a pool stays attached (its chunks stay for runs that join
  // later) until this many seconds pass, or until the other tenants it saw have all left.
  double pool_linger_seconds = 0;
  // The node pool's eviction policy ("lru" or "arc", fixed by its creator) and this run's cap, a
  // fraction of the pool's chunks (0: none).
  std::string pool_policy = "lru";
  double pool_cap_fraction = 0;

  // Derived (computed by finalize()).
  std::uint64_t slot_bytes = 0;  // layers · block_bytes · blocks_per_chunk
  std::uint64_t num_chunks = 0;  // host_pool_bytes / row_stride
  // Set by the scheduler after it attached the pool, for the ranks (NodePool::rank_range): rank
  // r's slots are the pool file's bytes from pool_data_offset + r * pool_rank_stride, one range
  // of pool_rank_stride bytes, chunk c at c * pool_slot_stride in it.
  std::uint64_t pool_slot_stride = 0;
  std::uint64_t pool_rank_stride = 0;
  std::uint64_t pool_data_offset = 0;

  // Validates every field (kInvalidArgument naming the flag, the value and what is allowed) and
  // computes slot_bytes and num_chunks from the page size.
  void finalize();
  // Part of finalize(): --gpu-blocks x --block-bytes x --layers per rank must fit 64 bits, and in
  // RAM for the host and sim backends (kInvalidArgument naming the three flags).
  void check_device_bytes() const;
  // --devices as numbers (empty: none given); the rank's worker picks its entry and checks it
  // against the devices it finds (WorkerConfig::devices).
  [[nodiscard]] std::vector<int> device_list() const;
  [[nodiscard]] std::uint64_t max_request_chunks() const noexcept {
    return static_cast<std::uint64_t>(prefix_chunks) + unique_chunks;
  }
};

void to_json(nlohmann::json& j, const RunConfig& c);
void from_json(const nlohmann::json& j, RunConfig& c);

}  // namespace kvoffload::run
