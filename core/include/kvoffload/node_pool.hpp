#pragma once
// NodePool: one KV chunk pool per node, shared by every engine (tenant) that attaches to it, with
// no server process (docs/DESIGN.md §6.6).
//
// The pool is one file in the shm dir, `kvoffload_<name>.pool`, mapped MAP_SHARED by every
// tenant. It holds the index (key -> chunk slot, one node-wide eviction policy: LRU or ARC,
// per-tenant pins) and the chunk bytes, rank-major: rank r's slot of every chunk lies in one
// contiguous range of the file (rank_range(r)), so a rank process maps and registers only its own
// 1/world_size of them. Every index operation runs under one process-shared robust mutex in the
// file:
//  - a tenant killed anywhere (inside an operation, holding pins, while writing a chunk) is
//    detected by the next operation of any live tenant (EOWNERDEAD, or its PID and start time no
//    longer alive) and the index is repaired from the slot records (Note [Pool repair]);
//  - a stopped (SIGSTOP) holder makes operations fail after PoolOptions::lock_timeout with
//    kTimeout naming its PID and state, never hang.
//
// Slot states: free -> writing (prepare_stores) -> ready (commit_stores); writing -> free
// (abort_stores, or its tenant died); ready -> free when evicted (by the pool's policy, LRU or
// ARC, never while pinned by any tenant). A writing chunk is invisible to lookups and is never
// written twice: a store of a key that is present or being written is skipped.
//
// Threading: one NodePool object is thread-compatible (a scheduler calls it from one thread);
// any number of NodePool objects, in any processes, may share one pool. A NodePool must not be
// used in a child forked after it was attached: the child attaches its own.
//
// Views returned by the calls point into buffers the object reuses, valid until its next call.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <kvoffload/block_key.hpp>
#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/export.h>

