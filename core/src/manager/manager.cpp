// Manager: slot states, key index and events over an EvictionPolicy, with its slot pool
// (slot_pool.hpp) and store threshold tracker (threshold_tracker.hpp).
// Over 500 lines for one reason: Manager::Impl is one state machine (slot states, pins, pending
// stores, events) whose operations share its invariants; its pool and tracker live apart.
// See manager.hpp for the contract; Note [Parked slots] in eviction_policy.hpp for how pinned and
// write-pending chunks stay out of eviction.
//
// Note [vLLM semantics]: ManagerSemantics::kVllm reproduces vLLM's CPUOffloadingManager
// (vllm/v1/kv_offload/cpu/manager.py) call for call, so that kvoffload.vllm can stand in for it:
//  - slots: vLLM's block pool hands out never-used ids in ascending order first and only then
//    pops its free list (most recently freed first); the native pool reuses freed slots first.
//  - policies: make_vllm_policy (eviction_policy.hpp): pinned and pending chunks keep their place.
//  - store threshold: vLLM's tracker is an OrderedDict moved to the end on every lookup, so a full
//    tracker forgets the key looked up least recently (native: the one that entered first). The
//    threshold filter runs before the presence check, so a present key below the threshold is
//    counted as skipped by the threshold and is not protected from this call's eviction.
//  - complete_store skips keys that are unknown or already ready (vLLM checks and moves on).
//  - touch hands the absent keys to the policy too (vLLM's ARC adapts on ghost hits).
//  - vLLM's ARC eviction can fail with enough evictable chunks (T1 below its target, T2 out of
//    candidates): the policy then evicts nothing and prepare_store cannot store.
//  - reset (reset_cache) clears everything even with stores or loads in flight (vLLM's scheduler
//    never completes a pre-reset job), records no event, and keeps the threshold counts.
//  - num_chunks 0 is allowed: vLLM's spec sizes a cache smaller than one block to 0 blocks, and
//    its manager then refuses every store that needs a slot.
// Lookups, eviction order and the removed-then-stored event order are the same in both.
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/live_page.hpp>
#include <kvoffload/manager.hpp>

#include "live/live_page.hpp"
#include "manager/key_table.hpp"
#include "manager/slot_pool.hpp"
#include "manager/threshold_tracker.hpp"

namespace kvoffload {

std::string_view to_string(LookupResult result) noexcept {
  switch (result) {
    case LookupResult::kMiss:
      return "miss";
    case LookupResult::kHit:
      return "hit";
    case LookupResult::kHitPending:
      return "hit_pending";
  }
  return "unknown";
}

std::string_view to_string(ManagerSemantics semantics) noexcept {
  switch (semantics) {
    case ManagerSemantics::kNative:
      return "native";
    case ManagerSemantics::kVllm:
      return "vllm";
  }
  return "unknown";
}

std::string_view to_string(CannotStoreReason reason) noexcept {
  switch (reason) {
    case CannotStoreReason::kNone:
      return "none";
    case CannotStoreReason::kNoEvictableSpace:
      return "no_evictable_space";
    case CannotStoreReason::kTooManyKeys:
      return "too_many_keys";
  }
  return "unknown";
}

std::string StorePlan::describe() const {
  if (ok()) {
    return "storing " + std::to_string(keys.size()) + " keys (" + std::to_string(evicted.size()) +
           " evicted, " + std::to_string(skipped_present) + " already present, " +
           std::to_string(skipped_threshold) + " below the store threshold)";
  }
  std::string s = "cannot store " + std::to_string(slots_needed) + " new keys: ";
  if (reason == CannotStoreReason::kTooManyKeys) {
    s += "more than the region's " + std::to_string(slots_available) + " chunk slots";
  } else {
    s += "only " + std::to_string(slots_available) +
         " slots are free or evictable; the rest are pinned by loads, write-pending, or protected "
         "by this call";
  }
  return s;
}

struct Manager::Impl {
  using KeyTable = detail::KeyTable;
  using SlotPool = detail::SlotPool;
  using ThresholdTracker = detail::ThresholdTracker;

