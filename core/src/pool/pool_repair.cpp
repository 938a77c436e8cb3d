// Repair of the node pool's index after a dead tenant, and the checker of its invariants.
//
// Note [Pool repair]: the slot records are the source of truth; everything else is derived.
// Each operation changes a slot record in an order that leaves a valid record at every
// instruction: an evicted slot becomes free before it gets a new key, owner and engine; it
// becomes writing only once those are written; a commit writes the stamp before the state. A
// record's only fields that matter are its state, key, owner, engine, stamp and the pin counts;
// the key table, the lists, the pin masks and every counter are rebuilt from them:
//  1. Tenants whose PID is gone or has another start time are dead (a zombie is dead).
//  2. Each slot: an unknown state becomes free; pins of dead or unused tenants are dropped, the
//     pin mask recomputed; a writing slot of a dead or unused owner, or a free one, is freed
//     (a half-written chunk is never served); a ready chunk of a dead owner stays, owned by
//     nobody (its bytes are complete: commit runs after the copy).
//  3. Dead tenants' records are cleared.
//  4. The key table is rebuilt from the non-free slots (a key found twice keeps the ready
//     copy), the LRU and the owners' LRUs from the ready unpinned slots by stamp, the free list
//     in ascending slot order, the counters by counting.
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
  PoolHeader& h = *v_.h;
  const std::uint32_t tn = v_.tenants_n();
  auto gone = [&](std::uint32_t t) {
    return t >= tn || v_.tenants[t].in_use == 0 || ((dead >> t) & 1U) != 0;
  };
  step();
  // 2. Slot records.
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
  }
  step();
  // 3. Dead tenants' records.
  for (std::uint32_t t = 0; t < tn; ++t) {
    if (((dead >> t) & 1U) == 0 || v_.tenants[t].in_use == 0) continue;
    TenantRecord& rec = v_.tenants[t];
    rec.in_use = 0;
    step();
    std::memset(static_cast<void*>(&rec), 0, sizeof rec);
    rec.lru_head = rec.lru_tail = kNone;
    ++h.tenants_reclaimed;
  }
  step();
  // 4. Derived structures.
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
  step();
  std::vector<std::uint32_t> evictable;
  h.lru_head = h.lru_tail = h.free_head = h.free_tail = kNone;
  h.n_free = h.n_writing = h.n_ready = h.n_pinned = 0;
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
    if (r.state != static_cast<std::uint32_t>(SlotState::kFree) && r.owner != kNone)
      ++v_.tenants[r.owner].occupancy;
    for (std::uint32_t t = 0; t < tn; ++t)
      if (((r.pin_mask >> t) & 1U) != 0) ++v_.tenants[t].pinned;
  }
  h.clock = max_stamp;
  std::sort(evictable.begin(), evictable.end(), [&](std::uint32_t a, std::uint32_t b) {
    return v_.slots[a].stamp < v_.slots[b].stamp;
  });
  // Oldest first, each pushed at the most recent end: the order of the stamps, which stay.
  for (const std::uint32_t s : evictable) {
    v_.push_front(h.lru_head, h.lru_tail, s);
    if (v_.slots[s].owner != kNone) v_.opush_front(v_.tenants[v_.slots[s].owner], s);
  }
  ++h.repairs;
  step();
}

// Note [Pool invariants]: what check_invariants verifies, every one of which repair restores.
//  - every slot state is free, writing or ready; a writing slot has a live owner; a free one
//    none; pins only on ready slots and only by in-use tenants; pin masks match the counts;
//  - the key table holds exactly the non-free slots, each findable by its key, no key twice;
//  - the LRU holds exactly the ready unpinned slots, doubly linked, stamps strictly decreasing
//    from head to tail; each in-use tenant's LRU holds exactly its own of them, in the same order;
//  - the free list holds exactly the free slots;
//  - the counters (free, writing, ready, pinned, occupancy, pinned per tenant) match a count.
std::vector<std::string> PoolImpl::check_invariants() {
  lock(Op::kLookup, false);
  std::vector<std::string> bad;
  try {
    const PoolHeader& h = *v_.h;
    const std::uint32_t n = v_.n();
    const std::uint32_t tn = v_.tenants_n();
    auto fail = [&](const std::string& what) {
      if (bad.size() < 20) bad.push_back(what);
    };
    std::uint32_t n_free = 0, n_writing = 0, n_ready = 0, n_pinned = 0, table_entries = 0;
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
    // The global lists.
    auto walk = [&](const std::string& name, std::uint32_t head, std::uint32_t tail, auto member,
                    bool lru) {
      std::uint32_t count = 0;
      std::uint32_t prev = kNone;
      for (std::uint32_t s = head; s != kNone; s = v_.slots[s].next) {
        if (s >= n || ++count > n) {
          fail(name + " is not a list (a cycle or a slot out of range)");
          return;
        }
        if (v_.slots[s].prev != prev)
          fail(name + ": slot " + std::to_string(s) + " has a wrong prev link");
        if (!member(s))
          fail(name + " holds slot " + std::to_string(s) + ", which does not belong there");
        if (lru && prev != kNone && v_.slots[prev].stamp <= v_.slots[s].stamp)
          fail(name + ": stamps not decreasing at slot " + std::to_string(s));
        prev = s;
      }
      if (prev != tail) fail(name + ": tail does not end the list");
      return;
    };
    auto evictable = [&](std::uint32_t s) {
      return v_.slots[s].state == static_cast<std::uint32_t>(SlotState::kReady) &&
             v_.slots[s].pin_mask == 0;
    };
    auto is_free = [&](std::uint32_t s) { return v_.slots[s].state == 0; };
    walk(std::string("the LRU"), h.lru_head, h.lru_tail, evictable, true);
    walk(std::string("the free list"), h.free_head, h.free_tail, is_free, false);
    std::uint32_t lru_len = 0, free_len = 0;
    for (std::uint32_t s = h.lru_head; s != kNone && lru_len <= n; s = v_.slots[s].next) ++lru_len;
    for (std::uint32_t s = h.free_head; s != kNone && free_len <= n; s = v_.slots[s].next)
      ++free_len;
    if (lru_len != n_ready - n_pinned)
      fail("the LRU has " + std::to_string(lru_len) + " slots, " +
           std::to_string(n_ready - n_pinned) + " are evictable");
    if (free_len != n_free)
      fail("the free list has " + std::to_string(free_len) + " slots, " + std::to_string(n_free) +
           " are free");
    // The owners' lists.
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
    if (h.n_free != n_free || h.n_writing != n_writing || h.n_ready != n_ready ||
        h.n_pinned != n_pinned)
      fail("header counters (free/writing/ready/pinned " + std::to_string(h.n_free) + "/" +
           std::to_string(h.n_writing) + "/" + std::to_string(h.n_ready) + "/" +
           std::to_string(h.n_pinned) + ") disagree with a count (" + std::to_string(n_free) + "/" +
           std::to_string(n_writing) + "/" + std::to_string(n_ready) + "/" +
           std::to_string(n_pinned) + ")");
  } catch (...) {
    unlock();
    throw;
  }
  unlock();
  return bad;
}

}  // namespace kvoffload::pool::detail
