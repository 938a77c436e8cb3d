#pragma once
// The requests `kvoffload run` replays: each request is a shared prefix (one of `prefixes`
// families, popular ones more often, Zipf-like) of a random length, followed by chunks unique to
// the request. Keys are derived like an engine's prefix hashes: the same family and position give
// the same key, so requests sharing a prefix hit the same chunks.

#include <cstdint>
#include <random>
#include <vector>

#include <kvoffload/block_key.hpp>

namespace kvoffload::run {

class Workload {
 public:
  Workload(std::uint64_t seed, std::uint32_t prefixes, std::uint32_t prefix_chunks,
           std::uint32_t unique_chunks);

  // Keys of the next request, in prefix order (valid until the next call).
  const std::vector<BlockKey>& next();

 private:
  std::uint64_t seed_;
  std::uint32_t prefix_chunks_;
  std::uint32_t unique_chunks_;
  std::uint64_t request_ = 0;
  std::mt19937_64 rng_;
  std::discrete_distribution<std::uint32_t> family_;
  std::vector<BlockKey> keys_;
};

}  // namespace kvoffload::run