 public:
  Impl(const ManagerConfig& config, std::unique_ptr<EvictionPolicy> policy)
      : config_(config),
        policy_(std::move(policy)),
        vllm_(config.semantics == ManagerSemantics::kVllm) {
    n_ = static_cast<std::uint32_t>(config.num_chunks);
    keys_.resize(n_);
    state_.assign(n_, kFree);
    pins_.assign(n_, 0);
    marks_.assign(n_, 0);
    counts_.assign(n_, 0);
    // Note [Ready slots]: only the slots of rows the region has made ready on every rank are ever
    // handed out; the rest join the free slots as set_ready_chunks() grows the ready prefix.
    pool_ = SlotPool(n_, static_cast<std::uint32_t>(config.ready_chunks.value_or(n_)), vllm_);
    index_.init(n_);
    if (config_.store_threshold > 0) {
      tracker_ = ThresholdTracker(config_.threshold_tracker_capacity, vllm_);
    }
  }

  const ManagerConfig& config() const noexcept { return config_; }
  std::uint32_t num_chunks() const noexcept { return n_; }
  const EvictionPolicy& policy() const noexcept { return *policy_; }

  std::uint32_t find(const BlockKey& key) const noexcept {
    return index_.find(key, [this](std::uint32_t s) -> const BlockKey& { return keys_[s]; });
  }

  std::size_t lookup(std::span<const BlockKey> keys, std::span<LookupResult> results) {
    if (!results.empty() && results.size() < keys.size()) {
      throw_invalid("lookup: results holds " + std::to_string(results.size()) + " entries for " +
                    std::to_string(keys.size()) + " keys");
    }
    std::size_t prefix = 0;
    bool in_prefix = true;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint32_t s = find(keys[i]);
      LookupResult r = LookupResult::kMiss;
      if (s == KeyTable::kNone) {
        ++stats_.misses;
      } else if (state_[s] == kReady) {
        r = LookupResult::kHit;
        ++stats_.hits;
      } else {
        r = LookupResult::kHitPending;
        ++stats_.hits_pending;
      }
      if (in_prefix && r == LookupResult::kHit)
        ++prefix;
      else
        in_prefix = false;
      if (!results.empty()) results[i] = r;
      if (config_.store_threshold > 0) tracker_.track(keys[i]);
    }
    stats_.lookup_keys += keys.size();
    return prefix;
  }

  // Note [Store phases]: a store is planned in four phases, each its own method: choose the new
  // keys (protecting every present key of the call), check the capacity exactly before anything
  // changes, evict what the free slots lack, then take the slots.
  StorePlan prepare_store(std::span<const BlockKey> keys,
                          std::span<const BlockKey> protected_keys) {
    const std::uint32_t epoch = next_epoch();
    plan_keys_.clear();
    plan_positions_.clear();
    plan_slots_.clear();
    plan_evicted_.clear();
    StorePlan plan;

    const std::uint64_t protected_evictable = choose_new_keys(keys, protected_keys, epoch, plan);
    const std::uint64_t needed = plan_keys_.size();
    const std::uint64_t free_slots = pool_.free_count();
    check_capacity(needed, free_slots, protected_evictable, plan);
    if (!plan.ok()) return refuse(plan);
    if (needed > free_slots && !evict_for_store(needed - free_slots, epoch)) {
      // vLLM's ARC gives up when T1 is below its target and T2 has no candidate left, even if
      // T1 has some: prepare_store returns None and nothing changed (Note [vLLM semantics]).
      plan.status = StoreStatus::kCannotStore;
      plan.reason = CannotStoreReason::kNoEvictableSpace;
      return refuse(plan);
    }

    for (const BlockKey& key : plan_keys_) {
      const std::uint32_t s = pool_.take();
      keys_[s] = key;
      state_[s] = kPending;
      index_.insert(key, s);
      plan_slots_.push_back(s);
    }
    policy_->insert(plan_slots_, plan_keys_);
    pending_ += needed;
    stats_.stores_prepared += needed;

    plan.keys = plan_keys_;
    plan.positions = plan_positions_;
    plan.slots = plan_slots_;
    plan.evicted = plan_evicted_;
    plan.evicted_slots =
        needed > free_slots ? std::span<const SlotIndex>(victims_) : std::span<const SlotIndex>();
    return plan;
  }

