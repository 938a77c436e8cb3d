#include <unistd.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/live_page.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/tiered_store.hpp>

#include "live/live_page.hpp"
#include "util/log.hpp"
#include "util/rate_limited_log.hpp"

namespace kvoffload {

PrimaryRows PrimaryRows::of(const Region& region) {
  const RegionGeometry& g = region.geometry();
  return PrimaryRows{.base = region.data(),
                     .row_stride = g.row_stride(),
                     .row_bytes = static_cast<std::uint64_t>(g.copies()) * g.slot_stride(),
                     .num_rows = g.num_chunks()};
}

std::span<std::byte> PrimaryRows::row(SlotIndex slot) const {
  if (slot >= num_rows) {
    throw_invalid("primary row " + std::to_string(slot) + " is out of range (" +
                  std::to_string(num_rows) + " rows)");
  }
  return {base + static_cast<std::uint64_t>(slot) * row_stride, row_bytes};
}

TieredStore::TieredStore(Manager& primary, PrimaryRows rows, std::vector<SecondaryTier*> tiers)
    : primary_(primary),
      rows_(rows),
      tiers_(std::move(tiers)),
      tier_counters_(tiers_.size()),
      warnings_(std::make_unique<detail::RateLimitedLog>()) {
  if (rows_.base == nullptr || rows_.row_bytes == 0 || rows_.row_bytes > rows_.row_stride) {
    throw_invalid("tiered store: primary rows are empty or row_bytes exceeds row_stride");
  }
  if (rows_.num_rows != primary_.num_chunks()) {
    throw_invalid("tiered store: the region has " + std::to_string(rows_.num_rows) +
                  " rows but the manager " + std::to_string(primary_.num_chunks()) + " chunks");
  }
  for (auto* t : tiers_) {
    if (t == nullptr) throw_invalid("tiered store: a secondary tier is null");
  }
}

TieredStore::~TieredStore() {
  try {
    drain();
  } catch (const std::exception& e) {
    log().error("tiered store: draining at destruction failed: {}", e.what());
  }
  (void)warnings_->flush("tiered store");
}

void TieredStore::ask_tiers(std::span<const BlockKey> keys, bool count) {
  // One batched lookup per tier (no per-key virtual call); a key a faster tier holds is not asked
  // of slower ones. A pending answer may still be overridden by a later tier that holds the key.
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    ask_keys_.clear();
    ask_index_.clear();
    for (const std::size_t i : miss_index_) {
      if (locations_[i] == TierLocation::kSecondary) continue;
      ask_keys_.push_back(keys[i]);
      ask_index_.push_back(i);
    }
    if (ask_keys_.empty()) return;
    presence_.resize(ask_keys_.size());
    tiers_[t]->lookup(ask_keys_, presence_);
    // Counted for lookup() only: promote() asks again about keys lookup() already counted.
    TierCounters scratch;
    TierCounters& counters = count ? tier_counters_[t] : scratch;
    counters.lookups += ask_keys_.size();
    for (std::size_t j = 0; j < ask_index_.size(); ++j) {
      const std::size_t i = ask_index_[j];
      if (presence_[j] == TierPresence::kPresent) {
        locations_[i] = TierLocation::kSecondary;
        source_tier_[i] = t;
        ++counters.present;
      } else if (presence_[j] == TierPresence::kPending) {
        locations_[i] = TierLocation::kSecondaryPending;
        ++counters.pending;
      }
    }
  }
}

