#pragma once
// TieredStore: the region (through the Manager) as the primary tier, secondary tiers behind it.
//
//  - Offload: complete_store(keys, true) ends the primary store and hands each key's row bytes
//    to every secondary tier asynchronously. While a tier writes, the key is pinned in the
//    Manager (prepare_load), so its slot can be neither evicted nor reused under the write; the
//    pin is released when poll() sees the tier's batch finish. (These pins count in the Manager's
//    loads_prepared / loads_completed statistics.)
//  - Lookup: a primary hit, else a secondary hit (promotable), else a miss, per key, with the
//    lengths of the primary-hit prefix and of the prefix available from any tier. Tiers are asked
//    with SecondaryTier::lookup, so a remote tier answers kSecondaryPending while its check is in
//    flight: the caller asks again later (or treats it as a miss); nothing blocks. Keys that
//    another engine stored in a shared tier are found this way and promote like our own.
//  - Promote: for keys missing from the primary but held by a secondary tier, prepare_store gives
//    write-pending slots (not visible nor evictable while they fill), the tier reads each record
//    into its slot's row, and poll() completes the store: success for verified records, failure
//    (slot freed) for misses and errors. Promoted keys are not written back to the tiers.
//
// Threading: like the Manager, thread-compatible: the scheduler calls it from one thread (the
// tiers' I/O runs on their own threads; every Manager call happens in the caller's thread).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <kvoffload/block_key.hpp>
#include <kvoffload/export.h>
#include <kvoffload/manager.hpp>
#include <kvoffload/tier.hpp>

namespace kvoffload {
namespace detail {
class RateLimitedLog;
}

class Region;
class LivePageSink;  // kvoffload/live_page.hpp

// The chunk rows of the primary tier as a tier sees them: row(slot) is the first row_bytes bytes
// (all copies, without the page padding) of the slot's row.
struct KVOFFLOAD_API PrimaryRows {
  std::byte* base = nullptr;
  std::uint64_t row_stride = 0;
  std::uint64_t row_bytes = 0;
  std::uint64_t num_rows = 0;

  // The rows of a region: row_bytes = copies · slot_bytes.
  static PrimaryRows of(const Region& region);
  // Throws kInvalidArgument for a slot out of range.
  [[nodiscard]] std::span<std::byte> row(SlotIndex slot) const;
};

enum class TierLocation : std::uint8_t {
  kMiss = 0,
  kPrimary = 1,           // ready in the region
  kPrimaryPending = 2,    // a primary store (or promotion) in flight
  kSecondary = 3,         // held by a secondary tier: promotable
  kSecondaryPending = 4,  // a tier's existence check is in flight: ask again (vLLM's RETRY)
};

struct TieredLookup {
  std::size_t primary_prefix = 0;    // leading keys that are kPrimary
  std::size_t available_prefix = 0;  // leading keys that are kPrimary or kSecondary
  std::size_t pending = 0;           // keys that are kSecondaryPending (anywhere in the batch)
};

struct PromoteTicket {
  std::uint64_t id = 0;  // 0: nothing was started
  StoreStatus status = StoreStatus::kOk;
  CannotStoreReason reason = CannotStoreReason::kNone;
  std::vector<BlockKey> keys;     // being promoted (write-pending now)
  std::vector<BlockKey> evicted;  // primary keys evicted to make room
};

struct PromoteCompletion {
  std::uint64_t id = 0;
  std::vector<BlockKey> promoted;      // ready in the primary now, bytes verified
  std::vector<TierItemResult> failed;  // misses and errors, per key (slots freed)
};

struct TieredStats {
  std::uint64_t offload_keys = 0;  // key x tier writes started
  std::uint64_t offload_ok = 0;
  std::uint64_t offload_failed = 0;
  std::uint64_t promote_keys = 0;  // keys whose promotion started
  std::uint64_t promoted = 0;
  std::uint64_t promote_failed = 0;
  std::uint64_t offloads_in_flight = 0;  // tier batches
  std::uint64_t promotions_in_flight = 0;
};

class KVOFFLOAD_API TieredStore {
 public:
  // `primary` and the tiers must outlive the store. Tiers are consulted in order (fastest first).
  TieredStore(Manager& primary, PrimaryRows rows, std::vector<SecondaryTier*> tiers);
  ~TieredStore();  // drains (pins released, promotions completed)
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // Per key location into `out` (size >= keys.size(), or empty). Calls Manager::lookup (so it
  // counts toward statistics and the store threshold) and asks the tiers only for primary misses.
  TieredLookup lookup(std::span<const BlockKey> keys, std::span<TierLocation> out = {});