  // Note [Store phases], choosing: protects every present key of the call and of the extra set,
  // and puts the new keys, each once, in plan_keys_ (a scratch set over this call's keys finds
  // repeats). Returns the evictable slots among the protected ones, so that the capacity check
  // is exact before anything changes.
  std::uint64_t choose_new_keys(std::span<const BlockKey> keys,
                                std::span<const BlockKey> protected_keys, std::uint32_t epoch,
                                StorePlan& plan) {
    std::uint64_t protected_evictable = 0;
    auto protect = [&](std::uint32_t s) {
      if (marks_[s] == epoch) return;
      marks_[s] = epoch;
      if (evictable(s)) ++protected_evictable;
    };
    for (const BlockKey& key : protected_keys) {
      const std::uint32_t s = find(key);
      if (s != KeyTable::kNone) protect(s);
    }
    dedup_.init(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const BlockKey& key = keys[i];
      // vLLM filters by the threshold first (Note [vLLM semantics]).
      if (vllm_ && config_.store_threshold > 0 && tracked_count(key) < config_.store_threshold) {
        ++plan.skipped_threshold;
        continue;
      }
      const std::uint32_t s = find(key);
      if (s != KeyTable::kNone) {
        protect(s);
        ++plan.skipped_present;
        continue;
      }
      if (!vllm_ && config_.store_threshold > 0 && tracked_count(key) < config_.store_threshold) {
        ++plan.skipped_threshold;
        continue;
      }
      const auto at = [keys](std::uint32_t j) -> const BlockKey& { return keys[j]; };
      if (dedup_.find(key, at) != KeyTable::kNone) {
        ++plan.skipped_present;
        continue;
      }
      dedup_.insert(key, static_cast<std::uint32_t>(i));
      plan_keys_.push_back(key);
      plan_positions_.push_back(static_cast<std::uint32_t>(i));
    }
    stats_.stores_skipped_threshold += plan.skipped_threshold;
    return protected_evictable;
  }

  // Note [Store phases], the capacity check: the slots the plan needs against the free ones and
  // the evictable ones not protected; a plan that cannot fit says why.
  void check_capacity(std::uint64_t needed, std::uint64_t free_slots,
                      std::uint64_t protected_evictable, StorePlan& plan) const {
    const std::uint64_t evictable_slots = pool_.ready() - free_slots - pending_ - pinned_;
    plan.slots_needed = needed;
    plan.slots_available = free_slots + evictable_slots - protected_evictable;
    if (needed > n_) {
      plan.status = StoreStatus::kCannotStore;
      plan.reason = CannotStoreReason::kTooManyKeys;
      plan.slots_available = n_;
    } else if (needed > plan.slots_available) {
      plan.status = StoreStatus::kCannotStore;
      plan.reason = CannotStoreReason::kNoEvictableSpace;
    }
  }

  // A plan that stores nothing: counted as an allocation failure, no key, no slot, no eviction.
  StorePlan refuse(StorePlan& plan) {
    ++stats_.allocation_failures;
    plan_keys_.clear();
    plan_positions_.clear();
    plan.keys = plan_keys_;
    plan.positions = plan_positions_;
    plan.slots = plan_slots_;
    plan.evicted = plan_evicted_;
    plan.evicted_slots = {};
    return plan;
  }

  // Note [Store phases], evicting: frees `to_evict` slots the policy chooses among those not
  // protected in this epoch, their keys in plan_evicted_ and their slots in victims_. False when
  // vLLM's policy found none (nothing changed); throws when a policy chose a slot that is not
  // evictable or found fewer than the capacity check promised.
  bool evict_for_store(std::size_t to_evict, std::uint32_t epoch) {
    victims_.resize(to_evict);
    const VictimFilter filter{marks_.data(), epoch};
    const std::size_t got = policy_->evict(to_evict, filter, keys_, victims_);
    if (vllm_ && got == 0) return false;
    if (got != to_evict) {
      // The counts above say the policy had enough candidates; a policy that disagrees has
      // already evicted `got` slots, which we must still account for before reporting.
      victims_.resize(got);
    }
    for (const SlotIndex v : victims_) {
      if (state_[v] != kReady || pins_[v] != 0) {
        throw Error(ErrorCode::kInternal, "prepare_store: the eviction policy chose slot " +
                                              std::to_string(v) + ", which is not evictable");
      }
      plan_evicted_.push_back(keys_[v]);
      index_.erase(keys_[v], v);
      state_[v] = kFree;
      pool_.put(v);
    }
    stats_.evictions += victims_.size();
    record(EventKind::kRemoved, plan_evicted_);
    if (got != to_evict) {
      throw Error(ErrorCode::kInternal, "prepare_store: the eviction policy '" +
                                            std::string(policy_->name()) + "' found " +
                                            std::to_string(got) + " victims of " +
                                            std::to_string(to_evict) + " it had");
    }
    return true;
  }