TieredLookup TieredStore::lookup(std::span<const BlockKey> keys, std::span<TierLocation> out) {
  if (!out.empty() && out.size() < keys.size()) {
    throw_invalid("tiered lookup: out holds " + std::to_string(out.size()) + " entries for " +
                  std::to_string(keys.size()) + " keys");
  }
  if (lookup_scratch_.size() < keys.size()) lookup_scratch_.resize(keys.size());
  const std::span<LookupResult> results(lookup_scratch_.data(), keys.size());
  TieredLookup r;
  r.primary_prefix = primary_.lookup(keys, results);
  locations_.assign(keys.size(), TierLocation::kMiss);
  source_tier_.assign(keys.size(), 0);
  miss_index_.clear();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    switch (results[i]) {
      case LookupResult::kHit:
        locations_[i] = TierLocation::kPrimary;
        break;
      case LookupResult::kHitPending:
        locations_[i] = TierLocation::kPrimaryPending;
        break;
      case LookupResult::kMiss:
        miss_index_.push_back(i);
        break;
    }
  }
  ask_tiers(keys, /*count=*/true);
  if (!miss_index_.empty()) publish_live();
  bool available = true;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const TierLocation loc = locations_[i];
    if (available && (loc == TierLocation::kPrimary || loc == TierLocation::kSecondary)) {
      ++r.available_prefix;
    } else {
      available = false;
    }
    if (loc == TierLocation::kSecondaryPending) ++r.pending;
    if (!out.empty()) out[i] = loc;
  }
  return r;
}

void TieredStore::complete_store(std::span<const BlockKey> keys, bool success) {
  primary_.complete_store(keys, success);
  if (!success || tiers_.empty() || keys.empty()) return;
  std::vector<TierPut> puts(keys.size());
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    SecondaryTier* tier = tiers_[t];
    // Note [Offload pins]: the pin keeps the slot's bytes stable until the tier has read them;
    // without it a later prepare_store could evict the key and reuse the slot mid-write.
    const std::span<const SlotIndex> slots = primary_.prepare_load(keys);
    for (std::size_t i = 0; i < keys.size(); ++i) puts[i] = TierPut{keys[i], rows_.row(slots[i])};
    TierBatch batch;
    try {
      batch = tier->put(puts);
    } catch (...) {
      primary_.complete_load(keys);
      throw;
    }
    offloads_.push_back(
        Offload{std::move(batch), std::vector<BlockKey>(keys.begin(), keys.end()), t});
    stats_.offload_keys += keys.size();
  }
}

PromoteTicket TieredStore::promote(std::span<const BlockKey> keys,
                                   std::span<const BlockKey> protected_keys) {
  PromoteTicket ticket;
  std::vector<BlockKey> candidates;
  std::unordered_map<BlockKey, std::size_t, BlockKeyHash> source;  // key -> tier index
  locations_.assign(keys.size(), TierLocation::kMiss);
  source_tier_.assign(keys.size(), 0);
  miss_index_.clear();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (primary_.state_of(keys[i]) == LookupResult::kMiss) miss_index_.push_back(i);
  }
  ask_tiers(keys, /*count=*/false);  // a key still pending at a tier is not promoted now
  for (const std::size_t i : miss_index_) {
    if (locations_[i] != TierLocation::kSecondary || source.contains(keys[i])) continue;
    source.emplace(keys[i], source_tier_[i]);
    candidates.push_back(keys[i]);
  }
  if (candidates.empty()) return ticket;
  std::vector<BlockKey> guard(keys.begin(), keys.end());
  guard.insert(guard.end(), protected_keys.begin(), protected_keys.end());
  const StorePlan plan = primary_.prepare_store(candidates, guard);
  if (!plan.ok()) {
    ticket.status = plan.status;
    ticket.reason = plan.reason;
    log().debug("tiered store: promotion refused: {}", plan.describe());
    return ticket;
  }
  ticket.keys.assign(plan.keys.begin(), plan.keys.end());
  ticket.evicted.assign(plan.evicted.begin(), plan.evicted.end());
  if (ticket.keys.empty()) return ticket;

  Promotion p;
  p.id = next_id_++;
  std::vector<std::vector<TierGet>> gets(tiers_.size());
  std::vector<std::vector<BlockKey>> by_tier(tiers_.size());
  for (std::size_t i = 0; i < plan.keys.size(); ++i) {
    const std::size_t t = source.at(plan.keys[i]);
    gets[t].push_back(TierGet{plan.keys[i], rows_.row(plan.slots[i])});
    by_tier[t].push_back(plan.keys[i]);
  }
  std::size_t t = 0;
  try {
    for (; t < tiers_.size(); ++t) {
      if (gets[t].empty()) continue;
      TierBatch batch = tiers_[t]->get(gets[t]);
      p.reads.push_back(PromotionRead{t, std::move(batch), std::move(gets[t])});
    }
  } catch (...) {
    // Keys not handed to a tier free their slots now; those handed over finish in poll().
    std::vector<BlockKey> unsent;
    for (; t < tiers_.size(); ++t)
      unsent.insert(unsent.end(), by_tier[t].begin(), by_tier[t].end());
    if (!unsent.empty()) primary_.complete_store(unsent, false);
    if (!p.reads.empty()) promotions_.push_back(std::move(p));
    throw;
  }
  stats_.promote_keys += ticket.keys.size();
  ticket.id = p.id;
  promotions_.push_back(std::move(p));
  return ticket;
}

