#pragma once
// Manager: which KV chunks live in the host region's chunk slots (docs/DESIGN.md §6).
//
// The scheduler side of an engine asks the Manager, per request, which prefix of its chunk keys is
// already offloaded (lookup), pins that prefix while the workers load it (prepare_load /
// complete_load), and reserves slots for the rest (prepare_store / complete_store).
//
// Slot states:  free -> write-pending (prepare_store) -> ready (complete_store success)
//               write-pending -> free (complete_store failure)
//               ready <-> ready+pinned by n readers (prepare_load / complete_load, refcounted)
//               ready (unpinned) -> free (evicted by a later prepare_store, or reset)
// Only ready, unpinned chunks are evictable.
//
// Rules the Manager enforces (every violation throws kvoffload::Error and changes nothing; every
// call that takes keys validates all of them before it changes anything):
//  - complete_store: each key must be write-pending (kNotFound if unknown, kState if ready).
//  - prepare_load: each key must be ready (kNotFound if unknown, kState if write-pending).
//  - complete_load: each key must be pinned, at least as many times as it appears (kState).
//  - reset: refused (kState) while any store is pending or any chunk is pinned: a worker may
//    still be copying into or out of those slots.
// Running out of room is not an error: prepare_store returns a StorePlan whose status says
// "cannot store" and why, with nothing changed.
//
// Threading: thread-compatible, not thread-safe. The scheduler calls it from one thread; callers
// that share one Manager between threads serialise the calls themselves (the C API does).
//
// Memory: everything is allocated at construction (slot array, key index, policy lists, ghost
// lists, threshold tracker). Calls write into caller buffers or return views into buffers the
// Manager reuses; those grow only when a call has more keys than any before it. A view is valid
// until the next call of the same method (or reset / destruction); take_events' view until the
// next take_events.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <kvoffload/block_key.hpp>
#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/export.h>

namespace kvoffload {

class LivePageSink;  // kvoffload/live_page.hpp (a Region is one)

// Whose rules the Manager follows. Note [vLLM semantics] in manager.cpp lists every difference.
enum class ManagerSemantics : std::uint8_t {
  // Slots: the most recently freed one first (evicted, failed stores, in the order they were
  // freed), slot 0 first after construction and reset (the reference model in
  // tests/manager/model_test.cpp holds the Manager to this order).
  kNative = 0,
  // vLLM's CPUOffloadingManager, output for output (the Python adapter kvoffload.vllm relies on
  // it): slots fresh in ascending order, then the most recently freed; the policies keep pinned
  // and write-pending chunks in place (make_vllm_policy); the threshold tracker forgets the key
  // looked up least recently; complete_store skips keys that are not write-pending; reset is
  // allowed with stores or loads in flight, records no event and keeps the threshold counts;
  // num_chunks may be 0 (vLLM sizes a cache too small for one block to 0 blocks and runs with it:
  // every store that needs a slot is refused).
  kVllm = 1,
};
KVOFFLOAD_API std::string_view to_string(ManagerSemantics semantics) noexcept;

struct ManagerConfig {
  std::uint64_t num_chunks = 0;  // slots in the region; 1 .. 2^32-2 (0 too with kVllm)
  PolicyKind policy = PolicyKind::kLru;
  // 0: store every key offered. N >= 1: a key is stored only once lookup() has seen it at least
  // N times (as a miss or a hit, counting the current request's lookup). Counts live in a bounded
  // tracker; when it is full, the key that entered it first is forgotten.
  std::uint32_t store_threshold = 0;
  // Keys the threshold tracker remembers; 0 picks max(num_chunks, 1024). Ignored without threshold.
  std::uint64_t threshold_tracker_capacity = 0;
  // Record stored/removed events for take_events(). Off: nothing is recorded (the caller does not
  // drain, and the queue would otherwise grow).
  bool record_events = true;
  ManagerSemantics semantics = ManagerSemantics::kNative;
  // Slots [0, ready_chunks) may be handed out from the start; nullopt: all of them. A region that
  // comes up progressively (RegionOptions::bringup) starts with the rows ready on every rank and
  // grows the prefix with set_ready_chunks(); before a row is ready its slot is never allocated,
  // so lookups of its keys miss and stores that find no ready room are skipped (kCannotStore).
  std::optional<std::uint64_t> ready_chunks;
};

enum class LookupResult : std::uint8_t {
  kMiss = 0,
  kHit = 1,         // ready: can be loaded now
  kHitPending = 2,  // a store of this key is in flight: present, not loadable yet
};
KVOFFLOAD_API std::string_view to_string(LookupResult result) noexcept;

enum class StoreStatus : std::uint8_t {
  kOk = 0,           // slots allocated (possibly zero, when every key was present or skipped)
  kCannotStore = 1,  // nothing allocated, nothing evicted; see reason
};

enum class CannotStoreReason : std::uint8_t {
  kNone = 0,
  // Not enough free or evictable slots: the rest are pinned by readers, write-pending, or
  // protected by this call.
  kNoEvictableSpace = 1,
  // The call has more new keys than the region has slots.
  kTooManyKeys = 2,
};
KVOFFLOAD_API std::string_view to_string(CannotStoreReason reason) noexcept;

// Result of prepare_store: views into buffers the Manager reuses (valid until the next
// prepare_store, reset or destruction).
struct KVOFFLOAD_API StorePlan {
  StoreStatus status = StoreStatus::kOk;
  CannotStoreReason reason = CannotStoreReason::kNone;
  std::span<const BlockKey> keys;            // keys to store now, in call order, each once
  std::span<const std::uint32_t> positions;  // keys[i] is the call's keys[positions[i]]
  std::span<const SlotIndex> slots;          // slots[i] receives keys[i]; now write-pending
  std::span<const BlockKey> evicted;         // keys evicted to make room (also a `removed` event)
  std::span<const SlotIndex> evicted_slots;  // the slots they held, evicted[i] in evicted_slots[i]
  std::uint64_t skipped_present = 0;    // keys dropped: already stored or pending (or repeated)
  std::uint64_t skipped_threshold = 0;  // keys dropped: looked up fewer than store_threshold times
  std::uint64_t slots_needed = 0;       // new keys that wanted a slot
  std::uint64_t slots_available = 0;    // free + evictable-and-unprotected slots at the call