  std::span<const std::uint32_t> complete_store(std::span<const BlockKey> keys, bool success) {
    if (vllm_) return complete_store_vllm(keys, success);
    const std::uint32_t epoch = next_epoch();
    work_slots_.clear();
    for (const BlockKey& key : keys) {
      const std::uint32_t s = find(key);
      if (s == KeyTable::kNone) {
        throw Error(ErrorCode::kNotFound, "complete_store: key " + key.to_hex() +
                                              " has no store pending (it is not in the manager)");
      }
      if (state_[s] != kPending) {
        throw Error(ErrorCode::kState, "complete_store: key " + key.to_hex() +
                                           " is already stored, not write-pending");
      }
      if (marks_[s] == epoch) {
        throw Error(ErrorCode::kState, "complete_store: key " + key.to_hex() + " appears twice");
      }
      marks_[s] = epoch;
      work_slots_.push_back(s);
    }
    pending_ -= work_slots_.size();
    if (success) {
      for (const SlotIndex s : work_slots_) state_[s] = kReady;
      policy_->release(work_slots_);
      stats_.stores_completed += work_slots_.size();
      record(EventKind::kStored, keys);
    } else {
      policy_->remove(work_slots_);
      for (const SlotIndex s : work_slots_) {
        index_.erase(keys_[s], s);
        state_[s] = kFree;
        pool_.put(s);
      }
      stats_.stores_failed += work_slots_.size();
    }
    completed_.resize(keys.size());
    for (std::uint32_t i = 0; i < completed_.size(); ++i) completed_[i] = i;
    return completed_;
  }

