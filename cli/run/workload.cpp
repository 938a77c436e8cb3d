#include "workload.hpp"

#include <kvoffload/hash.hpp>

namespace kvoffload::run {
namespace {

std::vector<double> zipf_weights(std::uint32_t n) {
  std::vector<double> w(n);
  for (std::uint32_t i = 0; i < n; ++i) w[i] = 1.0 / (1.0 + i);
  return w;
}

}  // namespace

Workload::Workload(std::uint64_t seed, std::uint32_t prefixes, std::uint32_t prefix_chunks,
                   std::uint32_t unique_chunks)
    : seed_(seed),
      prefix_chunks_(prefix_chunks),
      unique_chunks_(unique_chunks),
      rng_(seed),
      family_([&] {
        const auto w = zipf_weights(prefixes);
        return std::discrete_distribution<std::uint32_t>(w.begin(), w.end());
      }()) {
  keys_.reserve(prefix_chunks + unique_chunks);
}

const std::vector<BlockKey>& Workload::next() {
  keys_.clear();
  const std::uint64_t family = family_(rng_);
  const std::uint32_t shortest = (prefix_chunks_ + 1) / 2;
  std::uniform_int_distribution<std::uint32_t> length(shortest, prefix_chunks_);
  const std::uint32_t shared = length(rng_);
  for (std::uint32_t i = 0; i < shared; ++i) {
    keys_.emplace_back(splitmix64(seed_ ^ (family << 20)), splitmix64(family * 4096 + i));
  }
  for (std::uint32_t i = 0; i < unique_chunks_; ++i) {
    keys_.emplace_back(splitmix64(~seed_ ^ request_), splitmix64((request_ << 16) + i));
  }
  ++request_;
  return keys_;
}

}  // namespace kvoffload::run
