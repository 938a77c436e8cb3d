// The node pool's eviction policy: one LRU, or ARC, over the whole node (docs/DESIGN.md §6.6).
//
// Note [Pool ARC]: ARC as the private Manager's (core/src/manager/arc_policy.cpp, Megiddo &
// Modha FAST'03), in the pool file. A writing or ready slot is in T1 (seen once) or T2 (seen
// again): SlotRecord::list, part of the record, so repair keeps it. The lists the header links
// (list_head[0..1]) hold only the evictable (ready, unpinned) ones, each ordered by stamp; |T1|
// and |T2| count every writing and ready slot of the list (pinned or writing slots are "parked",
// as in Note [Parked slots]). The ghosts B1 / B2 (keys evicted from T1 / T2, no chunk) are
// GhostRecords: slot_count of them, with a key table of their own (the slot table's hashing).
// The operations map onto the Manager's as follows, which the differential test checks against a
// Manager driven with the same stream (tests/pool/pool_model_test.cpp):
//  - a lookup hit (touch, or pin) promotes T1 -> T2 (a parked slot changes list only; it enters
//    T2's most recent end when its last pin goes), or makes a T2 slot most recent;
//  - a store takes a free slot, else evicts REPLACE's victim: walking T1 and T2 from their least
//    recent ends past slots protected in this call, T1's while |T1| > p (or T2 has none), else
//    T2's; the victim's key becomes the newest ghost of B1 / B2 (the ghost pool full: the oldest
//    B1 ghost when |T1| + |B1| >= c or B2 is empty, else the oldest B2 one);
//  - the stored key is admitted: a ghost in B1 raises p by max(1, |B2|/|B1|), one in B2 lowers it
//    by max(1, |B1|/|B2|), and the key enters T2; otherwise it enters T1 and the oldest B1
//    ghosts go while |T1| + |B1| > c;
//  - an aborted store, a dead tenant's writing slot, leaves without a ghost (the Manager's
//    remove()).
// A prepare_stores call is the Manager's prepare_store called once per stored key (so a ghost hit
// adapts p before the next key's victim is chosen), each with the whole call's keys protected.
// Differences, by design: a tenant at its cap evicts its own least recent chunk (its owner list,
// across T1 and T2), not REPLACE's choice among its chunks: the cap bounds what a tenant may take
// from the others, it is no second policy; its victim becomes a ghost of its list all the same.
// Crash safety: the ghosts and p are hints (a lost ghost costs one adaptation, never a chunk), so
// repair keeps them when check_ghosts finds them consistent and rebuilds them empty otherwise
// (a holder died inside a ghost change); p is one aligned word, clamped to [0, c].
#include <algorithm>

#include "pool/pool_impl.hpp"

namespace kvoffload::pool::detail {

void PoolImpl::promote(std::uint32_t s) const noexcept {
  SlotRecord& r = v_.slots[s];
  if (!arc() || r.list != 0) return;
  r.list = 1;
  --v_.h->n_list[0];
  ++v_.h->n_list[1];
}

std::uint32_t PoolImpl::pick_victim(bool own_only) const {
  const std::uint64_t epoch = v_.h->epoch;
  if (own_only) {
    for (std::uint32_t s = me().lru_tail; s != kNone; s = v_.slots[s].oprev)
      if (v_.slots[s].protect != epoch) return s;
    return kNone;
  }
  auto last = [&](std::uint32_t list) {
    for (std::uint32_t s = v_.h->list_tail[list]; s != kNone; s = v_.slots[s].prev)
      if (v_.slots[s].protect != epoch) return s;
    return kNone;
  };
  const std::uint32_t c1 = last(0);
  if (!arc()) return c1;
  const std::uint32_t c2 = last(1);
  const bool from_t1 = c1 != kNone && (v_.h->n_list[0] > v_.h->arc_target || c2 == kNone);
  return from_t1 ? c1 : c2;
}

void PoolImpl::drop_ghost(std::uint32_t g) const noexcept {
  PoolHeader& h = *v_.h;
  GhostRecord& r = v_.ghosts[g];
  const std::uint32_t list = r.list - 1;
  v_.gremove(list, g);
  step();  // half-dropped: repair finds the ghosts inconsistent and rebuilds them empty
  v_.ghost_erase(r.key(), g);
  r.list = 0;
  r.next = h.ghost_free;
  h.ghost_free = g;
  --h.n_ghost[list];
}

void PoolImpl::add_ghost(const BlockKey& key, std::uint32_t from) {
  if (!arc()) return;
  PoolHeader& h = *v_.h;
  const std::uint64_t c = v_.n();
  if (h.ghost_free == kNone) {
    const bool from_b1 =
        h.n_ghost[0] != 0 && (h.n_list[0] + std::uint64_t{h.n_ghost[0]} >= c || h.n_ghost[1] == 0);
    drop_ghost(h.ghost_tail[from_b1 ? 0 : 1]);
    step();
  }
  const std::uint32_t g = h.ghost_free;
  GhostRecord& r = v_.ghosts[g];
  h.ghost_free = r.next;
  r.key_hi = key.hi();
  r.key_lo = key.lo();
  r.list = from + 1;
  v_.gpush_front(from, g);
  step();  // listed, not in the ghost table yet
  v_.ghost_insert(key, g);
  ++h.n_ghost[from];
  step();
}

std::uint32_t PoolImpl::admit(const BlockKey& key) {
  if (!arc()) return 0;
  PoolHeader& h = *v_.h;
  const std::uint64_t c = v_.n();
  const std::uint32_t g = v_.ghost_find(key);
  if (g == kNone) {
    // Keep |T1| + |B1| <= c with the new key in T1: the oldest recency ghosts go first.
    while (h.n_list[0] + 1 + std::uint64_t{h.n_ghost[0]} > c && h.n_ghost[0] != 0) {
      drop_ghost(h.ghost_tail[0]);
      step();
    }
    return 0;
  }
  // A ghost hit: the key was evicted recently, so the list it came from was too small.
  const std::uint64_t b1 = h.n_ghost[0];
  const std::uint64_t b2 = h.n_ghost[1];
  if (v_.ghosts[g].list == 1) {
    const std::uint64_t delta = std::max<std::uint64_t>(1, b2 / b1);
    h.arc_target = std::min<std::uint64_t>(c, h.arc_target + delta);
  } else {
    const std::uint64_t delta = std::max<std::uint64_t>(1, b1 / b2);
    h.arc_target = h.arc_target > delta ? h.arc_target - delta : 0;
  }
  step();
  drop_ghost(g);
  step();
  return 1;
}

ArcState PoolImpl::arc_state() {
  lock(Op::kLookup, false);
  ArcState a;
  const PoolHeader& h = *v_.h;
  a.target = h.arc_target;
  a.t1 = h.n_list[0];
  a.t2 = h.n_list[1];
  a.ghosts_kept = h.ghosts_kept;
  a.ghosts_cleared = h.ghosts_cleared;
  try {
    for (std::uint32_t g = h.ghost_head[0], k = 0; g != kNone && k < v_.n();
         g = v_.ghosts[g].next, ++k)
      a.b1.push_back(v_.ghosts[g].key());
    for (std::uint32_t g = h.ghost_head[1], k = 0; g != kNone && k < v_.n();
         g = v_.ghosts[g].next, ++k)
      a.b2.push_back(v_.ghosts[g].key());
  } catch (...) {
    unlock();
    throw;
  }
  unlock();
  return a;
}

}  // namespace kvoffload::pool::detail
