// C API over kvoffload::Manager and BlockKey.
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include <kvoffload/block_key.hpp>
#include <kvoffload/manager.hpp>

#include "capi/capi_handles.hpp"
#include "capi/capi_internal.hpp"
#include "capi/capi_stats.hpp"

using kvoffload::BlockKey;
using kvoffload::capi::enum_value;
using kvoffload::capi::guarded;
using kvoffload::capi::invalid_arg;

// Both enums are generated from policy_kinds.h; this checks that the C++ side and the C side read
// the list the same way (a hand-written enumerator on either side would fail here).
#define KVO_SAME_POLICY_(value, upper, camel, name) \
  static_assert(KVO_POLICY_##upper == (value) &&    \
                static_cast<int>(kvoffload::PolicyKind::k##camel) == (value));
KVOFFLOAD_POLICY_KINDS(KVO_SAME_POLICY_)
#undef KVO_SAME_POLICY_

namespace {

// The C enumerators for a message: "KVO_POLICY_LRU or KVO_POLICY_ARC".
std::string c_policy_names() {
  static constexpr const char* kNames[] = {
#define KVO_POLICY_C_NAME_(value, upper, camel, name) "KVO_POLICY_" #upper,
      KVOFFLOAD_POLICY_KINDS(KVO_POLICY_C_NAME_)
#undef KVO_POLICY_C_NAME_
  };
  std::string out;
  const std::size_t n = std::size(kNames);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += kNames[i];
  }
  return out;
}

BlockKey to_key(const kvo_block_key& k) noexcept {
  return BlockKey(k.hi, k.lo);
}
kvo_block_key to_c(const BlockKey& k) noexcept {
  return kvo_block_key{k.hi(), k.lo()};
}

// Copies a C key array into `scratch` (reused) and returns it as a span. NULL is allowed only
// for count 0.
std::span<const BlockKey> keys_of(std::vector<BlockKey>& scratch, const kvo_block_key* keys,
                                  size_t count, const char* function, const char* name) {
  if (count == 0) return {};
  if (keys == nullptr) {
    invalid_arg(function, name, "is NULL with count " + std::to_string(count));
  }
  scratch.resize(count);
  for (size_t i = 0; i < count; ++i) scratch[i] = to_key(keys[i]);
  return {scratch.data(), count};
}

void require_out(const void* out, size_t count, const char* function, const char* name) {
  if (count != 0 && out == nullptr) {
    invalid_arg(function, name, "is NULL with count " + std::to_string(count));
  }
}

kvo_manager& handle(kvo_manager_t* manager, const char* function) {
  kvoffload::capi::require_arg(manager, function, "manager");
  return *manager;
}

}  // namespace

extern "C" {

kvo_status kvo_block_key_parse_hex(const char* text, kvo_block_key* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(text);
    KVO_ARG(out);
    *out = to_c(BlockKey::parse_hex(text));
  });
}

kvo_status kvo_block_key_to_hex(kvo_block_key key, char* out, size_t out_size) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(out);
    if (out_size < BlockKey::kHexDigits + 1) {
      invalid_arg(fn, "out_size",
                  "is " + std::to_string(out_size) + "; at least 33 bytes are needed");
    }
    to_key(key).to_hex(out);
    out[BlockKey::kHexDigits] = '\0';
  });
}

kvo_status kvo_manager_options_init(kvo_manager_options* options) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    *options = kvo_manager_options{};
    options->struct_size = sizeof(kvo_manager_options);
    options->policy = KVO_POLICY_LRU;
    options->record_events = 1;
  });
}

kvo_status kvo_manager_create(const kvo_manager_options* options, kvo_manager_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(options);
    KVO_ARG(out);
    if (options->struct_size != sizeof(kvo_manager_options)) {
      invalid_arg(fn, "options",
                  "has struct_size " + std::to_string(options->struct_size) + ", expected " +
                      std::to_string(sizeof(kvo_manager_options)) +
                      " (initialise it with kvo_manager_options_init)");
    }
    kvoffload::ManagerConfig config;
    config.num_chunks = options->num_chunks;
    switch (enum_value(options->policy)) {
#define KVO_POLICY_CASE_(value, upper, camel, name)  \
  case KVO_POLICY_##upper:                           \
    config.policy = kvoffload::PolicyKind::k##camel; \
    break;
      KVOFFLOAD_POLICY_KINDS(KVO_POLICY_CASE_)
#undef KVO_POLICY_CASE_
      default:
        invalid_arg(
            fn, "options->policy",
            "is " + std::to_string(enum_value(options->policy)) + "; use " + c_policy_names());
    }
    config.store_threshold = options->store_threshold;
    config.threshold_tracker_capacity = options->threshold_tracker_capacity;
    config.record_events = options->record_events != 0;
    *out = std::make_unique<kvo_manager>(config).release();
  });
}

void kvo_manager_destroy(kvo_manager_t* manager) {
  delete manager;
}

kvo_status kvo_manager_lookup(kvo_manager_t* manager, const kvo_block_key* keys, size_t count,
                              kvo_lookup_result* results, size_t* out_hit_prefix) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    std::lock_guard lock(h.mutex);
    auto k = keys_of(h.keys, keys, count, fn, "keys");
    std::span<kvoffload::LookupResult> r;
    if (results != nullptr) {
      h.results.resize(count);
      r = {h.results.data(), count};
    }
    const size_t prefix = h.manager.lookup(k, r);
    if (results != nullptr) {
      for (size_t i = 0; i < count; ++i) results[i] = static_cast<kvo_lookup_result>(r[i]);
    }
    if (out_hit_prefix != nullptr) *out_hit_prefix = prefix;
  });
}

