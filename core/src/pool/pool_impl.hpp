#pragma once
// The node pool's implementation, shared by its sources: node_pool.cpp (the index operations),
// pool_file.cpp (create, join, leave and remove the file), pool_lock.cpp (the bounded robust
// lock), pool_arc.cpp (the eviction policy: LRU or ARC) and pool_repair.cpp (repair and the
// invariant checker).

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <kvoffload/node_pool.hpp>

#include "pool/pool_layout.hpp"

namespace kvoffload::pool::detail {

// The mapped pool file (pool_file.cpp). Closing unmaps and, when this was the last process
// attached (its shared flock the last), removes the file if the path still names it.
struct PoolFile {
  int fd = -1;
  void* base = nullptr;
  std::uint64_t bytes = 0;
  std::filesystem::path path;
  dev_t dev = 0;
  ino_t ino = 0;

  // Creates the pool (complete before anyone can see it) or joins the one at the path; refuses
  // another geometry. Retries the races with a departing last tenant and a stale file.
  static PoolFile open(const PoolOptions& options, const std::filesystem::path& path);
  void close() noexcept;
};

class PoolImpl {
 public:
  PoolImpl(const PoolOptions& options, PoolFile file);
  ~PoolImpl();
  PoolImpl(const PoolImpl&) = delete;
  PoolImpl& operator=(const PoolImpl&) = delete;

  // ---- the operations (node_pool.cpp)
  void attach_tenant();
  LookupOutcome lookup(std::span<const BlockKey> keys, bool pin);
  StoreOutcome prepare_stores(std::span<const BlockKey> keys);
  NodePool::Cycle lookup_and_prepare(std::span<const BlockKey> keys, bool pin);
  void commit_stores(std::span<const std::uint32_t> slots);
  void abort_stores(std::span<const std::uint32_t> slots);
  void unpin(std::span<const std::uint32_t> slots);
  std::uint32_t reclaim_dead_tenants();
  void detach() noexcept;
  PoolStats stats();
  std::vector<SlotView> snapshot();
  ArcState arc_state();
  std::vector<std::string> check_invariants();

  [[nodiscard]] std::byte* chunk(std::uint32_t slot, std::uint32_t rank) const;
  [[nodiscard]] RankRange rank_range(std::uint32_t rank) const;
  [[nodiscard]] std::uint64_t slot_stride() const noexcept { return v_.h->slot_stride; }
  [[nodiscard]] const PoolGeometry& geometry() const noexcept { return options_.geometry; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_.path; }
  [[nodiscard]] std::uint32_t tenant() const noexcept { return tenant_; }
  [[nodiscard]] bool attached() const noexcept { return tenant_ != kNone; }

 private:
  // ---- the lock (pool_lock.cpp)
  // Takes the mutex within lock_timeout; after a dead holder (EOWNERDEAD) repairs the index
  // before marking the mutex consistent, so a death during the repair is repaired again. Runs
  // the periodic liveness sweep. On timeout throws kTimeout naming the holder's PID and state.
  void lock(Op op, bool hooked = true);
  void unlock() noexcept;
  class Guard;

  void step() const {
    if (hooked_ && options_.step_hook != nullptr)
      options_.step_hook(options_.step_context, op_, step_++);
  }

  // ---- repair (pool_repair.cpp)
  // Tenants whose process is gone (other than this one), as a bit mask.
  std::uint64_t dead_tenants() const;
  // Drops the dead tenants' pins and writing slots, clears their records, rebuilds the key table,
  // the lists and the derived counters from the slot records, keeps the ghosts when they are
  // consistent and rebuilds them empty otherwise (Note [Pool repair]).
  void repair(std::uint64_t dead) noexcept;
  void repair_slots(std::uint64_t dead) noexcept;
  void rebuild_table() noexcept;
  void rebuild_lists() noexcept;
  void sweep_if_due();

  // ---- the invariants (pool_repair.cpp), each reporting through fail
  using Fail = std::function<void(const std::string&)>;
  void check_slots(const Fail& fail) const;
  void check_lists(const Fail& fail) const;
  void check_tenant_lists(const Fail& fail) const;
  void check_ghosts(const Fail& fail) const;

  // ---- the eviction policy (pool_arc.cpp; Note [Pool ARC])
  [[nodiscard]] bool arc() const noexcept {
    return v_.h->policy == static_cast<std::uint32_t>(PolicyKind::kArc);
  }
  // An access to ready slot s that is in no list (pinned, or just taken out of its list): ARC
  // moves it from T1 to T2 (LRU: nothing); the caller puts it back in its list or keeps it parked.
  void promote(std::uint32_t s) const noexcept;
  // The slot a store evicts: own_only (a tenant at its cap) its own least recent chunk, else the
  // LRU's tail or ARC's REPLACE over T1 and T2; never a slot protected in this call.
  [[nodiscard]] std::uint32_t pick_victim(bool own_only) const;
  // ARC: the key just evicted from list `from` becomes the newest ghost of B1 / B2.
  void add_ghost(const BlockKey& key, std::uint32_t from);
  void drop_ghost(std::uint32_t g) const noexcept;
  // The list a new key enters: ARC's T2 on a ghost hit (which adapts the target and drops the
  // ghost), else T1 (B1 trimmed to |T1| + |B1| <= c); 0 under LRU.
  std::uint32_t admit(const BlockKey& key);

  // ---- pieces of the operations (node_pool.cpp)
  void lookup_locked(std::span<const BlockKey> keys, bool pin, LookupOutcome& out);
  void prepare_locked(std::span<const BlockKey> keys, std::uint32_t first, StoreOutcome& out);
  void protect_present(std::span<const BlockKey> keys, std::uint32_t first, std::uint64_t epoch);
  void evict(std::uint32_t s);
  std::uint32_t find_room(bool own_only, bool& swept);
  void check_owned_writing(std::span<const std::uint32_t> slots, const char* what);
  TenantRecord& me() const noexcept { return v_.tenants[tenant_]; }

  PoolOptions options_;
  PoolFile file_;
  View v_;
  std::uint32_t tenant_ = kNone;
  pid_t pid_ = 0;
  std::uint64_t engine_hash_ = 0;
  mutable Op op_ = Op::kAttach;
  mutable std::uint32_t step_ = 0;
  bool locked_ = false;
  bool hooked_ = true;  // false in the read-only calls (stats, snapshot, the checker)

  // Reused buffers of the views the calls return.
  std::vector<std::uint32_t> lookup_slots_;
  std::vector<std::uint32_t> store_positions_;
  std::vector<std::uint32_t> store_slots_;
  std::vector<BlockKey> evicted_;
  std::vector<std::uint32_t> scratch_;
};

}  // namespace kvoffload::pool::detail