  // vLLM's complete_store: keys that are not write-pending (unknown, already ready, or a repeat
  // within this call) are skipped; the rest end in call order (Note [vLLM semantics]).
  std::span<const std::uint32_t> complete_store_vllm(std::span<const BlockKey> keys, bool success) {
    work_slots_.clear();
    completed_.clear();
    stored_keys_.clear();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint32_t s = find(keys[i]);
      if (s == KeyTable::kNone || state_[s] != kPending) continue;
      if (success) {
        state_[s] = kReady;
        stored_keys_.push_back(keys[i]);
      } else {
        index_.erase(keys_[s], s);  // a repeat of the key now misses
        state_[s] = kFree;
      }
      work_slots_.push_back(s);
      completed_.push_back(static_cast<std::uint32_t>(i));
    }
    pending_ -= work_slots_.size();
    if (success) {
      policy_->release(work_slots_);
      stats_.stores_completed += work_slots_.size();
      record(EventKind::kStored, stored_keys_);
    } else {
      policy_->remove(work_slots_);
      for (const SlotIndex s : work_slots_) pool_.put(s);
      stats_.stores_failed += work_slots_.size();
    }
    return completed_;
  }

  void prepare_load(std::span<const BlockKey> keys, std::span<SlotIndex> slots_out) {
    if (slots_out.size() < keys.size()) {
      throw_invalid("prepare_load: slots_out holds " + std::to_string(slots_out.size()) +
                    " entries for " + std::to_string(keys.size()) + " keys");
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint32_t s = find(keys[i]);
      if (s == KeyTable::kNone) {
        throw Error(ErrorCode::kNotFound,
                    "prepare_load: key " + keys[i].to_hex() + " is not stored (lookup first)");
      }
      if (state_[s] != kReady) {
        throw Error(ErrorCode::kState,
                    "prepare_load: key " + keys[i].to_hex() +
                        " is write-pending; it can be loaded after complete_store");
      }
      if (pins_[s] == std::numeric_limits<std::uint32_t>::max()) {
        throw Error(ErrorCode::kState,
                    "prepare_load: key " + keys[i].to_hex() + " has too many readers");
      }
      slots_out[i] = s;
    }
    work_slots_.clear();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const SlotIndex s = slots_out[i];
      if (pins_[s]++ == 0) {
        ++pinned_;
        work_slots_.push_back(s);
      }
    }
    policy_->hold(work_slots_);
    stats_.loads_prepared += keys.size();
  }

  std::span<const SlotIndex> prepare_load(std::span<const BlockKey> keys) {
    load_slots_.resize(keys.size());
    prepare_load(keys, load_slots_);
    return load_slots_;
  }

  void complete_load(std::span<const BlockKey> keys) {
    const std::uint32_t epoch = next_epoch();
    work_slots_.clear();
    for (const BlockKey& key : keys) {
      const std::uint32_t s = find(key);
      if (s == KeyTable::kNone) {
        throw Error(ErrorCode::kNotFound, "complete_load: key " + key.to_hex() + " is not stored");
      }
      if (marks_[s] != epoch) {
        marks_[s] = epoch;
        counts_[s] = 0;
      }
      if (++counts_[s] > pins_[s]) {
        throw Error(ErrorCode::kState,
                    "complete_load: key " + key.to_hex() +
                        (pins_[s] == 0 ? " is not pinned (no prepare_load pending)"
                                       : " is released more times than it was pinned (" +
                                             std::to_string(pins_[s]) + " pins)"));
      }
      work_slots_.push_back(s);
    }
    std::size_t released = 0;
    for (const SlotIndex s : work_slots_) {
      if (--pins_[s] == 0) work_slots_[released++] = s;  // compacts in place, order kept
    }
    work_slots_.resize(released);
    pinned_ -= released;
    policy_->release(work_slots_);
    stats_.loads_completed += keys.size();
  }

  void touch(std::span<const BlockKey> keys) {
    work_slots_.clear();
    stored_keys_.clear();
    for (const BlockKey& key : keys) {
      const std::uint32_t s = find(key);
      if (s != KeyTable::kNone)
        work_slots_.push_back(s);
      else if (vllm_)
        stored_keys_.push_back(key);
    }
    policy_->touch(work_slots_);
    // Resident and absent keys touch disjoint state (lists vs ghosts), so two batches in call
    // order give the same result as vLLM's one interleaved loop.
    if (vllm_ && !stored_keys_.empty()) policy_->touch_missing(stored_keys_);
  }

  void reset() {
    if (vllm_) {
      // vLLM's reset_cache: everything goes, in flight or not, silently; the counts stay.
      std::fill(state_.begin(), state_.end(), kFree);
      std::fill(pins_.begin(), pins_.end(), 0);
      pending_ = 0;
      pinned_ = 0;
      pool_.reset();
      index_.clear();
      policy_->reset();
      return;
    }
    if (pending_ != 0 || pinned_ != 0) {
      throw Error(ErrorCode::kState, "reset: " + std::to_string(pending_) + " stores pending and " +
                                         std::to_string(pinned_) +
                                         " chunks pinned by loads; complete them first (a worker "
                                         "may still be copying those slots)");
    }
    plan_evicted_.clear();
    for (std::uint32_t s = 0; s < n_; ++s) {
      if (state_[s] == kReady) plan_evicted_.push_back(keys_[s]);
    }
    record(EventKind::kRemoved, plan_evicted_);
    plan_evicted_.clear();
    std::fill(state_.begin(), state_.end(), kFree);
    pool_.reset();
    index_.clear();
    policy_->reset();
    tracker_.clear();
  }

  LookupResult state_of(const BlockKey& key) const noexcept {
    const std::uint32_t s = find(key);
    if (s == KeyTable::kNone) return LookupResult::kMiss;
    return state_[s] == kReady ? LookupResult::kHit : LookupResult::kHitPending;
  }
  SlotIndex slot_of(const BlockKey& key) const noexcept {
    const std::uint32_t s = find(key);
    return s == KeyTable::kNone ? kNoSlot : s;
  }
  std::uint32_t pin_count(const BlockKey& key) const noexcept {
    const std::uint32_t s = find(key);
    return s == KeyTable::kNone ? 0 : pins_[s];
  }
  std::uint32_t tracked_count(const BlockKey& key) const noexcept { return tracker_.count(key); }

  std::span<const ManagerEvent> take_events() {
    std::swap(active_, drained_);
    EventBuffer& out = events_[drained_];
    out.views.clear();
    for (const auto& b : out.batches) {
      out.views.push_back(
          ManagerEvent{b.kind, std::span<const BlockKey>(out.keys).subspan(b.first, b.count)});
    }
    EventBuffer& next = events_[active_];
    next.keys.clear();
    next.batches.clear();
    return out.views;
  }

  ManagerStats stats() const noexcept {
    ManagerStats s = stats_;
    s.num_chunks = n_;
    s.ready_chunks = pool_.ready();
    s.used = pool_.ready() - pool_.free_count();
    s.write_pending = pending_;
    s.pinned = pinned_;
    s.evictable = s.used - pending_ - pinned_;
    // A 0-chunk (vLLM) manager reports 0.0, as vLLM does, not 0/0.
    const double n = n_ == 0 ? 1.0 : static_cast<double>(n_);
    s.usage = static_cast<double>(s.used) / n;
    s.write_pending_fraction = static_cast<double>(pending_) / n;
    s.pinned_fraction = static_cast<double>(pinned_) / n;
    s.policy = policy_->counters();
    return s;
  }

  void reset_stats() noexcept { stats_ = ManagerStats{}; }

  // ---- live statistics (Note [Live stats] in core/src/live/live_page.hpp) ----
  // What an operation changed, so it stores only those fields.
  enum LiveGroup : unsigned {
    kLiveLookups = 1U,    // lookup counters
    kLiveStores = 2U,     // store counters, evictions
    kLiveLoads = 4U,      // load counters
    kLiveOccupancy = 8U,  // ready, used, write-pending, pinned
    kLiveAll = 15U,
  };
  // The block this manager writes, cleared by the region's close() (a teardown hook holds the
  // link weakly, so a manager that is gone first is never touched).
  struct LiveLink {
    detail::SchedulerBlock* block = nullptr;
    // Marks the block detached (readers then know the counters are final) and stops publishing.
    void detach() noexcept {
      if (block == nullptr) return;
      {
        const detail::LiveWrite write(block->seq);
        detail::LiveWrite::put(block->detached_unix_ns, detail::unix_now_ns());
      }
      block = nullptr;
    }
  };
  ~Impl() {
    if (live_) live_->detach();
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void attach_live(LivePageSink& sink) {
    detail::LivePage* page = detail::live_page_of(sink);
    if (page == nullptr) {
      throw Error(ErrorCode::kState, "publish_live_stats: " + sink.live_name() + " is closed");
    }
    if (sink.live_num_chunks() != n_) {
      throw_invalid("publish_live_stats: the manager has " + std::to_string(n_) + " chunks but " +
                    sink.live_name() + " has " + std::to_string(sink.live_num_chunks()));
    }
    auto link = std::make_shared<LiveLink>();
    link->block = &page->scheduler;
    sink.on_live_close([weak = std::weak_ptr<LiveLink>(link)] {
      if (auto l = weak.lock()) l->detach();
    });
    if (live_) live_->detach();  // attached elsewhere before
    live_ = std::move(link);
    detail::SchedulerBlock& b = *live_->block;
    {
      const detail::LiveWrite write(b.seq);
      detail::LiveWrite::put(b.pid, static_cast<std::uint64_t>(::getpid()));
      detail::LiveWrite::put(b.attached_unix_ns, detail::unix_now_ns());
      detail::LiveWrite::put(b.detached_unix_ns, 0);
      detail::LiveWrite::put(b.num_chunks, n_);
    }
    publish(kLiveAll);
  }

  void publish(unsigned groups) noexcept {
    if (!live_ || live_->block == nullptr) return;
    detail::SchedulerBlock& b = *live_->block;
    using W = detail::LiveWrite;
    const W write(b.seq);
    if ((groups & kLiveLookups) != 0) {
      W::put(b.lookup_keys, stats_.lookup_keys);
      W::put(b.hits, stats_.hits);
      W::put(b.hits_pending, stats_.hits_pending);
      W::put(b.misses, stats_.misses);
    }
    if ((groups & kLiveStores) != 0) {
      W::put(b.stores_prepared, stats_.stores_prepared);
      W::put(b.stores_completed, stats_.stores_completed);
      W::put(b.stores_failed, stats_.stores_failed);
      W::put(b.stores_skipped_threshold, stats_.stores_skipped_threshold);
      W::put(b.allocation_failures, stats_.allocation_failures);
      W::put(b.evictions, stats_.evictions);
    }
    if ((groups & kLiveLoads) != 0) {
      W::put(b.loads_prepared, stats_.loads_prepared);
      W::put(b.loads_completed, stats_.loads_completed);
    }
    if ((groups & kLiveOccupancy) != 0) {
      W::put(b.ready_chunks, pool_.ready());
      W::put(b.used, pool_.ready() - pool_.free_count());
      W::put(b.write_pending, pending_);
      W::put(b.pinned, pinned_);
    }
  }

  std::uint32_t ready_chunks() const noexcept { return pool_.ready(); }

  void set_ready_chunks(std::uint64_t n) {
    if (n > n_ || n < pool_.ready()) {
      throw_invalid("manager: set_ready_chunks(" + std::to_string(n) +
                    ") is out of range: " + std::to_string(pool_.ready()) +
                    " chunks are ready already and the region has " + std::to_string(n_) +
                    "; the ready prefix only grows, up to num_chunks");
    }
    pool_.grow_ready(static_cast<std::uint32_t>(n));
  }

 private:
  enum : std::uint8_t { kFree = 0, kPending = 1, kReady = 2 };

  struct EventBatch {
    EventKind kind;
    std::size_t first;
    std::size_t count;
  };
  struct EventBuffer {
    std::vector<BlockKey> keys;
    std::vector<EventBatch> batches;
    std::vector<ManagerEvent> views;
  };

  [[nodiscard]] bool evictable(std::uint32_t s) const noexcept {
    return state_[s] == kReady && pins_[s] == 0;
  }

  // A fresh stamp for marks_; on wrap-around the marks are cleared so an old stamp never matches.
  std::uint32_t next_epoch() noexcept {
    if (++epoch_ == 0) {
      std::fill(marks_.begin(), marks_.end(), 0);
      epoch_ = 1;
    }
    return epoch_;
  }

  void record(EventKind kind, std::span<const BlockKey> keys) {
    if (!config_.record_events || keys.empty()) return;
    EventBuffer& buf = events_[active_];
    buf.batches.push_back(EventBatch{kind, buf.keys.size(), keys.size()});
    buf.keys.insert(buf.keys.end(), keys.begin(), keys.end());
  }

  ManagerConfig config_;
  std::unique_ptr<EvictionPolicy> policy_;
  bool vllm_ = false;  // ManagerSemantics::kVllm
  std::uint32_t n_ = 0;

  // Per slot.
  std::vector<BlockKey> keys_;
  std::vector<std::uint8_t> state_;
  std::vector<std::uint32_t> pins_;
  std::vector<std::uint32_t> marks_;   // epoch stamps: protection, repeats within one call
  std::vector<std::uint32_t> counts_;  // complete_load's per-call occurrence counts (under marks_)
  std::uint32_t epoch_ = 0;

  SlotPool pool_;  // the free slots of the ready ones (Note [Ready slots])
  KeyTable index_;
  std::uint64_t pending_ = 0;
  std::uint64_t pinned_ = 0;

  ThresholdTracker tracker_;  // the store threshold's lookup counts (off: threshold 0)

  // Reused buffers (views handed out point here).
  KeyTable dedup_;
  std::vector<BlockKey> plan_keys_;
  std::vector<std::uint32_t> plan_positions_;
  std::vector<SlotIndex> plan_slots_;
  std::vector<BlockKey> plan_evicted_;
  std::vector<SlotIndex> victims_;
  std::vector<SlotIndex> work_slots_;
  std::vector<SlotIndex> load_slots_;
  std::vector<std::uint32_t> completed_;
  std::vector<BlockKey> stored_keys_;

  EventBuffer events_[2];
  int active_ = 0;
  int drained_ = 1;

  ManagerStats stats_;
  std::shared_ptr<LiveLink> live_;  // null: not publishing
};