  // Manager::complete_store, then (success) offload of the keys to every secondary tier.
  void complete_store(std::span<const BlockKey> keys, bool success);

  // Starts promoting the keys of `keys` that the primary lacks and a tier holds. Never evicts a
  // key of `keys` nor of `protected_keys`. A "cannot store" ticket has id 0 and changed nothing.
  PromoteTicket promote(std::span<const BlockKey> keys,
                        std::span<const BlockKey> protected_keys = {});

  // Non-blocking: finishes what the tiers completed (releases offload pins, completes promoted
  // stores) and returns the promotions that finished.
  std::vector<PromoteCompletion> poll();
  // Blocks until every offload and promotion finished; returns the promotions that did.
  std::vector<PromoteCompletion> drain();

  [[nodiscard]] TieredStats stats() const noexcept;
  [[nodiscard]] std::span<SecondaryTier* const> tiers() const noexcept { return tiers_; }

  // From now on, mirror the per-tier counters (lookups, present, pending, promoted, offloaded and
  // their failures) into `page` (a region's live statistics page: Note [Live stats] in
  // core/src/live/live_page.hpp); the first 8 tiers are published. The page's close (the
  // region's close()) stops it. OffloadStack::build does this for its store with its region.
  void publish_live_stats(LivePageSink& page);

 private:
  struct Offload {
    TierBatch batch;
    std::vector<BlockKey> keys;
    std::size_t tier = 0;
  };
  // Per tier, in keys (published by publish_live()).
  struct TierCounters {
    std::uint64_t lookups = 0;
    std::uint64_t present = 0;
    std::uint64_t pending = 0;
    std::uint64_t promoted = 0;
    std::uint64_t promote_failed = 0;
    std::uint64_t offloaded = 0;
    std::uint64_t offload_failed = 0;
  };
  struct LiveLink;
  // Note [Promotion fall-through]: a key is read from the first tier that holds it; when that
  // read misses or fails, the next tier that holds the key is tried, into the same slot, before
  // the key is reported failed.
  struct PromotionRead {
    std::size_t tier = 0;
    TierBatch batch;
    std::vector<TierGet> gets;
    bool consumed = false;
  };
  struct Promotion {
    std::uint64_t id = 0;
    std::vector<PromotionRead> reads;  // one per tier asked, fall-through reads appended
    std::vector<BlockKey> promoted;
    std::vector<TierItemResult> failed;
  };

  std::vector<PromoteCompletion> progress(bool block);
  // Folds the results of a finished read into `p`, starting fall-through reads; true when a
  // fall-through read was started.
  bool consume(Promotion& p, PromotionRead& read);

  Manager& primary_;
  PrimaryRows rows_;
  std::vector<SecondaryTier*> tiers_;
  std::vector<Offload> offloads_;
  std::vector<Promotion> promotions_;
  std::uint64_t next_id_ = 1;
  TieredStats stats_;
  std::vector<TierCounters> tier_counters_;  // one per tier
  std::shared_ptr<LiveLink> live_;           // null: not publishing
  void publish_live() noexcept;
  // Asks the tiers about keys[i] for i in miss_index_ (primary misses); sets locations_. `count`:
  // add the answers to the per-tier counters.
  void ask_tiers(std::span<const BlockKey> keys, bool count);

  std::vector<LookupResult> lookup_scratch_;
  // Scratch of ask_tiers, reused so a lookup allocates nothing once warm.
  std::vector<std::size_t> miss_index_;
  std::vector<BlockKey> ask_keys_;
  std::vector<std::size_t> ask_index_;
  std::vector<TierPresence> presence_;
  std::vector<TierLocation> locations_;
  std::vector<std::size_t> source_tier_;
  std::unique_ptr<detail::RateLimitedLog> warnings_;  // Note [Rate-limited warnings]
};

}  // namespace kvoffload
