#pragma once
// The node pool file, byte for byte (docs/DESIGN.md §6.6), and the structures over it that every
// pool source shares: the slot records (the source of truth), the key table and the lists (both
// derived from the records, rebuilt by repair: Note [Pool repair] in pool_repair.cpp).
//
//   [PoolHeader][TenantRecord x max_tenants][SlotRecord x slot_count][pin counts
//   u16 x slot_count x max_tenants][key table u64 x buckets][GhostRecord x slot_count]
//   [ghost key table u64 x buckets] ... page ...
//   [rank 0's range][rank 1's range] ... [rank W-1's range]
//
// Note [Pool layout]: the chunk bytes are rank-major. Rank r's range (rank_stride bytes, a page
// multiple, starting on a page) holds rank r's slot of every chunk, chunk s at s x slot_stride;
// chunk s of rank r is at data_offset + r x rank_stride + s x slot_stride. So a rank's slots are
// one contiguous range: a rank process maps and registers only its own range, 1/W of the chunk
// bytes, instead of all of them (version 1 was chunk-major, a chunk's ranks side by side, and
// every rank registered the whole area). Slots start 256-aligned (vector copies, as in the
// region: Note [Slot alignment]).
//
// Every field is changed only under the header's mutex. Offsets, never pointers: each process
// maps the file at its own address.

#include <pthread.h>

#include <cstddef>
#include <cstdint>

#include <kvoffload/block_key.hpp>
#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/node_pool.hpp>

namespace kvoffload::pool::detail {

inline constexpr char kPoolMagic[8] = {'K', 'V', 'O', 'P', 'O', 'O', 'L', '\0'};
// 2: rank-major chunk bytes (Note [Pool layout]; 1 was chunk-major), the eviction policy and
// ARC's lists. A file of another version is refused by joiners, and removed when stale (nobody
// attached), by a joiner or `region clean`.
inline constexpr std::uint32_t kPoolVersion = 2;
inline constexpr std::uint32_t kNone = 0xFFFFFFFFu;
inline constexpr std::size_t kNameChars = 128;

struct PoolHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t max_tenants;
  // Geometry and fingerprint (PoolGeometry), NUL-terminated strings.
  std::uint64_t slot_bytes;
  std::uint32_t slot_count;
  std::uint32_t world_size;
  char layout[32];
  char dtype[32];
  char fingerprint[256];
  // Where everything is (bytes from the start of the file).
  std::uint64_t slot_stride;  // bytes between consecutive chunks' slots in a rank's range
  std::uint64_t rank_stride;  // bytes of one rank's range, between ranks' ranges (page multiple)
  std::uint64_t chunk_bytes;  // bytes one chunk occupies: world_size x slot_stride
  std::uint64_t tenants_offset;
  std::uint64_t slots_offset;
  std::uint64_t pins_offset;
  std::uint64_t table_offset;
  std::uint64_t table_buckets;  // power of two >= 2 * slot_count (the ghost table's too)
  std::uint64_t ghosts_offset;
  std::uint64_t ghost_table_offset;
  std::uint64_t data_offset;
  std::uint64_t file_bytes;

  pthread_mutex_t mutex;    // process-shared, robust
  std::int32_t holder_pid;  // who holds the mutex (written after taking it), 0 when free
  std::uint32_t reserved0;

  // The lists (heads are the most recent end). The evictable (ready, unpinned) slots are in
  // list[slot.list]: under LRU list 0 is the LRU and list 1 stays empty; under ARC they are T1
  // and T2 (Note [Pool ARC] in pool_arc.cpp).
  std::uint32_t list_head[2], list_tail[2];
  std::uint32_t free_head, free_tail;  // free slots
  // Derived counters (rebuilt by repair).
  std::uint32_t n_free, n_writing, n_ready, n_pinned;
  std::uint64_t clock;  // last recency stamp given
  std::uint64_t epoch;  // last protection epoch given (one per prepare_stores)
  std::uint64_t next_token;
  std::uint64_t last_sweep_ns;  // CLOCK_MONOTONIC of the last liveness sweep
  std::uint64_t repairs;
  std::uint64_t tenants_reclaimed;

  // The eviction policy (PolicyKind, fixed at creation) and ARC's state (Note [Pool ARC]).
  std::uint32_t policy;
  std::uint32_t n_list[2];  // ARC |T1|, |T2|: writing + ready slots by list (derived)
  std::uint32_t ghost_head[2], ghost_tail[2];  // B1, B2 (heads most recent)
  std::uint32_t ghost_free;                    // the free ghost records, a stack through next
  std::uint32_t n_ghost[2];                    // |B1|, |B2| (derived)
  std::uint32_t reserved1;
  std::uint64_t arc_target;                   // p, the adaptive target of |T1|: 0 .. slot_count
  std::uint64_t ghosts_kept, ghosts_cleared;  // repairs that kept / rebuilt the ghosts empty
};

struct TenantRecord {
  std::uint32_t in_use;  // 1 once pid, start_time and engine_id are written
  std::int32_t pid;
  std::uint64_t start_time;  // /proc/PID/stat field 22: a recycled PID has another
  std::uint64_t engine_hash;
  std::uint32_t cap_slots;           // 0: no cap
  std::uint32_t occupancy;           // slots owned (writing + ready), derived
  std::uint32_t lru_head, lru_tail;  // this tenant's ready, unpinned slots (head most recent)
  std::uint32_t pinned;              // slots with a pin of this tenant, derived
  std::uint32_t reserved0;
  char engine_id[kNameChars + 1];
  char reserved1[7];
  std::uint64_t lookup_keys, hits, cross_engine_hits, stores_prepared, stores_committed,
      stores_aborted, evictions, pins;
};