namespace kvoffload::pool {

// What every tenant of one pool must agree on; a joiner that differs in any field is refused
// (kMismatch) with an error naming the pool's value and the joiner's.
struct PoolGeometry {
  std::uint64_t slot_bytes = 0;  // bytes one rank keeps for one chunk: 1 .. 2^40
  std::uint32_t slot_count = 0;  // chunks the pool holds: 1 .. 2^31
  std::uint32_t world_size = 1;  // ranks per engine: 1 .. 1024; a chunk is world_size slots
  std::string layout;            // the engine's KV layout name ("layer_major"): 1 .. 31 chars
  std::string dtype;             // the KV dtype ("bf16"): 1 .. 31 chars
  std::string fingerprint;       // model fingerprint / key namespace: 1 .. 255 chars
};

// The index operations, for the step hook.
enum class Op : std::uint8_t {
  kAttach = 0,
  kLookup = 1,
  kPrepare = 2,
  kCommit = 3,
  kAbort = 4,
  kUnpin = 5,
  kDetach = 6,
  kRepair = 7,  // the repair a lock acquisition runs after a dead holder or tenant
};
inline constexpr int kOpCount = 8;
KVOFFLOAD_API std::string_view to_string(Op op) noexcept;

// Called with the pool's lock held at every numbered step of every index operation: after the
// lock is taken (step 0) and after each change to the shared index. Tests kill or stop the
// process there (tests/pool/crash_test.cpp); null in production.
using StepHook = void (*)(void* context, Op op, std::uint32_t step);

struct PoolOptions {
  std::string name;               // the pool: 1..128 of [A-Za-z0-9._-], not "." or ".."
  std::filesystem::path shm_dir;  // empty: default_shm_dir() ($KVOFFLOAD_SHM_DIR or /dev/shm)
  std::string engine_id;          // this tenant: same rule as name; unique among live tenants
  PoolGeometry geometry;
  // The node-wide eviction policy, fixed when the pool is created (docs/DESIGN.md §6.6): LRU, or
  // ARC as the private Manager's (T1/T2, ghosts B1/B2, adaptive target). A joiner that asks for
  // the other one is refused (kMismatch naming both), as for the geometry.
  PolicyKind policy = PolicyKind::kLru;
  std::uint32_t max_tenants = 16;  // tenant records, used by the creator only: 1 .. 64
  // Per-tenant cap on the chunks it occupies (writing + ready): a tenant at its cap evicts only
  // its own chunks, so it cannot push every other tenant's working set out. Both 0: no cap; at
  // most one of them non-zero. cap_bytes counts whole chunks (world_size * slot_bytes each).
  std::uint64_t cap_bytes = 0;
  double cap_fraction = 0;  // (0, 1] of slot_count
  // Longest wait for the index lock (and for a departing tenant's removal of the file) before
  // an operation fails with kTimeout naming the holder's PID: 1 ms .. 1 h.
  std::chrono::milliseconds lock_timeout{5000};
  // How often an operation checks the other tenants' liveness (PID + start time) to reclaim
  // pins and writing slots of tenants that died outside the lock: 0 .. 1 h (0: every operation).
  std::chrono::milliseconds sweep_interval{1000};
  StepHook step_hook = nullptr;
  void* step_context = nullptr;
};

struct LookupOutcome {
  std::uint32_t hits = 0;                // length of the ready prefix
  std::uint32_t cross_engine_hits = 0;   // ... of which another engine stored
  std::span<const std::uint32_t> slots;  // slots of the prefix (pinned for this tenant if asked)
};

struct StoreOutcome {
  std::span<const std::uint32_t> positions;  // keys[positions[i]] goes to slots[i]
  std::span<const std::uint32_t> slots;      // now writing, owned by this tenant
  std::span<const BlockKey> evicted;         // keys evicted to make room
  std::uint32_t skipped_present = 0;         // ready already (stored by anyone)
  std::uint32_t skipped_writing = 0;         // being written (by anyone, also earlier in the call)
  std::uint32_t skipped_no_room = 0;         // every other slot is pinned, writing or protected
  std::uint32_t skipped_cap = 0;             // this tenant is at its cap with nothing to evict
};

enum class SlotState : std::uint32_t { kFree = 0, kWriting = 1, kReady = 2 };

// One slot as the index records it (snapshot(), for tests and tools).
struct SlotView {
  std::uint32_t slot = 0;
  SlotState state = SlotState::kFree;
  BlockKey key;
  std::uint32_t owner = 0;     // tenant index, kNoTenant for none (a departed tenant's ready chunk)
  std::uint64_t pin_mask = 0;  // bit t: pinned by tenant t
  std::uint64_t stamp = 0;     // recency: larger is more recent
  std::uint32_t list = 0;      // writing or ready: 0 (LRU; ARC's T1) or 1 (ARC's T2)
};

// ARC's state (arc_state(), for tests and tools); under LRU everything is in t1, no ghosts.
struct ArcState {
  std::uint64_t target = 0;          // p, the adaptive target of |T1|
  std::uint64_t t1 = 0, t2 = 0;      // residents (writing + ready) by list
  std::vector<BlockKey> b1, b2;      // the ghosts, most recent first
  std::uint64_t ghosts_kept = 0;     // repairs that found the ghosts consistent and kept them
  std::uint64_t ghosts_cleared = 0;  // ... that found them half-changed and rebuilt them empty
};
inline constexpr std::uint32_t kNoTenant = 0xFFFFFFFFu;

struct TenantStats {
  std::uint32_t index = 0;
  std::string engine_id;
  std::int32_t pid = 0;
  std::uint64_t lookup_keys = 0;
  std::uint64_t hits = 0;
  std::uint64_t cross_engine_hits = 0;  // hits on chunks another engine stored
  std::uint64_t stores_prepared = 0;
  std::uint64_t stores_committed = 0;
  std::uint64_t stores_aborted = 0;
  std::uint64_t evictions = 0;  // chunks this tenant's stores evicted
  std::uint64_t pins = 0;       // pins taken, cumulative
  std::uint64_t pinned = 0;     // slots this tenant pins now
  std::uint64_t occupancy = 0;  // slots it owns now (writing + ready)
  std::uint64_t cap_slots = 0;  // 0: no cap
  bool alive = true;            // its process runs (observe_pools: false for a dead one's record)
};

struct PoolStats {
  std::uint64_t slot_count = 0;
  std::uint64_t free = 0;
  std::uint64_t writing = 0;
  std::uint64_t ready = 0;
  std::uint64_t pinned = 0;   // ready slots pinned by at least one tenant
  std::uint64_t repairs = 0;  // repairs after a dead lock holder or tenant
  std::uint64_t tenants_reclaimed = 0;
  PolicyKind policy = PolicyKind::kLru;
  std::uint64_t arc_target = 0;      // ARC's p (0 under LRU)
  std::uint64_t recent = 0;          // ARC |T1| (LRU: every resident)
  std::uint64_t frequent = 0;        // ARC |T2|
  std::uint64_t ghost_recent = 0;    // ARC |B1|
  std::uint64_t ghost_frequent = 0;  // ARC |B2|
  std::vector<TenantStats> tenants;  // live tenants, by index
};

// One rank's part of the chunk bytes (NodePool::rank_range): its slot of chunk s is at
// data + s * slot_stride. A rank process that does not attach maps only [file_offset,
// file_offset + bytes) of the pool file (both page multiples) and registers that with its device.
struct RankRange {
  std::byte* data = nullptr;      // in this tenant's mapping: chunk(0, rank)
  std::uint64_t bytes = 0;        // slot_count * slot_stride rounded up to a page
  std::uint64_t file_offset = 0;  // where the range starts in the pool file
  std::uint64_t slot_stride = 0;
};

namespace detail {
class PoolImpl;
}

class KVOFFLOAD_API NodePool {
 public:
  // Creates the pool file or joins it. Refuses (nothing changed, nothing left behind): bad
  // options (kInvalidArgument), a pool of another geometry or fingerprint (kMismatch naming both
  // values), a file that is not this user's pool (kPermission / kMismatch), a live tenant with
  // the same engine id (kInUse naming its PID), a full tenant table (kCapacity), too little space
  // in the shm dir (kCapacity), a lock not free in time (kTimeout).
  static NodePool attach(const PoolOptions& options);
  ~NodePool();  // detach()
  NodePool(NodePool&&) noexcept;
  NodePool& operator=(NodePool&&) noexcept;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  // The ready prefix of keys; each of its chunks is touched (keys[0] ends most recent) or, with
  // pin, pinned for this tenant (then not evictable until unpin). Writing chunks end the prefix.
  LookupOutcome lookup(std::span<const BlockKey> keys, bool pin);
  // Allocates writing slots for the keys that are neither ready nor being written, in call
  // order, taking free slots first and evicting an unpinned ready chunk otherwise (the policy's
  // choice: the least recent under LRU; ARC's REPLACE; never one of the keys of this call). Stores
  // as many as fit: a key that finds no room is counted as skipped, never an error.
  StoreOutcome prepare_stores(std::span<const BlockKey> keys);
  // One scheduler step under one lock acquisition: lookup(keys, pin) and prepare_stores of the
  // keys after the hit prefix. store.positions index keys.
  struct Cycle {
    LookupOutcome lookup;
    StoreOutcome store;
  };
  Cycle lookup_and_prepare(std::span<const BlockKey> keys, bool pin);