  [[nodiscard]] bool ok() const noexcept { return status == StoreStatus::kOk; }
  // One sentence for logs and errors ("cannot store 12 keys: 3 slots free or evictable, ...").
  [[nodiscard]] std::string describe() const;
};

enum class EventKind : std::uint8_t { kStored = 0, kRemoved = 1 };

// One batch of keys that became stored (complete_store success) or were removed (evicted, reset).
// Within one operation removed batches come before stored ones; batches are in the order the
// operations happened.
struct ManagerEvent {
  EventKind kind = EventKind::kStored;
  std::span<const BlockKey> keys;
};

struct ManagerStats {
  std::uint64_t num_chunks = 0;
  std::uint64_t ready_chunks = 0;     // slots that may be handed out (Note [Ready slots])
  std::uint64_t used = 0;             // slots holding a key (write-pending or ready)
  std::uint64_t write_pending = 0;    // slots with a store in flight
  std::uint64_t pinned = 0;           // ready slots pinned by at least one reader
  std::uint64_t evictable = 0;        // ready, unpinned slots
  double usage = 0;                   // used / num_chunks
  double write_pending_fraction = 0;  // write_pending / num_chunks
  double pinned_fraction = 0;         // pinned / num_chunks

  // Cumulative counters (reset_stats() zeroes them; reset() does not).
  std::uint64_t lookup_keys = 0;      // keys passed to lookup
  std::uint64_t hits = 0;             // ... found ready
  std::uint64_t hits_pending = 0;     // ... found write-pending
  std::uint64_t misses = 0;           // ... not found
  std::uint64_t stores_prepared = 0;  // keys given a slot by prepare_store
  std::uint64_t stores_completed = 0;
  std::uint64_t stores_failed = 0;  // complete_store(success = false) keys
  std::uint64_t stores_skipped_threshold = 0;
  std::uint64_t allocation_failures = 0;  // prepare_store calls that returned kCannotStore
  std::uint64_t evictions = 0;            // keys evicted by prepare_store
  std::uint64_t loads_prepared = 0;       // key pins taken by prepare_load
  std::uint64_t loads_completed = 0;

