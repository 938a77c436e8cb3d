// The presence cache: what the tier knows of each chunk (present, absent, being checked) from
// its own puts and gets and from existence checks, so lookup() and known() answer from memory
// and a chunk is asked about at most once per answer's lifetime (negative_ttl, lookup_timeout).
#include <vector>

#include "tier/remote/remote_tier_impl.hpp"

namespace kvoffload {

void RemoteTier::Impl::make_room() {
  if (presence.size() < o.presence_capacity) return;
  std::erase_if(presence, [](const auto& kv) { return kv.second.state != Known::kPending; });
}

void RemoteTier::Impl::remember(const BlockKey& key, Known state, bool counted) {
  std::lock_guard lock(presence_mutex);
  auto it = presence.find(key);
  if (it == presence.end()) {
    make_room();
    if (presence.size() >= o.presence_capacity) return;
    it = presence.emplace(key, PresenceEntry{}).first;
  }
  it->second = PresenceEntry{state, counted, false, RemoteClock::now()};
}

void RemoteTier::Impl::forget(const BlockKey& key) {
  std::lock_guard lock(presence_mutex);
  presence.erase(key);
}

void RemoteTier::Impl::resolve(const BlockKey& key, Known state, bool counted) {
  std::lock_guard lock(presence_mutex);
  const auto it = presence.find(key);
  if (it == presence.end() || it->second.state != Known::kPending) return;
  if (state == Known::kAbsent && !it->second.counted && !counted) ++lookup_absent;
  // An answer that lands after the budget already gave "absent" counts as delivered.
  it->second = PresenceEntry{state, true, it->second.delivered, RemoteClock::now()};
}

std::optional<TierPresence> RemoteTier::Impl::answer_locked(PresenceEntry& e,
                                                            RemoteClock::time_point now) {
  if (e.state == Known::kPresent) return TierPresence::kPresent;
  // A resolved absent answer reaches the caller at least once, then lives negative_ttl (at
  // least lookup_timeout, so a caller polling a batch sees every key settle).
  if (e.state == Known::kAbsent && (!e.delivered || now - e.at < absent_ttl)) {
    e.delivered = true;
    return TierPresence::kAbsent;
  }
  if (e.state == Known::kPending) {
    if (now - e.at < o.lookup_timeout) return TierPresence::kPending;
    // The budget ran out: a miss now, never a stall; the answer may still land later.
    if (!e.counted) {
      e.counted = true;
      ++lookup_absent;
      ++lookup_timeouts;
    }
    e.delivered = true;
    return TierPresence::kAbsent;
  }
  return std::nullopt;
}

std::vector<BlockKey> RemoteTier::Impl::answer_or_claim(std::span<const BlockKey> keys,
                                                        std::span<TierPresence> out) {
  std::vector<BlockKey> ask;
  const auto now = RemoteClock::now();
  std::lock_guard lock(presence_mutex);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto it = presence.find(keys[i]);
    if (it != presence.end()) {
      if (const auto answer = answer_locked(it->second, now)) {
        out[i] = *answer;
        continue;
      }
      it->second = PresenceEntry{Known::kPending, false, false, now};  // an expired answer
    } else {
      make_room();
      if (presence.size() >= o.presence_capacity) {
        out[i] = TierPresence::kAbsent;  // every remembered key is in flight: no room to ask
        continue;
      }
      presence.emplace(keys[i], PresenceEntry{Known::kPending, false, false, now});
    }
    ask.push_back(keys[i]);
    out[i] = TierPresence::kPending;
  }
  return ask;
}

}  // namespace kvoffload