  // writing -> ready (most recent), for slots this tenant prepared. kState (nothing changed)
  // when a slot is not writing, not this tenant's, or repeated.
  void commit_stores(std::span<const std::uint32_t> slots);
  // writing -> free, same checks.
  void abort_stores(std::span<const std::uint32_t> slots);
  // Releases one pin of this tenant per occurrence. kState (nothing changed) when a slot is not
  // pinned that often by this tenant.
  void unpin(std::span<const std::uint32_t> slots);

  // Checks every other tenant's liveness now and repairs if one died; returns how many were
  // reclaimed.
  std::uint32_t reclaim_dead_tenants();

  // Leaves: drops this tenant's pins and writing slots (its ready chunks stay, owned by nobody)
  // and removes the file when it was the last tenant. Idempotent, never throws.
  void detach() noexcept;

  // The bytes of rank `rank`'s slot of chunk `slot` (slot_bytes of them):
  // rank_range(rank).data + slot * slot_stride().
  [[nodiscard]] std::byte* chunk(std::uint32_t slot, std::uint32_t rank = 0) const;
  // Bytes between consecutive chunks' slots in one rank's range: slot_bytes rounded up to 256.
  [[nodiscard]] std::uint64_t slot_stride() const noexcept;
  // Rank `rank`'s slot of every chunk, one range (kInvalidArgument for a rank >= world_size).
  [[nodiscard]] RankRange rank_range(std::uint32_t rank) const;
  [[nodiscard]] const PoolGeometry& geometry() const noexcept;
  [[nodiscard]] const std::filesystem::path& path() const noexcept;
  [[nodiscard]] std::uint32_t tenant_index() const noexcept;
  [[nodiscard]] bool attached() const noexcept;

  [[nodiscard]] PoolStats stats();
  [[nodiscard]] std::vector<SlotView> snapshot();
  [[nodiscard]] ArcState arc_state();
  // Every invariant of the shared index (Note [Pool invariants]); empty when all hold.
  [[nodiscard]] std::vector<std::string> check_invariants();

 private:
  explicit NodePool(std::unique_ptr<detail::PoolImpl> impl);
  std::unique_ptr<detail::PoolImpl> impl_;
};

// shm_dir / "kvoffload_<name>.pool" (validates the name).
KVOFFLOAD_API std::filesystem::path pool_path(const std::filesystem::path& shm_dir,
                                              const std::string& name);

// A pool as a monitor sees it (`kvoffload region list`, `top`, the exporter): read through a
// PROT_READ mapping without the lock and without a tenant slot, so it never writes, never waits
// on a stopped holder and never changes what the tenants see (Note [Pool observer]). Each field
// is one aligned load; the set may straddle an operation in progress.
struct PoolObservation {
  std::filesystem::path path;
  std::string name;       // from kvoffload_<name>.pool
  std::string problem;    // not empty: named like a pool but unreadable (why); the rest is empty
  PoolGeometry geometry;  // slot_count etc. as the pool's header records them
  PoolStats stats;        // tenants: every record in use, alive or not (TenantStats::alive)
  bool stale = false;     // no recorded tenant is alive: `region clean` removes it
};
// Every kvoffload_*.pool file in shm_dir, by name.
KVOFFLOAD_API std::vector<PoolObservation> observe_pools(const std::filesystem::path& shm_dir);

// Removes the pool at path when nobody is attached (the joiners' stale-file rule, Note [Pool
// file lifetime]: its exclusive flock is free) and it is provably a pool of this user; returns
// whether it removed it. A pool in use is never touched.
KVOFFLOAD_API bool remove_stale_pool(const std::filesystem::path& path);

}  // namespace kvoffload::pool