namespace {

ManagerConfig validated(ManagerConfig config) {
  constexpr std::uint64_t kMaxChunks = 0xFFFFFFFEull;  // kNoSlot is reserved
  // vLLM runs a CPU cache of 0 blocks (its size rounded down to nothing); natively it is an error.
  const std::uint64_t min_chunks = config.semantics == ManagerSemantics::kVllm ? 0 : 1;
  if (config.num_chunks < min_chunks || config.num_chunks > kMaxChunks) {
    throw_invalid("manager: num_chunks " + std::to_string(config.num_chunks) + " is out of range " +
                  std::to_string(min_chunks) + ".." + std::to_string(kMaxChunks));
  }
  if (config.ready_chunks && *config.ready_chunks > config.num_chunks) {
    throw_invalid("manager: ready_chunks " + std::to_string(*config.ready_chunks) +
                  " exceeds num_chunks " + std::to_string(config.num_chunks));
  }
  if (!is_policy_kind(config.policy)) {
    throw_invalid("manager: policy " + std::to_string(static_cast<int>(config.policy)) +
                  " is unknown");
  }
  if (config.semantics != ManagerSemantics::kNative &&
      config.semantics != ManagerSemantics::kVllm) {
    throw_invalid("manager: semantics " + std::to_string(static_cast<int>(config.semantics)) +
                  " is unknown; expected native (0) or vllm (1)");
  }
  if (config.store_threshold > 0) {
    if (config.threshold_tracker_capacity == 0) {
      config.threshold_tracker_capacity = std::max<std::uint64_t>(config.num_chunks, 1024);
    }
    if (config.threshold_tracker_capacity > kMaxChunks) {
      throw_invalid("manager: threshold_tracker_capacity " +
                    std::to_string(config.threshold_tracker_capacity) + " is out of range 1.." +
                    std::to_string(kMaxChunks));
    }
  }
  return config;
}

}  // namespace