std::vector<PromoteCompletion> TieredStore::progress(bool block) {
  // Offloads: release the pins of finished batches.
  for (auto it = offloads_.begin(); it != offloads_.end();) {
    if (!block && !it->batch.ready()) {
      ++it;
      continue;
    }
    std::size_t failed = 0;
    std::string first_failure;
    int first_errno = 0;
    for (const auto& r : it->batch.wait()) {
      if (r.status == TierItemStatus::kOk) {
        ++stats_.offload_ok;
        ++tier_counters_[it->tier].offloaded;
      } else {
        ++stats_.offload_failed;
        ++tier_counters_[it->tier].offload_failed;
        if (failed++ == 0) {
          first_failure = r.key.to_hex() + ": " + r.detail;
          first_errno = r.sys_errno;
        }
      }
    }
    if (failed > 0) {
      warnings_->warn(
          "offload " + (first_errno != 0 ? errno_name(first_errno) : std::string("error")),
          "tiered store: {} of {} keys were not written to a secondary tier (first: {})", failed,
          it->keys.size(), first_failure);
    }
    primary_.complete_load(it->keys);
    it = offloads_.erase(it);
  }
  // Promotions: fold finished reads in (falling through to later tiers), then complete the
  // primary stores of promotions whose reads are all done.
  std::vector<PromoteCompletion> done;
  for (auto it = promotions_.begin(); it != promotions_.end();) {
    bool pending = false;
    // consume() may append reads; index, not iterators, and re-check the size each round.
    for (std::size_t r = 0; r < it->reads.size(); ++r) {
      if (it->reads[r].consumed) continue;
      if (!block && !it->reads[r].batch.ready()) {
        pending = true;
        continue;
      }
      if (consume(*it, it->reads[r]) && !block) pending = true;
    }
    for (const auto& read : it->reads) pending = pending || !read.consumed;
    if (pending) {
      ++it;
      continue;
    }
    PromoteCompletion c;
    c.id = it->id;
    c.promoted = std::move(it->promoted);
    c.failed = std::move(it->failed);
    std::vector<BlockKey> failed_keys;
    failed_keys.reserve(c.failed.size());
    for (const auto& f : c.failed) failed_keys.push_back(f.key);
    // Primary (not this->complete_store): promoted keys are already in the tier they came from.
    if (!c.promoted.empty()) primary_.complete_store(c.promoted, true);
    if (!failed_keys.empty()) primary_.complete_store(failed_keys, false);
    stats_.promoted += c.promoted.size();
    stats_.promote_failed += c.failed.size();
    done.push_back(std::move(c));
    it = promotions_.erase(it);
  }
  return done;
}

