// C API over the remote tier's configuration (kvoffload::RemoteTierOptions).
#include <kvoffload/remote_tier.hpp>

#include "capi/capi_internal.hpp"

using kvoffload::capi::guarded;
using kvoffload::capi::invalid_arg;

static_assert(KVO_REMOTE_REDIS == static_cast<int>(kvoffload::RemoteKind::kRedis));
static_assert(KVO_REMOTE_REDIS_CLUSTER == static_cast<int>(kvoffload::RemoteKind::kRedisCluster));
static_assert(KVO_REMOTE_MEMCACHED == static_cast<int>(kvoffload::RemoteKind::kMemcached));

namespace {

kvoffload::RemoteTierOptions to_cpp(const kvo_remote_tier_options* o, const char* fn) {
  if (o->struct_size != sizeof(kvo_remote_tier_options)) {
    invalid_arg(fn, "options->struct_size",
                "is " + std::to_string(o->struct_size) + ", expected " +
                    std::to_string(sizeof(kvo_remote_tier_options)) +
                    " (initialise it with kvo_remote_tier_options_init)");
  }
  if (o->url == nullptr) invalid_arg(fn, "options->url", "is NULL");
  kvoffload::RemoteTierOptions r;
  r.url = kvoffload::RemoteUrl::parse(o->url);
  r.geometry.slot_bytes = o->slot_bytes;
  r.geometry.world_size = o->world_size;
  r.geometry.replicated = o->replicated != 0;
  r.geometry.tensor_layout = o->tensor_layout != nullptr ? o->tensor_layout : "";
  r.geometry.block_bytes = o->block_bytes;
  r.geometry.blocks_per_chunk = o->blocks_per_chunk;
  r.geometry.dtype = o->dtype != nullptr ? o->dtype : "bytes";
  using ms = std::chrono::milliseconds;
  r.connect_timeout = ms(o->connect_timeout_ms);
  r.lookup_timeout = ms(o->lookup_timeout_ms);
  r.get_timeout = ms(o->get_timeout_ms);
  r.put_timeout = ms(o->put_timeout_ms);
  r.max_inflight_bytes = o->max_inflight_bytes;
  r.max_queued_bytes = o->max_queued_bytes;
  r.connections_per_node = o->connections_per_node;
  r.breaker_failures = o->breaker_failures;
  r.breaker_backoff = ms(o->breaker_backoff_ms);
  r.breaker_backoff_max = ms(o->breaker_backoff_max_ms);
  r.negative_ttl = ms(o->negative_ttl_ms);
  r.memcached_item_max = o->memcached_item_max;
  r.validate();
  return r;
}

}  // namespace

extern "C" {

kvo_status kvo_remote_tier_options_init(kvo_remote_tier_options* options) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    const kvoffload::RemoteTierOptions d;
    *options = kvo_remote_tier_options{};
    options->struct_size = sizeof(kvo_remote_tier_options);
    options->world_size = d.geometry.world_size;
    options->connect_timeout_ms = static_cast<uint32_t>(d.connect_timeout.count());
    options->lookup_timeout_ms = static_cast<uint32_t>(d.lookup_timeout.count());
    options->get_timeout_ms = static_cast<uint32_t>(d.get_timeout.count());
    options->put_timeout_ms = static_cast<uint32_t>(d.put_timeout.count());
    options->max_inflight_bytes = d.max_inflight_bytes;
    options->max_queued_bytes = d.max_queued_bytes;
    options->connections_per_node = d.connections_per_node;
    options->breaker_failures = d.breaker_failures;
    options->breaker_backoff_ms = static_cast<uint32_t>(d.breaker_backoff.count());
    options->breaker_backoff_max_ms = static_cast<uint32_t>(d.breaker_backoff_max.count());
    options->negative_ttl_ms = static_cast<uint32_t>(d.negative_ttl.count());
    options->memcached_item_max = d.memcached_item_max;
  });
}

kvo_status kvo_remote_tier_options_validate(const kvo_remote_tier_options* options) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    (void)to_cpp(options, fn);
  });
}

kvo_status kvo_remote_tier_url_info(const kvo_remote_tier_options* options,
                                    kvo_remote_kind* out_kind, size_t* out_nodes) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    KVO_ARG(out_kind);
    KVO_ARG(out_nodes);
    const kvoffload::RemoteTierOptions r = to_cpp(options, fn);
    *out_kind = static_cast<kvo_remote_kind>(r.url.kind);
    *out_nodes = r.url.nodes.size();
  });
}

kvo_status kvo_remote_tier_fingerprint(const kvo_remote_tier_options* options,
                                       uint64_t* out_fingerprint) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    KVO_ARG(out_fingerprint);
    *out_fingerprint = to_cpp(options, fn).geometry.fingerprint();
  });
}

uint64_t kvo_remote_value_bytes(uint64_t slot_bytes) {
  return kvoffload::remote_value_bytes(slot_bytes);
}

}  // extern "C"