void Manager::validate(const ManagerConfig& config) {
  (void)validated(config);
}

Manager::Manager(const ManagerConfig& config) : Manager(config, nullptr) {}

Manager::Manager(const ManagerConfig& config, std::unique_ptr<EvictionPolicy> policy) {
  const ManagerConfig checked = validated(config);
  if (policy == nullptr) {
    const auto n = static_cast<std::uint32_t>(checked.num_chunks);
    policy = checked.semantics == ManagerSemantics::kVllm ? make_vllm_policy(checked.policy, n)
                                                          : make_policy(checked.policy, n);
  } else if (policy->capacity() != checked.num_chunks) {
    throw_invalid("manager: the eviction policy was built for " +
                  std::to_string(policy->capacity()) + " slots, the manager has " +
                  std::to_string(checked.num_chunks));
  }
  impl_ = std::make_unique<Impl>(checked, std::move(policy));
}

Manager::~Manager() = default;
Manager::Manager(Manager&&) noexcept = default;
Manager& Manager::operator=(Manager&&) noexcept = default;

const ManagerConfig& Manager::config() const noexcept {
  return impl_->config();
}
std::uint32_t Manager::num_chunks() const noexcept {
  return impl_->num_chunks();
}
const EvictionPolicy& Manager::policy() const noexcept {
  return impl_->policy();
}

