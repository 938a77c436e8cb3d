// The geometry's canonical text and option validation (no network, no dependency: in every build).
// URLs: remote_url.cpp; the fingerprint (xxh3 of describe()): remote_value.cpp.
#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "tier/remote/remote_value.hpp"

namespace kvoffload {

std::string RemoteGeometry::describe() const {
  return "kvoffload-remote format=" + std::to_string(detail::kRemoteFormatVersion) +
         " slot_bytes=" + std::to_string(slot_bytes) + " world_size=" + std::to_string(world_size) +
         " replicated=" + (replicated ? "1" : "0") + " block_bytes=" + std::to_string(block_bytes) +
         " blocks_per_chunk=" + std::to_string(blocks_per_chunk) + " dtype=" + dtype +
         " layout=" + tensor_layout;
}

std::uint64_t remote_value_bytes(std::uint64_t slot_bytes) noexcept {
  return slot_bytes + detail::kRemoteHeaderBytes;
}

void RemoteTierOptions::validate() const {
  if (url.nodes.empty()) throw_invalid("remote tier: the URL names no node");
  if (geometry.slot_bytes == 0) throw_invalid("remote tier: geometry.slot_bytes is 0");
  if (geometry.world_size == 0) throw_invalid("remote tier: geometry.world_size is 0");
  if (geometry.slot_stride != 0 && geometry.slot_stride < geometry.slot_bytes) {
    throw_invalid("remote tier: geometry.slot_stride " + std::to_string(geometry.slot_stride) +
                  " is smaller than slot_bytes " + std::to_string(geometry.slot_bytes) +
                  "; give the region's slot stride, or 0 for packed slots");
  }
  // Redis refuses bulk strings over 512 MiB (proto-max-bulk-len).
  if (geometry.slot_bytes > (512ULL << 20) - detail::kRemoteHeaderBytes) {
    throw_invalid("remote tier: slot_bytes " + std::to_string(geometry.slot_bytes) +
                  " exceeds the 512 MiB value limit of the stores");
  }
  auto positive = [](const char* field, std::chrono::milliseconds v) {
    if (v.count() <= 0) {
      throw_invalid(std::string("remote tier: ") + field + " is " + std::to_string(v.count()) +
                    " ms; it must be > 0");
    }
  };
  positive("connect_timeout", connect_timeout);
  positive("lookup_timeout", lookup_timeout);
  positive("get_timeout", get_timeout);
  positive("put_timeout", put_timeout);
  positive("breaker_backoff", breaker_backoff);
  positive("warn_interval", warn_interval);
  if (negative_ttl.count() < 0) throw_invalid("remote tier: negative_ttl is negative");
  if (breaker_backoff_max < breaker_backoff) {
    throw_invalid("remote tier: breaker_backoff_max " +
                  std::to_string(breaker_backoff_max.count()) + " ms is below breaker_backoff " +
                  std::to_string(breaker_backoff.count()) + " ms");
  }
  if (connections_per_node < 1 || connections_per_node > 64) {
    throw_invalid("remote tier: connections_per_node " + std::to_string(connections_per_node) +
                  " is out of range; allowed 1..64");
  }
  if (breaker_failures < 1) throw_invalid("remote tier: breaker_failures is 0; it must be >= 1");
  const std::uint64_t value = remote_value_bytes(geometry.slot_bytes);
  if (max_inflight_bytes < value) {
    throw_invalid("remote tier: max_inflight_bytes " + std::to_string(max_inflight_bytes) +
                  " cannot hold one value of " + std::to_string(value) + " bytes");
  }
  if (max_queued_bytes < max_inflight_bytes) {
    throw_invalid("remote tier: max_queued_bytes " + std::to_string(max_queued_bytes) +
                  " is below max_inflight_bytes " + std::to_string(max_inflight_bytes));
  }
  if (presence_capacity < 1) throw_invalid("remote tier: presence_capacity is 0");
  if (url.kind == RemoteKind::kMemcached && value > memcached_item_max) {
    throw_invalid("remote tier: a value of " + std::to_string(value) + " bytes (slot " +
                  std::to_string(geometry.slot_bytes) +
                  " + 64-byte header) exceeds memcached's item size " +
                  std::to_string(memcached_item_max) +
                  "; start memcached with -I of at least the value size plus 1 KiB (e.g. -I " +
                  std::to_string(((value + 1024 + (1 << 20) - 1) >> 20)) +
                  "m) and set memcached_item_max to it");
  }
}

}  // namespace kvoffload