bool TieredStore::consume(Promotion& p, PromotionRead& read) {
  read.consumed = true;
  const std::vector<TierItemResult> results = read.batch.wait();
  const std::size_t from = read.tier;
  // Fall-through gets per later tier (Note [Promotion fall-through]); `read` may dangle once
  // p.reads grows, so everything needed from it is copied first.
  std::vector<std::vector<TierGet>> again(tiers_.size());
  bool any = false;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const TierItemResult& r = results[i];
    if (r.status == TierItemStatus::kOk) {
      p.promoted.push_back(r.key);
      ++tier_counters_[from].promoted;
      continue;
    }
    ++tier_counters_[from].promote_failed;
    std::size_t next = from + 1;
    while (next < tiers_.size() && !tiers_[next]->contains(r.key)) ++next;
    if (next == tiers_.size()) {
      p.failed.push_back(r);
      continue;
    }
    log().debug("tiered store: promotion of {} from tier '{}' gave {} ({}); trying tier '{}'",
                r.key.to_hex(), tiers_[from]->name(), to_string(r.status), r.detail,
                tiers_[next]->name());
    again[next].push_back(read.gets[i]);
    any = true;
  }
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (again[t].empty()) continue;
    try {
      TierBatch batch = tiers_[t]->get(again[t]);
      p.reads.push_back(PromotionRead{t, std::move(batch), std::move(again[t])});
    } catch (const std::exception& e) {
      for (const auto& g : again[t]) {
        p.failed.push_back(TierItemResult{g.key, TierItemStatus::kFailed, 0,
                                          "tier '" + tiers_[t]->name() + "' get: " + e.what()});
      }
    }
  }
  return any;
}

std::vector<PromoteCompletion> TieredStore::poll() {
  const bool busy = !offloads_.empty() || !promotions_.empty();
  std::vector<PromoteCompletion> done = progress(false);
  if (busy) publish_live();
  return done;
}
std::vector<PromoteCompletion> TieredStore::drain() {
  const bool busy = !offloads_.empty() || !promotions_.empty();
  std::vector<PromoteCompletion> done = progress(true);
  if (busy) publish_live();
  return done;
}

// The tiers block this store writes; the region's close() clears it (Note [Live stats]).
struct TieredStore::LiveLink {
  detail::TiersBlock* block = nullptr;
};

void TieredStore::publish_live_stats(LivePageSink& sink) {
  detail::LivePage* page = detail::live_page_of(sink);
  if (page == nullptr) {
    throw Error(ErrorCode::kState, "publish_live_stats: " + sink.live_name() + " is closed");
  }
  auto link = std::make_shared<LiveLink>();
  link->block = &page->tiers;
  sink.on_live_close([weak = std::weak_ptr<LiveLink>(link)] {
    if (auto l = weak.lock()) l->block = nullptr;
  });
  live_ = std::move(link);
  detail::TiersBlock& b = *live_->block;
  const std::size_t count = std::min<std::size_t>(tiers_.size(), detail::kLiveMaxTiers);
  if (count < tiers_.size()) {
    log().warn("tiered store: {} secondary tiers; the live statistics page shows the first {}",
               tiers_.size(), count);
  }
  {
    const detail::LiveWrite write(b.seq);
    detail::LiveWrite::put(b.pid, static_cast<std::uint64_t>(::getpid()));
    detail::LiveWrite::put(b.count, count);
    for (std::size_t t = 0; t < count; ++t) detail::put_tier_name(b.tiers[t], tiers_[t]->name());
  }
  publish_live();
}

void TieredStore::publish_live() noexcept {
  if (!live_ || live_->block == nullptr) return;
  detail::TiersBlock& b = *live_->block;
  using W = detail::LiveWrite;
  const W write(b.seq);
  const std::size_t count = std::min<std::size_t>(tiers_.size(), detail::kLiveMaxTiers);
  for (std::size_t t = 0; t < count; ++t) {
    const TierCounters& c = tier_counters_[t];
    detail::TierEntry& e = b.tiers[t];
    W::put(e.lookups, c.lookups);
    W::put(e.present, c.present);
    W::put(e.pending, c.pending);
    W::put(e.promoted, c.promoted);
    W::put(e.promote_failed, c.promote_failed);
    W::put(e.offloaded, c.offloaded);
    W::put(e.offload_failed, c.offload_failed);
  }
}

TieredStats TieredStore::stats() const noexcept {
  TieredStats s = stats_;
  s.offloads_in_flight = offloads_.size();
  s.promotions_in_flight = promotions_.size();
  return s;
}

}  // namespace kvoffload
