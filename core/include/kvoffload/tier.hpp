#pragma once
// Secondary tiers: stores behind the shared host region (the primary tier) that keep chunk rows
// the primary stored and give them back for promotion. Every operation is asynchronous and
// batched; each item of a batch is reported on its own, so one unreadable file never fails its
// neighbours. `contains` answers from memory and never does I/O, so the scheduler can ask it on
// its hot path. `lookup` is the asynchronous existence check for tiers whose contents are not
// known locally (a remote store): it never blocks, and answers kPending while a check is in flight.
//
//   std::vector<TierPut> puts = {{key, row_bytes}};
//   TierBatch b = tier.put(puts);            // returns at once
//   ...                                      // row_bytes must stay unchanged until b is ready
//   for (const TierItemResult& r : b.wait()) if (r.status != TierItemStatus::kOk) ...
//
// Tiers are thread-safe: put/get/remove/contains may be called from any thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kvoffload/block_key.hpp>
#include <kvoffload/export.h>

namespace kvoffload {

enum class TierItemStatus : std::uint8_t {
  kOk = 0,      // put: stored (or already present); get: `into` holds the verified bytes
  kMiss = 1,    // get: nothing valid (absent, short, corrupt, other key or length); not an error
  kFailed = 2,  // an I/O or capacity error for this item (sys_errno / detail say which)
};
KVOFFLOAD_API std::string_view to_string(
    TierItemStatus status) noexcept;  // "ok" | "miss" | "failed"

struct TierItemResult {
  BlockKey key{};
  TierItemStatus status = TierItemStatus::kFailed;
  int sys_errno = 0;   // errno of the failing call, 0 when none
  std::string detail;  // why a miss or a failure happened ("checksum mismatch", "open: ...")
};

// One item to store: `bytes` is read asynchronously and must stay valid and unchanged until the
// batch is ready.
struct TierPut {
  BlockKey key{};
  std::span<const std::byte> bytes;
};

// One item to read: `into.size()` is the length expected; a record of any other length is a
// miss. `into` is written only when the item's status is kOk (the tier verifies into a bounce
// buffer first), so a miss never leaves torn bytes in the destination.
struct TierGet {
  BlockKey key{};
  std::span<std::byte> into;
};

namespace detail {
struct TierBatchState;
}

// Handle to an asynchronous batch; cheap to copy (shared state). Results are in submission order.
class KVOFFLOAD_API TierBatch {
 public:
  TierBatch() = default;  // an empty batch: ready, no items

  [[nodiscard]] std::size_t size() const noexcept;
  // Non-blocking.
  [[nodiscard]] bool ready() const noexcept;
  // Blocks until every item completed; a copy of the results, so `tier.put(x).wait()` on a
  // temporary batch is safe.
  [[nodiscard]] std::vector<TierItemResult> wait() const;
  // Waits at most `timeout`; true when ready.
  bool wait_for(std::chrono::milliseconds timeout) const;
  // Number of items whose status is kOk (waits).
  [[nodiscard]] std::size_t ok_count() const;
  // Non-blocking: when the last item was set (steady clock), or nullopt while items are
  // outstanding. An empty batch has no finishing time. Lets a poller report a batch's transfer
  // time without counting how long it waited to be polled.
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> finished_at() const noexcept;

 private:
  friend class TierBatchPromise;
  explicit TierBatch(std::shared_ptr<detail::TierBatchState> state) noexcept
      : state_(std::move(state)) {}
  std::shared_ptr<detail::TierBatchState> state_;
};

// Producer side of a batch, for tier implementations: one result per item, set exactly once,
// from any thread. The batch becomes ready when the last item is set.
class KVOFFLOAD_API TierBatchPromise {
 public:
  explicit TierBatchPromise(std::span<const BlockKey> keys);
  // For tiers that build items one by one: n items whose keys are set by `set`.
  explicit TierBatchPromise(std::size_t n);

  [[nodiscard]] TierBatch batch() const noexcept { return TierBatch(state_); }
  void set(std::size_t index, TierItemStatus status, int sys_errno = 0, std::string detail = {});
  void set(std::size_t index, const BlockKey& key, TierItemStatus status, int sys_errno = 0,
           std::string detail = {});

 private:
  std::shared_ptr<detail::TierBatchState> state_;
};

// Answer of SecondaryTier::lookup for one key.
enum class TierPresence : std::uint8_t {
  kAbsent = 0,   // not held (or unknown and the lookup budget ran out: a miss, never a stall)
  kPresent = 1,  // held: promotable (a strong hint; a get can still miss)
  kPending = 2,  // a check is in flight: ask again later (vLLM's LookupResult.RETRY)
};
KVOFFLOAD_API std::string_view to_string(
    TierPresence presence) noexcept;  // "absent" | "present" | "pending"

struct TierStats {
  std::uint64_t entries = 0;  // keys the tier holds (ready)
  std::uint64_t bytes = 0;    // bytes they occupy (files, including headers)
  std::uint64_t capacity_bytes = 0;
  std::uint64_t puts_ok = 0;
  std::uint64_t puts_failed = 0;
  std::uint64_t gets_ok = 0;
  std::uint64_t gets_miss = 0;
  std::uint64_t gets_failed = 0;
  std::uint64_t corrupt = 0;    // records rejected on read (short, checksum, key, length)
  std::uint64_t evictions = 0;  // records removed to stay within capacity
  std::uint64_t in_flight = 0;  // items queued or running
  bool direct_io = false;       // O_DIRECT in use right now
};

class KVOFFLOAD_API SecondaryTier {
 public:
  virtual ~SecondaryTier() = default;
  SecondaryTier() = default;
  SecondaryTier(const SecondaryTier&) = delete;
  SecondaryTier& operator=(const SecondaryTier&) = delete;

  [[nodiscard]] virtual const std::string& name() const noexcept = 0;
  // Stores each item (a key already held or being stored reports kOk without rewriting).
  virtual TierBatch put(std::span<const TierPut> items) = 0;
  // Reads each item into its buffer.
  virtual TierBatch get(std::span<const TierGet> items) = 0;
  // True when the key is held (a completed put). Never does I/O. A true answer is a strong hint,
  // not a promise: a get can still miss (the file was damaged or evicted meanwhile).
  [[nodiscard]] virtual bool contains(const BlockKey& key) const = 0;
  // Asynchronous existence check of a batch, one answer per key into `out` (size >= keys.size()).
  // Never blocks on I/O: a key whose check has not resolved answers kPending until the tier's
  // lookup budget runs out, then kAbsent. A key first asked here may start a check in the
  // background. The default answers from contains() (tiers whose index is local).
  virtual void lookup(std::span<const BlockKey> keys, std::span<TierPresence> out);
  // Forgets each key (kOk also for keys not held); the storage is reclaimed asynchronously.
  virtual TierBatch remove(std::span<const BlockKey> keys) = 0;
  // Blocks until every batch submitted so far is ready.
  virtual void drain() = 0;
  [[nodiscard]] virtual TierStats stats() const = 0;
  // Drains and releases the tier's resources (threads, descriptors, locks); stored data stays.
  // Idempotent, never throws; false when a step failed (logged). Operations after close throw
  // kState.
  virtual bool close() noexcept = 0;
};

}  // namespace kvoffload
