// Manager: slot states, key index, threshold tracker and events over an EvictionPolicy.
// See manager.hpp for the contract; Note [Parked slots] in eviction_policy.hpp for how pinned and
// write-pending chunks stay out of eviction.
#include <kvoffload/manager.hpp>

#include "manager/key_table.hpp"

#include <kvoffload/error.hpp>

#include <algorithm>
#include <limits>
#include <utility>

namespace kvoffload {

std::string_view lookup_result_name(LookupResult result) noexcept {
  switch (result) {
    case LookupResult::kMiss: return "miss";
    case LookupResult::kHit: return "hit";
    case LookupResult::kHitPending: return "hit_pending";
  }
  return "unknown";
}

std::string_view cannot_store_reason_name(CannotStoreReason reason) noexcept {
  switch (reason) {
    case CannotStoreReason::kNone: return "none";
    case CannotStoreReason::kNoEvictableSpace: return "no_evictable_space";
    case CannotStoreReason::kTooManyKeys: return "too_many_keys";
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

namespace detail {

class ManagerImpl {
 public:
  ManagerImpl(const ManagerConfig& config, std::unique_ptr<EvictionPolicy> policy)
      : config_(config), policy_(std::move(policy)) {
    n_ = static_cast<std::uint32_t>(config.num_chunks);
    keys_.resize(n_);
    state_.assign(n_, kFree);
    pins_.assign(n_, 0);
    marks_.assign(n_, 0);
    counts_.assign(n_, 0);
    free_.reserve(n_);
    // Note [Ready slots]: only the slots of rows the region has made ready on every rank are ever
    // handed out; the rest join the free stack as set_ready_chunks() grows the ready prefix.
    ready_ = static_cast<std::uint32_t>(config.ready_chunks.value_or(n_));
    for (std::uint32_t s = ready_; s > 0; --s) free_.push_back(s - 1);  // slot 0 is handed out first
    index_.init(n_);
    if (config_.store_threshold > 0) {
      tracker_.resize(config_.threshold_tracker_capacity);
      tracker_index_.init(tracker_.size());
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
      if (in_prefix && r == LookupResult::kHit) ++prefix;
      else in_prefix = false;
      if (!results.empty()) results[i] = r;
      if (config_.store_threshold > 0) track(keys[i]);
    }
    stats_.lookup_keys += keys.size();
    return prefix;
  }

  StorePlan prepare_store(std::span<const BlockKey> keys, std::span<const BlockKey> protected_keys) {
    const std::uint32_t epoch = next_epoch();
    plan_keys_.clear();
    plan_slots_.clear();
    plan_evicted_.clear();
    StorePlan plan;

    // Protect every present key of the call and of the extra set; count the evictable ones among
    // them, so the capacity check below is exact before anything changes.
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
    // New keys, each once (a scratch set over this call's keys finds repeats).
    dedup_.init(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const BlockKey& key = keys[i];
      const std::uint32_t s = find(key);
      if (s != KeyTable::kNone) {
        protect(s);
        ++plan.skipped_present;
        continue;
      }
      if (config_.store_threshold > 0 && tracked_count(key) < config_.store_threshold) {
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
    }
    stats_.stores_skipped_threshold += plan.skipped_threshold;

    const std::uint64_t needed = plan_keys_.size();
    const std::uint64_t free_slots = free_.size();
    const std::uint64_t evictable_slots = ready_ - free_slots - pending_ - pinned_;
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
    if (!plan.ok()) {
      ++stats_.allocation_failures;
      plan_keys_.clear();
      plan.keys = plan_keys_;
      plan.slots = plan_slots_;
      plan.evicted = plan_evicted_;
      return plan;
    }

    if (needed > free_slots) {
      const std::size_t to_evict = needed - free_slots;
      victims_.resize(to_evict);
      const VictimFilter filter{marks_.data(), epoch};
      const std::size_t got = policy_->evict(to_evict, filter, keys_, victims_);
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
        free_.push_back(v);
      }
      stats_.evictions += victims_.size();
      record(EventKind::kRemoved, plan_evicted_);
      if (got != to_evict) {
        throw Error(ErrorCode::kInternal, "prepare_store: the eviction policy '" +
                                              std::string(policy_->name()) + "' found " +
                                              std::to_string(got) + " victims of " +
                                              std::to_string(to_evict) + " it had");
      }
    }

    for (const BlockKey& key : plan_keys_) {
      const std::uint32_t s = free_.back();
      free_.pop_back();
      keys_[s] = key;
      state_[s] = kPending;
      index_.insert(key, s);
      plan_slots_.push_back(s);
    }
    policy_->insert(plan_slots_, plan_keys_);
    pending_ += needed;
    stats_.stores_prepared += needed;

    plan.keys = plan_keys_;
    plan.slots = plan_slots_;
    plan.evicted = plan_evicted_;
    return plan;
  }

  void complete_store(std::span<const BlockKey> keys, bool success) {
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
        free_.push_back(s);
      }
      stats_.stores_failed += work_slots_.size();
    }
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
        throw Error(ErrorCode::kState, "prepare_load: key " + keys[i].to_hex() +
                                           " is write-pending; it can be loaded after complete_store");
      }
      if (pins_[s] == std::numeric_limits<std::uint32_t>::max()) {
        throw Error(ErrorCode::kState, "prepare_load: key " + keys[i].to_hex() + " has too many readers");
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
    for (const BlockKey& key : keys) {
      const std::uint32_t s = find(key);
      if (s != KeyTable::kNone) work_slots_.push_back(s);
    }
    policy_->touch(work_slots_);
  }

  void reset() {
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
    free_.clear();
    for (std::uint32_t s = ready_; s > 0; --s) free_.push_back(s - 1);
    index_.clear();
    policy_->reset();
    if (!tracker_.empty()) {
      tracker_index_.clear();
      tracker_size_ = 0;
      tracker_next_ = 0;
    }
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
  std::uint32_t tracked_count(const BlockKey& key) const noexcept {
    if (tracker_.empty()) return 0;
    const std::uint32_t t =
        tracker_index_.find(key, [this](std::uint32_t i) -> const BlockKey& { return tracker_[i].key; });
    return t == KeyTable::kNone ? 0 : tracker_[t].count;
  }

  std::span<const ManagerEvent> take_events() {
    std::swap(active_, drained_);
    EventBuffer& out = events_[drained_];
    out.views.clear();
    for (const auto& b : out.batches) {
      out.views.push_back(ManagerEvent{b.kind, std::span<const BlockKey>(out.keys).subspan(b.first, b.count)});
    }
    EventBuffer& next = events_[active_];
    next.keys.clear();
    next.batches.clear();
    return out.views;
  }

  ManagerStats stats() const noexcept {
    ManagerStats s = stats_;
    s.num_chunks = n_;
    s.ready_chunks = ready_;
    s.used = ready_ - free_.size();
    s.write_pending = pending_;
    s.pinned = pinned_;
    s.evictable = s.used - pending_ - pinned_;
    const double n = static_cast<double>(n_);
    s.usage = static_cast<double>(s.used) / n;
    s.write_pending_fraction = static_cast<double>(pending_) / n;
    s.pinned_fraction = static_cast<double>(pinned_) / n;
    s.policy = policy_->counters();
    return s;
  }

  void reset_stats() noexcept { stats_ = ManagerStats{}; }

  std::uint32_t ready_chunks() const noexcept { return ready_; }

  void set_ready_chunks(std::uint64_t n) {
    if (n > n_ || n < ready_) {
      throw_invalid("manager: set_ready_chunks(" + std::to_string(n) + ") is out of range: " +
                    std::to_string(ready_) + " chunks are ready already and the region has " +
                    std::to_string(n_) + "; the ready prefix only grows, up to num_chunks");
    }
    // New slots go on top of the free stack (free_ was reserved for n_: no allocation here).
    for (auto s = static_cast<std::uint32_t>(n); s > ready_; --s) free_.push_back(s - 1);
    ready_ = static_cast<std::uint32_t>(n);
  }

 private:
  enum : std::uint8_t { kFree = 0, kPending = 1, kReady = 2 };

  struct TrackerEntry {
    BlockKey key;
    std::uint32_t count = 0;
  };
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

  [[nodiscard]] bool evictable(std::uint32_t s) const noexcept { return state_[s] == kReady && pins_[s] == 0; }

  // A fresh stamp for marks_; on wrap-around the marks are cleared so an old stamp never matches.
  std::uint32_t next_epoch() noexcept {
    if (++epoch_ == 0) {
      std::fill(marks_.begin(), marks_.end(), 0);
      epoch_ = 1;
    }
    return epoch_;
  }

  // Counts one lookup of key; a full tracker forgets the key that entered it first.
  void track(const BlockKey& key) {
    const auto at = [this](std::uint32_t i) -> const BlockKey& { return tracker_[i].key; };
    const std::uint32_t t = tracker_index_.find(key, at);
    if (t != KeyTable::kNone) {
      if (tracker_[t].count != std::numeric_limits<std::uint32_t>::max()) ++tracker_[t].count;
      return;
    }
    const auto slot = static_cast<std::uint32_t>(tracker_next_);
    if (tracker_size_ == tracker_.size()) tracker_index_.erase(tracker_[slot].key, slot);
    else ++tracker_size_;
    tracker_[slot] = TrackerEntry{key, 1};
    tracker_index_.insert(key, slot);
    tracker_next_ = (tracker_next_ + 1) % tracker_.size();
  }

  void record(EventKind kind, std::span<const BlockKey> keys) {
    if (!config_.record_events || keys.empty()) return;
    EventBuffer& buf = events_[active_];
    buf.batches.push_back(EventBatch{kind, buf.keys.size(), keys.size()});
    buf.keys.insert(buf.keys.end(), keys.begin(), keys.end());
  }

  ManagerConfig config_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::uint32_t n_ = 0;
  std::uint32_t ready_ = 0;  // slots [0, ready_) may be handed out (Note [Ready slots])

  // Per slot.
  std::vector<BlockKey> keys_;
  std::vector<std::uint8_t> state_;
  std::vector<std::uint32_t> pins_;
  std::vector<std::uint32_t> marks_;   // epoch stamps: protection, repeats within one call
  std::vector<std::uint32_t> counts_;  // complete_load's per-call occurrence counts (under marks_)
  std::uint32_t epoch_ = 0;

  std::vector<SlotIndex> free_;  // stack of free slots
  KeyTable index_;
  std::uint64_t pending_ = 0;
  std::uint64_t pinned_ = 0;

  // Store threshold tracker: a ring of (key, lookups), oldest overwritten first.
  std::vector<TrackerEntry> tracker_;
  KeyTable tracker_index_;
  std::size_t tracker_size_ = 0;
  std::size_t tracker_next_ = 0;

  // Reused buffers (views handed out point here).
  KeyTable dedup_;
  std::vector<BlockKey> plan_keys_;
  std::vector<SlotIndex> plan_slots_;
  std::vector<BlockKey> plan_evicted_;
  std::vector<SlotIndex> victims_;
  std::vector<SlotIndex> work_slots_;
  std::vector<SlotIndex> load_slots_;

  EventBuffer events_[2];
  int active_ = 0;
  int drained_ = 1;

  ManagerStats stats_;
};

}  // namespace detail

namespace {

ManagerConfig validated(ManagerConfig config) {
  constexpr std::uint64_t kMaxChunks = 0xFFFFFFFEull;  // kNoSlot is reserved
  if (config.num_chunks == 0 || config.num_chunks > kMaxChunks) {
    throw_invalid("manager: num_chunks " + std::to_string(config.num_chunks) + " is out of range 1.." +
                  std::to_string(kMaxChunks));
  }
  if (config.ready_chunks && *config.ready_chunks > config.num_chunks) {
    throw_invalid("manager: ready_chunks " + std::to_string(*config.ready_chunks) +
                  " exceeds num_chunks " + std::to_string(config.num_chunks));
  }
  if (config.policy != PolicyKind::kLru && config.policy != PolicyKind::kArc) {
    throw_invalid("manager: policy " + std::to_string(static_cast<int>(config.policy)) + " is unknown");
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

void Manager::validate(const ManagerConfig& config) { (void)validated(config); }

Manager::Manager(const ManagerConfig& config) : Manager(config, nullptr) {}

Manager::Manager(const ManagerConfig& config, std::unique_ptr<EvictionPolicy> policy) {
  const ManagerConfig checked = validated(config);
  if (policy == nullptr) {
    policy = make_policy(checked.policy, static_cast<std::uint32_t>(checked.num_chunks));
  } else if (policy->capacity() != checked.num_chunks) {
    throw_invalid("manager: the eviction policy was built for " + std::to_string(policy->capacity()) +
                  " slots, the manager has " + std::to_string(checked.num_chunks));
  }
  impl_ = std::make_unique<detail::ManagerImpl>(checked, std::move(policy));
}

Manager::~Manager() = default;
Manager::Manager(Manager&&) noexcept = default;
Manager& Manager::operator=(Manager&&) noexcept = default;

const ManagerConfig& Manager::config() const noexcept { return impl_->config(); }
std::uint32_t Manager::num_chunks() const noexcept { return impl_->num_chunks(); }
const EvictionPolicy& Manager::policy() const noexcept { return impl_->policy(); }

std::size_t Manager::lookup(std::span<const BlockKey> keys, std::span<LookupResult> results) {
  return impl_->lookup(keys, results);
}
StorePlan Manager::prepare_store(std::span<const BlockKey> keys, std::span<const BlockKey> protected_keys) {
  return impl_->prepare_store(keys, protected_keys);
}
void Manager::complete_store(std::span<const BlockKey> keys, bool success) {
  impl_->complete_store(keys, success);
}
void Manager::prepare_load(std::span<const BlockKey> keys, std::span<SlotIndex> slots_out) {
  impl_->prepare_load(keys, slots_out);
}
std::span<const SlotIndex> Manager::prepare_load(std::span<const BlockKey> keys) {
  return impl_->prepare_load(keys);
}
void Manager::complete_load(std::span<const BlockKey> keys) { impl_->complete_load(keys); }
void Manager::touch(std::span<const BlockKey> keys) { impl_->touch(keys); }
void Manager::reset() { impl_->reset(); }
LookupResult Manager::state_of(const BlockKey& key) const noexcept { return impl_->state_of(key); }
SlotIndex Manager::slot_of(const BlockKey& key) const noexcept { return impl_->slot_of(key); }
bool Manager::contains(const BlockKey& key) const noexcept { return impl_->slot_of(key) != kNoSlot; }
std::uint32_t Manager::pin_count(const BlockKey& key) const noexcept { return impl_->pin_count(key); }
std::uint32_t Manager::threshold_count(const BlockKey& key) const noexcept {
  return impl_->tracked_count(key);
}
std::span<const ManagerEvent> Manager::take_events() { return impl_->take_events(); }
ManagerStats Manager::stats() const noexcept { return impl_->stats(); }
void Manager::reset_stats() noexcept { impl_->reset_stats(); }
std::uint32_t Manager::ready_chunks() const noexcept { return impl_->ready_chunks(); }
void Manager::set_ready_chunks(std::uint64_t n) { impl_->set_ready_chunks(n); }

}  // namespace kvoffload