struct SlotRecord {
  std::uint64_t key_hi, key_lo;
  std::uint64_t stamp;         // recency; the LRU is ordered by it
  std::uint64_t engine_hash;   // of the engine that stored it (cross-engine hits)
  std::uint64_t pin_mask;      // bit t: pins[slot][t] > 0 (derived from the counts)
  std::uint64_t protect;       // epoch of the prepare_stores that must not evict it
  std::uint32_t state;         // SlotState
  std::uint32_t owner;         // tenant index (writing: always; ready: kNone once it left)
  std::uint32_t prev, next;    // the LRU or the free list
  std::uint32_t oprev, onext;  // the owner's LRU
  std::uint32_t list;          // writing or ready: 0 (the LRU; ARC's T1) or 1 (ARC's T2)
  std::uint32_t reserved0;

  [[nodiscard]] BlockKey key() const noexcept { return {key_hi, key_lo}; }
};

// One ARC ghost: a key evicted from T1 (B1) or T2 (B2), no chunk (Note [Pool ARC]).
struct GhostRecord {
  std::uint64_t key_hi, key_lo;
  std::uint32_t list;        // 0: free; 1: B1; 2: B2
  std::uint32_t prev, next;  // its list (free: the free stack, next only)
  std::uint32_t reserved0;

  [[nodiscard]] BlockKey key() const noexcept { return {key_hi, key_lo}; }
};

// Sizes and offsets of a pool of this geometry.
struct Layout {
  std::uint64_t slot_stride, rank_stride, chunk_bytes, tenants_offset, slots_offset, pins_offset,
      table_offset, table_buckets, ghosts_offset, ghost_table_offset, data_offset, file_bytes;
};
Layout compute_layout(std::uint64_t slot_bytes, std::uint32_t slot_count, std::uint32_t world_size,
                      std::uint32_t max_tenants, std::uint64_t page);

// Pointers into one process's mapping.
struct View {
  PoolHeader* h = nullptr;
  TenantRecord* tenants = nullptr;
  SlotRecord* slots = nullptr;
  std::uint16_t* pins = nullptr;
  std::uint64_t* table = nullptr;
  GhostRecord* ghosts = nullptr;
  std::uint64_t* ghost_table = nullptr;
  std::byte* data = nullptr;

  void bind(void* base) noexcept;
  [[nodiscard]] std::uint32_t n() const noexcept { return h->slot_count; }
  [[nodiscard]] std::uint32_t tenants_n() const noexcept { return h->max_tenants; }
  std::uint16_t& pin(std::uint32_t slot, std::uint32_t tenant) const noexcept {
    return pins[static_cast<std::size_t>(slot) * h->max_tenants + tenant];
  }

  // ---- the key table: open addressing, 32 hash bits + slot per entry, backward-shift delete
  [[nodiscard]] std::uint32_t find(const BlockKey& key) const noexcept;
  void insert(const BlockKey& key, std::uint32_t slot) const noexcept;
  void erase(const BlockKey& key, std::uint32_t slot) const noexcept;
  void clear_table() const noexcept;
  // ... and the ghost key table (ghost record indices), the same way.
  [[nodiscard]] std::uint32_t ghost_find(const BlockKey& key) const noexcept;
  void ghost_insert(const BlockKey& key, std::uint32_t g) const noexcept;
  void ghost_erase(const BlockKey& key, std::uint32_t g) const noexcept;
  void clear_ghost_table() const noexcept;
  // No ghosts: every ghost record free (record 0 first out), the ghost table empty.
  void reset_ghosts() const noexcept;

  // ---- the lists: the global ones (evictable or free, prev/next), the owner's LRU
  // (oprev/onext) and the ghost lists (GhostRecord prev/next)
  void push_front(std::uint32_t& head, std::uint32_t& tail, std::uint32_t s) const noexcept;
  void push_back(std::uint32_t& head, std::uint32_t& tail, std::uint32_t s) const noexcept;
  void remove(std::uint32_t& head, std::uint32_t& tail, std::uint32_t s) const noexcept;
  void opush_front(TenantRecord& t, std::uint32_t s) const noexcept;
  void opush_back(TenantRecord& t, std::uint32_t s) const noexcept;
  void oremove(TenantRecord& t, std::uint32_t s) const noexcept;
  void gpush_front(std::uint32_t list, std::uint32_t g) const noexcept;  // list 0: B1, 1: B2
  void gremove(std::uint32_t list, std::uint32_t g) const noexcept;

  // An evictable (ready, unpinned) slot joins its list (list[slot.list]: the LRU, T1 or T2) and
  // its owner's LRU at the most recent end with a fresh stamp; leaving takes it out of both.
  void lru_enter(std::uint32_t s) const noexcept;
  void lru_leave(std::uint32_t s) const noexcept;
};

// FNV-1a of the engine id: which engine stored a chunk (cross-engine hits survive a restart).
std::uint64_t engine_hash(const char* id) noexcept;

}  // namespace kvoffload::pool::detail