kvo_status kvo_manager_prepare_store(kvo_manager_t* manager, const kvo_block_key* keys,
                                     size_t count, const kvo_block_key* protected_keys,
                                     size_t protected_count, kvo_block_key* keys_out,
                                     uint32_t* slots_out, kvo_block_key* evicted_out,
                                     kvo_store_plan* plan) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    KVO_ARG(plan);
    require_out(keys_out, count, fn, "keys_out");
    require_out(slots_out, count, fn, "slots_out");
    std::lock_guard lock(h.mutex);
    auto k = keys_of(h.keys, keys, count, fn, "keys");
    auto p = keys_of(h.protected_keys, protected_keys, protected_count, fn, "protected_keys");
    const kvoffload::StorePlan sp = h.manager.prepare_store(k, p);
    // The plan's arrays hold at most one entry per key given, so `count` bounds them.
    for (size_t i = 0; i < sp.keys.size(); ++i) {
      keys_out[i] = to_c(sp.keys[i]);
      slots_out[i] = sp.slots[i];
    }
    if (evicted_out != nullptr) {
      for (size_t i = 0; i < sp.evicted.size(); ++i) evicted_out[i] = to_c(sp.evicted[i]);
    }
    *plan = kvo_store_plan{sp.ok() ? 1 : 0,    static_cast<kvo_cannot_store_reason>(sp.reason),
                           sp.keys.size(),     sp.evicted.size(),
                           sp.skipped_present, sp.skipped_threshold,
                           sp.slots_needed,    sp.slots_available};
  });
}

kvo_status kvo_manager_complete_store(kvo_manager_t* manager, const kvo_block_key* keys,
                                      size_t count, int success) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    std::lock_guard lock(h.mutex);
    h.manager.complete_store(keys_of(h.keys, keys, count, fn, "keys"), success != 0);
  });
}

kvo_status kvo_manager_prepare_load(kvo_manager_t* manager, const kvo_block_key* keys, size_t count,
                                    uint32_t* slots_out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    require_out(slots_out, count, fn, "slots_out");
    std::lock_guard lock(h.mutex);
    auto k = keys_of(h.keys, keys, count, fn, "keys");
    h.manager.prepare_load(k, std::span<kvoffload::SlotIndex>(slots_out, count));
  });
}

kvo_status kvo_manager_complete_load(kvo_manager_t* manager, const kvo_block_key* keys,
                                     size_t count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    std::lock_guard lock(h.mutex);
    h.manager.complete_load(keys_of(h.keys, keys, count, fn, "keys"));
  });
}

kvo_status kvo_manager_touch(kvo_manager_t* manager, const kvo_block_key* keys, size_t count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    std::lock_guard lock(h.mutex);
    h.manager.touch(keys_of(h.keys, keys, count, fn, "keys"));
  });
}

kvo_status kvo_manager_reset(kvo_manager_t* manager) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    std::lock_guard lock(h.mutex);
    h.manager.reset();
  });
}

kvo_status kvo_manager_query(kvo_manager_t* manager, kvo_block_key key,
                             kvo_lookup_result* out_state, uint32_t* out_slot, uint32_t* out_pins) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    std::lock_guard lock(h.mutex);
    const BlockKey k = to_key(key);
    if (out_state != nullptr) *out_state = static_cast<kvo_lookup_result>(h.manager.state_of(k));
    if (out_slot != nullptr) *out_slot = h.manager.slot_of(k);
    if (out_pins != nullptr) *out_pins = h.manager.pin_count(k);
  });
}

kvo_status kvo_manager_take_events(kvo_manager_t* manager, const kvo_manager_event** out_events,
                                   size_t* out_count) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    KVO_ARG(out_events);
    KVO_ARG(out_count);
    std::lock_guard lock(h.mutex);
    const auto events = h.manager.take_events();
    size_t total = 0;
    for (const auto& e : events) total += e.keys.size();
    // Size both buffers first: the event array points into event_keys, which must not move.
    h.event_keys.resize(total);
    h.events.resize(events.size());
    size_t at = 0;
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& e = events[i];
      for (size_t j = 0; j < e.keys.size(); ++j) h.event_keys[at + j] = to_c(e.keys[j]);
      h.events[i] = kvo_manager_event{
          e.kind == kvoffload::EventKind::kStored ? KVO_EVENT_STORED : KVO_EVENT_REMOVED,
          h.event_keys.data() + at, e.keys.size()};
      at += e.keys.size();
    }
    *out_events = h.events.data();
    *out_count = h.events.size();
  });
}

kvo_status kvo_manager_stats_get(kvo_manager_t* manager, kvo_manager_stats* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    KVO_ARG(out);
    std::lock_guard lock(h.mutex);
    const kvoffload::ManagerStats s = h.manager.stats();
    *out = kvoffload::capi::to_c(s);
  });
}

kvo_status kvo_manager_reset_stats(kvo_manager_t* manager) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& h = handle(manager, fn);
    std::lock_guard lock(h.mutex);
    h.manager.reset_stats();
  });
}

}  // extern "C"