  PolicyCounters policy;
};

class KVOFFLOAD_API Manager {
 public:
  // Validates the configuration (kInvalidArgument naming the field) before allocating anything.
  explicit Manager(const ManagerConfig& config);
  // Checks a configuration the way the constructor does (kInvalidArgument naming the field),
  // without allocating: builders validate everything before creating any resource.
  static void validate(const ManagerConfig& config);
  // With a policy of the caller's (capacity must equal num_chunks; config.policy is ignored).
  Manager(const ManagerConfig& config, std::unique_ptr<EvictionPolicy> policy);
  ~Manager();
  Manager(Manager&&) noexcept;
  Manager& operator=(Manager&&) noexcept;
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  [[nodiscard]] const ManagerConfig& config() const noexcept;
  [[nodiscard]] std::uint32_t num_chunks() const noexcept;
  [[nodiscard]] const EvictionPolicy& policy() const noexcept;

  // Per key hit / hit-pending / miss into results (size >= keys.size(), or empty to skip), and the
  // length of the hit prefix: the number of leading keys that are kHit. Counts every key toward
  // the store threshold and the statistics. Does not change recency (touch does).
  std::size_t lookup(std::span<const BlockKey> keys, std::span<LookupResult> results = {});

  // Allocates write-pending slots for the keys that are not present (and pass the threshold),
  // evicting as needed, all or nothing. Never evicts a key of this call nor one in
  // `protected_keys` (absent keys there are ignored), nor a pinned or write-pending chunk.
  StorePlan prepare_store(std::span<const BlockKey> keys,
                          std::span<const BlockKey> protected_keys = {});

  // Ends the stores of keys (each write-pending). success: ready and evictable, a `stored` event;
  // failure: the slots are freed and the keys forgotten (no event: they were never announced).
  // Returns the positions in keys of the stores it ended (all of them, in order, under kNative;
  // under kVllm keys that are not write-pending are skipped, as vLLM does). The view is valid
  // until the next complete_store.
  std::span<const std::uint32_t> complete_store(std::span<const BlockKey> keys, bool success);

  // Pins each key (ready) for one reader and writes its slot to slots_out (size >= keys.size()).
  // A pinned chunk is not evictable until every pin is released by complete_load.
  void prepare_load(std::span<const BlockKey> keys, std::span<SlotIndex> slots_out);
  // The same, returning a view of the slots in a buffer the Manager reuses.
  std::span<const SlotIndex> prepare_load(std::span<const BlockKey> keys);
  // Releases one pin per key occurrence.
  void complete_load(std::span<const BlockKey> keys);

  // Marks keys as used now, in prefix order: keys[0] ends most recent. Absent keys are ignored.
  void touch(std::span<const BlockKey> keys);

  // Drops every key (one `removed` event with the ready ones), the policy state and ghost lists
  // and the threshold tracker. Refused while a store is pending or a chunk is pinned (kNative;
  // see ManagerSemantics::kVllm for vLLM's reset_cache).
  void reset();

  // Single-key queries (no statistics, no recency change).
  [[nodiscard]] LookupResult state_of(const BlockKey& key) const noexcept;
  [[nodiscard]] SlotIndex slot_of(const BlockKey& key) const noexcept;  // kNoSlot when absent
  [[nodiscard]] bool contains(const BlockKey& key) const noexcept;
  [[nodiscard]] std::uint32_t pin_count(const BlockKey& key) const noexcept;
  // Lookups the threshold tracker remembers for key (0 when unknown or no threshold).
  [[nodiscard]] std::uint32_t threshold_count(const BlockKey& key) const noexcept;

  // Events recorded since the previous take_events, oldest first; the view (and the key spans in
  // it) stays valid until the next take_events. Empty when record_events is off.
  std::span<const ManagerEvent> take_events();

  [[nodiscard]] ManagerStats stats() const noexcept;
  void reset_stats() noexcept;

  // Slots [0, ready_chunks()) may be handed out. set_ready_chunks(n) grows that prefix (O(n - old),
  // no allocation, never blocks); n must be in [ready_chunks(), num_chunks] (kInvalidArgument).
  [[nodiscard]] std::uint32_t ready_chunks() const noexcept;
  void set_ready_chunks(std::uint64_t n);

  // From now on, mirror occupancy and statistics into `page` (a region's live statistics page:
  // Note [Live stats] in core/src/live/live_page.hpp) after every call that changes them: a few
  // relaxed stores per call, no lock. Other processes read it (`kvoffload region list`, `top`, the
  // exporter). The page's close (the region's close()) stops it. The page must describe
  // num_chunks() chunks (kInvalidArgument otherwise); OffloadStack::build does this for its
  // manager with its region.
  void publish_live_stats(LivePageSink& page);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvoffload
