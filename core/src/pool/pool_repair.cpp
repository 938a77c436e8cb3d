// Repair of the node pool's index after a dead tenant, and the checker of its invariants.
//
// Note [Pool repair]: the slot records are the source of truth; everything else is derived.
// Each operation changes a slot record in an order that leaves a valid record at every
// instruction: an evicted slot becomes free before it gets a new key, owner and engine; it
// becomes writing only once those are written; a commit writes the stamp before the state. A
// record's only fields that matter are its state, key, owner, engine, stamp, list (ARC's T1 / T2)
// and the pin counts;
// the key table, the lists, the pin masks and every counter are rebuilt from them:
//  1. Tenants whose PID is gone or has another start time are dead (a zombie is dead).
//  2. Each slot: an unknown state becomes free; pins of dead or unused tenants are dropped, the
//     pin mask recomputed; a writing slot of a dead or unused owner, or a free one, is freed
//     (a half-written chunk is never served); a ready chunk of a dead owner stays, owned by
//     nobody (its bytes are complete: commit runs after the copy).
//  3. Dead tenants' records are cleared.
//  4. The key table is rebuilt from the non-free slots (a key found twice keeps the ready
//     copy), the evictable lists (the LRU, or ARC's T1 and T2 by each record's list) and the
//     owners' LRUs from the ready unpinned slots by stamp, the free list in ascending slot order,
//     the counters (|T1| and |T2| too) by counting.
//  5. ARC's ghosts are kept when check_ghosts finds them consistent with the rebuilt index,
//     else rebuilt empty (Note [Pool ARC]); the target p is clamped to [0, slot_count].
// Every step is idempotent, so a repair killed half-way is simply repaired again by the next
// locker (it gets EOWNERDEAD: pool_lock.cpp). Cost: O(slots log slots), only after a death.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "pool/pool_impl.hpp"
#include "pool/proc_stat.hpp"

namespace kvoffload::pool::detail {

std::uint64_t PoolImpl::dead_tenants() const {
  std::uint64_t dead = 0;
  for (std::uint32_t t = 0; t < v_.tenants_n(); ++t) {
    const TenantRecord& r = v_.tenants[t];
    if (r.in_use == 0 || t == tenant_) continue;
    if (!process_alive(r.pid, r.start_time)) dead |= std::uint64_t{1} << t;
  }
  return dead;
}

void PoolImpl::repair(std::uint64_t dead) noexcept {
  step();
  repair_slots(dead);
  step();
  rebuild_table();
  step();
  rebuild_lists();
  // 5. The ghosts and ARC's target (Note [Pool ARC]): kept when consistent with the rebuilt
  //    index, else rebuilt empty.
  PoolHeader& h = *v_.h;
  if (h.arc_target > v_.n()) h.arc_target = v_.n();
  bool consistent = true;
  try {
    check_ghosts([&](const std::string&) { consistent = false; });
  } catch (...) {
    consistent = false;
  }
  if (consistent) {
    ++h.ghosts_kept;
  } else {
    v_.reset_ghosts();
    ++h.ghosts_cleared;
  }
  ++h.repairs;
  step();
}

// Steps 2 and 3: the slot records and the dead tenants' records.
void PoolImpl::repair_slots(std::uint64_t dead) noexcept {
  PoolHeader& h = *v_.h;
  const std::uint32_t tn = v_.tenants_n();
  auto gone = [&](std::uint32_t t) {
    return t >= tn || v_.tenants[t].in_use == 0 || ((dead >> t) & 1U) != 0;
  };
  for (std::uint32_t s = 0; s < v_.n(); ++s) {
    SlotRecord& r = v_.slots[s];
    if (r.state > static_cast<std::uint32_t>(SlotState::kReady)) r.state = 0;
    if (r.state == static_cast<std::uint32_t>(SlotState::kWriting) && gone(r.owner)) {
      r.state = static_cast<std::uint32_t>(SlotState::kFree);
      step();
    }
    const bool ready = r.state == static_cast<std::uint32_t>(SlotState::kReady);
    std::uint64_t mask = 0;
    for (std::uint32_t t = 0; t < tn; ++t) {
      std::uint16_t& p = v_.pin(s, t);
      if (p != 0 && (!ready || gone(t))) p = 0;
      if (p != 0) mask |= std::uint64_t{1} << t;
    }
    r.pin_mask = mask;
    // A free slot has no owner; a ready chunk of a dead owner belongs to nobody now.
    const bool is_free = r.state == static_cast<std::uint32_t>(SlotState::kFree);
    if (is_free || (ready && r.owner != kNone && gone(r.owner))) r.owner = kNone;
    // A list other than T1 / T2 (or T2 under LRU) becomes T1 (the LRU).
    if (r.list > 1 || !arc()) r.list = 0;
  }
  step();
  for (std::uint32_t t = 0; t < tn; ++t) {
    if (((dead >> t) & 1U) == 0 || v_.tenants[t].in_use == 0) continue;
    TenantRecord& rec = v_.tenants[t];
    rec.in_use = 0;
    step();
    std::memset(static_cast<void*>(&rec), 0, sizeof rec);
    rec.lru_head = rec.lru_tail = kNone;
    ++h.tenants_reclaimed;
  }
}

// Step 4a: the key table from the non-free slots.
void PoolImpl::rebuild_table() noexcept {
  const std::uint32_t tn = v_.tenants_n();
  v_.clear_table();
  for (std::uint32_t s = 0; s < v_.n(); ++s) {
    SlotRecord& r = v_.slots[s];
    if (r.state == static_cast<std::uint32_t>(SlotState::kFree)) continue;
    const std::uint32_t other = v_.find(r.key());
    if (other != kNone) {
      // The same key twice (no operation makes this; defensive): keep the ready one.
      SlotRecord& o = v_.slots[other];
      const bool keep_other =
          o.state == static_cast<std::uint32_t>(SlotState::kReady) && o.pin_mask != 0;
      const std::uint32_t drop =
          (keep_other || r.state != static_cast<std::uint32_t>(SlotState::kReady)) ? s : other;
      SlotRecord& d = v_.slots[drop];
      d.state = static_cast<std::uint32_t>(SlotState::kFree);
      d.owner = kNone;
      d.pin_mask = 0;
      for (std::uint32_t t = 0; t < tn; ++t) v_.pin(drop, t) = 0;
      if (drop == other) {
        v_.erase(r.key(), other);
        v_.insert(r.key(), s);
      }
      continue;
    }
    v_.insert(r.key(), s);
  }
}

// Step 4b: the lists (evictable by stamp, the owners' too; free in slot order) and the counters.
void PoolImpl::rebuild_lists() noexcept {
  PoolHeader& h = *v_.h;
  const std::uint32_t tn = v_.tenants_n();
  std::vector<std::uint32_t> evictable;
  h.list_head[0] = h.list_tail[0] = h.list_head[1] = h.list_tail[1] = kNone;
  h.free_head = h.free_tail = kNone;
  h.n_free = h.n_writing = h.n_ready = h.n_pinned = 0;
  h.n_list[0] = h.n_list[1] = 0;
  for (std::uint32_t t = 0; t < tn; ++t) {
    TenantRecord& rec = v_.tenants[t];
    rec.lru_head = rec.lru_tail = kNone;
    rec.occupancy = 0;
    rec.pinned = 0;
  }
  std::uint64_t max_stamp = h.clock;
  for (std::uint32_t s = 0; s < v_.n(); ++s) {
    SlotRecord& r = v_.slots[s];
    r.prev = r.next = r.oprev = r.onext = kNone;
    max_stamp = std::max(max_stamp, r.stamp);
    switch (static_cast<SlotState>(r.state)) {
      case SlotState::kFree:
        v_.push_back(h.free_head, h.free_tail, s);
        ++h.n_free;
        break;
      case SlotState::kWriting:
        ++h.n_writing;
        break;
      case SlotState::kReady:
        ++h.n_ready;
        if (r.pin_mask != 0) {
          ++h.n_pinned;
        } else {
          evictable.push_back(s);
        }
        break;
    }
    if (r.state != static_cast<std::uint32_t>(SlotState::kFree)) {
      ++h.n_list[r.list];
      if (r.owner != kNone) ++v_.tenants[r.owner].occupancy;
    }
    for (std::uint32_t t = 0; t < tn; ++t)
      if (((r.pin_mask >> t) & 1U) != 0) ++v_.tenants[t].pinned;
  }
  h.clock = max_stamp;
  std::sort(evictable.begin(), evictable.end(), [&](std::uint32_t a, std::uint32_t b) {
    return v_.slots[a].stamp < v_.slots[b].stamp;
  });
  // Oldest first, each pushed at the most recent end: the order of the stamps, which stay.
  for (const std::uint32_t s : evictable) {
    const SlotRecord& r = v_.slots[s];
    v_.push_front(h.list_head[r.list], h.list_tail[r.list], s);
    if (r.owner != kNone) v_.opush_front(v_.tenants[r.owner], s);
  }
}

// Note [Pool invariants]: what check_invariants verifies, every one of which repair restores.
//  - every slot state is free, writing or ready; a writing slot has a live owner; a free one
//    none; pins only on ready slots and only by in-use tenants; pin masks match the counts;
//  - the key table holds exactly the non-free slots, each findable by its key, no key twice;
//  - each evictable list (the LRU; ARC's T1, T2) holds exactly the ready unpinned slots of its
//    list, doubly linked, stamps strictly decreasing from head to tail; under LRU every slot is
//    in list 0; each in-use tenant's LRU holds exactly its own evictable slots, by stamp;
//  - the free list holds exactly the free slots;
//  - the counters (free, writing, ready, pinned, |T1|, |T2|, occupancy, pinned per tenant)
//    match a count;
//  - the ghosts (check_ghosts): every ghost record is in exactly one of B1, B2 and the free
//    stack, the lists doubly linked, |B1| and |B2| counted right, the ghost table holds exactly
//    the ghosts, each findable by its key, no ghost key resident; |T1| + |B1| <= c and
//    |B1| + |B2| <= c; the target p <= c; no ghosts under LRU.
std::vector<std::string> PoolImpl::check_invariants() {
  lock(Op::kLookup, false);
  std::vector<std::string> bad;
  try {
    const Fail fail = [&](const std::string& what) {
      if (bad.size() < 20) bad.push_back(what);
    };
    check_slots(fail);
    check_lists(fail);
    check_tenant_lists(fail);
    check_ghosts(fail);
  } catch (...) {
    unlock();
    throw;
  }
  unlock();
  return bad;
}

// The slot records, the pin counts, the key table and the counters against a count.
void PoolImpl::check_slots(const Fail& fail) const {
  const PoolHeader& h = *v_.h;
  const std::uint32_t n = v_.n();
  const std::uint32_t tn = v_.tenants_n();
  std::uint32_t n_free = 0, n_writing = 0, n_ready = 0, n_pinned = 0, table_entries = 0;
  std::uint32_t n_list[2] = {0, 0};
  std::vector<std::uint32_t> occupancy(tn, 0), pinned(tn, 0);
  for (std::uint32_t s = 0; s < n; ++s) {
    const SlotRecord& r = v_.slots[s];
    const std::string at = "slot " + std::to_string(s) + ": ";
    std::uint64_t mask = 0;
    for (std::uint32_t t = 0; t < tn; ++t) {
      if (v_.pin(s, t) == 0) continue;
      mask |= std::uint64_t{1} << t;
      ++pinned[t];
      if (v_.tenants[t].in_use == 0) fail(at + "pinned by unused tenant " + std::to_string(t));
    }
    if (mask != r.pin_mask) fail(at + "pin mask disagrees with the pin counts");
    switch (r.state) {
      case static_cast<std::uint32_t>(SlotState::kFree):
        ++n_free;
        if (r.owner != kNone) fail(at + "free with an owner");
        if (mask != 0) fail(at + "free and pinned");
        break;
      case static_cast<std::uint32_t>(SlotState::kWriting):
        ++n_writing;
        if (r.owner >= tn || v_.tenants[r.owner].in_use == 0)
          fail(at + "writing without a live owner");
        if (mask != 0) fail(at + "writing and pinned");
        break;
      case static_cast<std::uint32_t>(SlotState::kReady):
        ++n_ready;
        if (mask != 0) ++n_pinned;
        if (r.owner != kNone && (r.owner >= tn || v_.tenants[r.owner].in_use == 0))
          fail(at + "ready, owned by an unused tenant");
        break;
      default:
        fail(at + "unknown state " + std::to_string(r.state));
    }
    if (r.state != 0) {
      ++table_entries;
      if (v_.find(r.key()) != s) fail(at + "its key does not find it in the key table");
      if (r.owner < tn) ++occupancy[r.owner];
      if (r.list > (arc() ? 1U : 0U)) {
        fail(at + "in list " + std::to_string(r.list) +
             (arc() ? " (ARC has 0: T1, 1: T2)" : " under LRU"));
      } else {
        ++n_list[r.list];
      }
    }
  }
  std::uint64_t entries = 0;
  for (std::uint64_t b = 0; b < h.table_buckets; ++b) {
    if (v_.table[b] == ~std::uint64_t{0}) continue;
    ++entries;
    const auto s = static_cast<std::uint32_t>(v_.table[b]);
    if (s >= n || v_.slots[s].state == 0)
      fail("key table entry " + std::to_string(b) + " names a free or unknown slot");
  }
  if (entries != table_entries)
    fail("key table has " + std::to_string(entries) + " entries for " +
         std::to_string(table_entries) + " used slots");
  if (h.n_free != n_free || h.n_writing != n_writing || h.n_ready != n_ready ||
      h.n_pinned != n_pinned || h.n_list[0] != n_list[0] || h.n_list[1] != n_list[1])
    fail("header counters (free/writing/ready/pinned/T1/T2 " + std::to_string(h.n_free) + "/" +
         std::to_string(h.n_writing) + "/" + std::to_string(h.n_ready) + "/" +
         std::to_string(h.n_pinned) + "/" + std::to_string(h.n_list[0]) + "/" +
         std::to_string(h.n_list[1]) + ") disagree with a count (" + std::to_string(n_free) + "/" +
         std::to_string(n_writing) + "/" + std::to_string(n_ready) + "/" +
         std::to_string(n_pinned) + "/" + std::to_string(n_list[0]) + "/" +
         std::to_string(n_list[1]) + ")");
  for (std::uint32_t t = 0; t < tn; ++t) {
    const TenantRecord& rec = v_.tenants[t];
    const std::string who = "tenant " + std::to_string(t) + ": ";
    if (rec.in_use == 0) {
      if (occupancy[t] != 0) fail(who + "unused but owns slots");
      continue;
    }
    if (rec.occupancy != occupancy[t])
      fail(who + "occupancy " + std::to_string(rec.occupancy) + ", owns " +
           std::to_string(occupancy[t]));
    if (rec.pinned != pinned[t])
      fail(who + "pinned " + std::to_string(rec.pinned) + ", pins " + std::to_string(pinned[t]));
  }
}

// The global lists: each evictable list and the free list.
void PoolImpl::check_lists(const Fail& fail) const {
  const PoolHeader& h = *v_.h;
  const std::uint32_t n = v_.n();
  // Walks a list; returns its length (n + 1 when it is no list).
  auto walk = [&](const std::string& name, std::uint32_t head, std::uint32_t tail, auto member,
                  bool by_stamp) -> std::uint32_t {
    std::uint32_t count = 0;
    std::uint32_t prev = kNone;
    for (std::uint32_t s = head; s != kNone; s = v_.slots[s].next) {
      if (s >= n || ++count > n) {
        fail(name + " is not a list (a cycle or a slot out of range)");
        return n + 1;
      }
      if (v_.slots[s].prev != prev)
        fail(name + ": slot " + std::to_string(s) + " has a wrong prev link");
      if (!member(s))
        fail(name + " holds slot " + std::to_string(s) + ", which does not belong there");
      if (by_stamp && prev != kNone && v_.slots[prev].stamp <= v_.slots[s].stamp)
        fail(name + ": stamps not decreasing at slot " + std::to_string(s));
      prev = s;
    }
    if (prev != tail) fail(name + ": tail does not end the list");
    return count;
  };
  for (std::uint32_t list = 0; list < 2; ++list) {
    auto evictable = [&](std::uint32_t s) {
      const SlotRecord& r = v_.slots[s];
      return r.state == static_cast<std::uint32_t>(SlotState::kReady) && r.pin_mask == 0 &&
             r.list == list;
    };
    std::uint32_t want = 0;
    for (std::uint32_t s = 0; s < n; ++s) want += evictable(s) ? 1 : 0;
    const std::string name = arc() ? (list == 0 ? "T1" : "T2") : (list == 0 ? "the LRU" : "list 1");
    const std::uint32_t got = walk(name, h.list_head[list], h.list_tail[list], evictable, true);
    if (got <= n && got != want)
      fail(name + " has " + std::to_string(got) + " slots, " + std::to_string(want) +
           " are evictable there");
  }
  auto is_free = [&](std::uint32_t s) { return v_.slots[s].state == 0; };
  const std::uint32_t free_len = walk("the free list", h.free_head, h.free_tail, is_free, false);
  if (free_len <= n && free_len != h.n_free)
    fail("the free list has " + std::to_string(free_len) + " slots, " + std::to_string(h.n_free) +
         " are free");
}

// Each in-use tenant's LRU: exactly its evictable slots, by stamp.
void PoolImpl::check_tenant_lists(const Fail& fail) const {
  const std::uint32_t n = v_.n();
  auto evictable = [&](std::uint32_t s) {
    return v_.slots[s].state == static_cast<std::uint32_t>(SlotState::kReady) &&
           v_.slots[s].pin_mask == 0;
  };
  for (std::uint32_t t = 0; t < v_.tenants_n(); ++t) {
    const TenantRecord& rec = v_.tenants[t];
    if (rec.in_use == 0) continue;
    const std::string who = "tenant " + std::to_string(t) + ": ";
    std::uint32_t count = 0, want = 0, prev = kNone;
    for (std::uint32_t s = 0; s < n; ++s)
      if (evictable(s) && v_.slots[s].owner == t) ++want;
    for (std::uint32_t s = rec.lru_head; s != kNone; s = v_.slots[s].onext) {
      if (s >= n || ++count > n) {
        fail(who + "its LRU is not a list");
        break;
      }
      if (v_.slots[s].oprev != prev)
        fail(who + "its LRU has a wrong prev link at slot " + std::to_string(s));
      if (!evictable(s) || v_.slots[s].owner != t)
        fail(who + "its LRU holds slot " + std::to_string(s) + ", not its evictable chunk");
      if (prev != kNone && v_.slots[prev].stamp <= v_.slots[s].stamp)
        fail(who + "its LRU is out of stamp order");
      prev = s;
    }
    if (prev != rec.lru_tail) fail(who + "its LRU tail does not end the list");
    if (count != want)
      fail(who + "its LRU has " + std::to_string(count) + " slots, it owns " +
           std::to_string(want) + " evictable ones");
  }
}

// The ghosts and ARC's target (Note [Pool ARC]); repair uses it to keep or rebuild them.
void PoolImpl::check_ghosts(const Fail& fail) const {
  const PoolHeader& h = *v_.h;
  const std::uint32_t n = v_.n();
  if (h.arc_target > n)
    fail("ARC target " + std::to_string(h.arc_target) + " exceeds " + std::to_string(n));
  std::vector<std::uint8_t> seen(n, 0);  // 1 B1, 2 B2, 3 free
  std::uint32_t len[2] = {0, 0};
  for (std::uint32_t list = 0; list < 2; ++list) {
    const std::string name = list == 0 ? "B1" : "B2";
    std::uint32_t prev = kNone;
    for (std::uint32_t g = h.ghost_head[list]; g != kNone; g = v_.ghosts[g].next) {
      if (g >= n || seen[g] != 0) {
        fail(name + " is not a list (a cycle, a shared or an out-of-range ghost)");
        return;
      }
      seen[g] = static_cast<std::uint8_t>(list + 1);
      ++len[list];
      const GhostRecord& r = v_.ghosts[g];
      if (r.prev != prev) fail(name + ": ghost " + std::to_string(g) + " has a wrong prev link");
      if (r.list != list + 1) fail(name + " holds ghost " + std::to_string(g) + " of another list");
      if (v_.ghost_find(r.key()) != g)
        fail(name + ": ghost " + std::to_string(g) + " is not found by its key (or twice)");
      if (v_.find(r.key()) != kNone)
        fail(name + ": ghost " + std::to_string(g) + "'s key is resident");
      prev = g;
    }
    if (prev != h.ghost_tail[list]) fail(name + ": tail does not end the list");
    if (len[list] != h.n_ghost[list])
      fail(name + " has " + std::to_string(len[list]) + " ghosts, its count says " +
           std::to_string(h.n_ghost[list]));
  }
  for (std::uint32_t g = h.ghost_free; g != kNone; g = v_.ghosts[g].next) {
    if (g >= n || seen[g] != 0) {
      fail("the free ghosts are not a stack (a cycle, a listed or an out-of-range record)");
      return;
    }
    seen[g] = 3;
    if (v_.ghosts[g].list != 0) fail("free ghost " + std::to_string(g) + " is in a list");
  }
  for (std::uint32_t g = 0; g < n; ++g)
    if (seen[g] == 0) fail("ghost " + std::to_string(g) + " is in no list and not free");
  std::uint64_t entries = 0;
  for (std::uint64_t b = 0; b < h.table_buckets; ++b) {
    if (v_.ghost_table[b] == ~std::uint64_t{0}) continue;
    ++entries;
    const auto g = static_cast<std::uint32_t>(v_.ghost_table[b]);
    if (g >= n || v_.ghosts[g].list == 0)
      fail("ghost table entry " + std::to_string(b) + " names a free or unknown ghost");
  }
  if (entries != std::uint64_t{len[0]} + len[1])
    fail("ghost table has " + std::to_string(entries) + " entries for " +
         std::to_string(len[0] + len[1]) + " ghosts");
  if (!arc() && len[0] + len[1] != 0) fail("ghosts under LRU");
  if (std::uint64_t{h.n_list[0]} + len[0] > n)
    fail("|T1| + |B1| = " + std::to_string(h.n_list[0] + len[0]) + " exceeds " + std::to_string(n));
  if (std::uint64_t{len[0]} + len[1] > n) fail("|B1| + |B2| exceeds " + std::to_string(n));
}

}  // namespace kvoffload::pool::detail