std::size_t Manager::lookup(std::span<const BlockKey> keys, std::span<LookupResult> results) {
  const std::size_t prefix = impl_->lookup(keys, results);
  impl_->publish(Impl::kLiveLookups);
  return prefix;
}
StorePlan Manager::prepare_store(std::span<const BlockKey> keys,
                                 std::span<const BlockKey> protected_keys) {
  StorePlan plan = impl_->prepare_store(keys, protected_keys);
  impl_->publish(Impl::kLiveStores | Impl::kLiveOccupancy);
  return plan;
}
std::span<const std::uint32_t> Manager::complete_store(std::span<const BlockKey> keys,
                                                       bool success) {
  const std::span<const std::uint32_t> done = impl_->complete_store(keys, success);
  impl_->publish(Impl::kLiveStores | Impl::kLiveOccupancy);
  return done;
}
void Manager::prepare_load(std::span<const BlockKey> keys, std::span<SlotIndex> slots_out) {
  impl_->prepare_load(keys, slots_out);
  impl_->publish(Impl::kLiveLoads | Impl::kLiveOccupancy);
}
std::span<const SlotIndex> Manager::prepare_load(std::span<const BlockKey> keys) {
  const std::span<const SlotIndex> slots = impl_->prepare_load(keys);
  impl_->publish(Impl::kLiveLoads | Impl::kLiveOccupancy);
  return slots;
}
void Manager::complete_load(std::span<const BlockKey> keys) {
  impl_->complete_load(keys);
  impl_->publish(Impl::kLiveLoads | Impl::kLiveOccupancy);
}
void Manager::touch(std::span<const BlockKey> keys) {
  impl_->touch(keys);
}
void Manager::reset() {
  impl_->reset();
  impl_->publish(Impl::kLiveAll);
}
LookupResult Manager::state_of(const BlockKey& key) const noexcept {
  return impl_->state_of(key);
}
SlotIndex Manager::slot_of(const BlockKey& key) const noexcept {
  return impl_->slot_of(key);
}
bool Manager::contains(const BlockKey& key) const noexcept {
  return impl_->slot_of(key) != kNoSlot;
}
std::uint32_t Manager::pin_count(const BlockKey& key) const noexcept {
  return impl_->pin_count(key);
}
std::uint32_t Manager::threshold_count(const BlockKey& key) const noexcept {
  return impl_->tracked_count(key);
}
std::span<const ManagerEvent> Manager::take_events() {
  return impl_->take_events();
}
ManagerStats Manager::stats() const noexcept {
  return impl_->stats();
}
void Manager::reset_stats() noexcept {
  impl_->reset_stats();
  impl_->publish(Impl::kLiveAll);
}
std::uint32_t Manager::ready_chunks() const noexcept {
  return impl_->ready_chunks();
}
void Manager::set_ready_chunks(std::uint64_t n) {
  impl_->set_ready_chunks(n);
  impl_->publish(Impl::kLiveOccupancy);
}
void Manager::publish_live_stats(LivePageSink& page) {
  impl_->attach_live(page);
}

}  // namespace kvoffload
