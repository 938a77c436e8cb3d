// The node pool's index operations (node_pool.hpp; docs/DESIGN.md §6.6).
//
// Every operation validates its input before it changes anything, then changes the slot records
// in the order Note [Pool repair] (pool_repair.cpp) relies on, calling step() after each change so
// a test can kill the process there.
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/node_pool.hpp>
#include <kvoffload/region.hpp>

#include "pool/pool_impl.hpp"
#include "pool/proc_stat.hpp"

namespace kvoffload::pool {

std::string_view to_string(Op op) noexcept {
  switch (op) {
    case Op::kAttach:
      return "attach";
    case Op::kLookup:
      return "lookup";
    case Op::kPrepare:
      return "prepare_stores";
    case Op::kCommit:
      return "commit_stores";
    case Op::kAbort:
      return "abort_stores";
    case Op::kUnpin:
      return "unpin";
    case Op::kDetach:
      return "detach";
    case Op::kRepair:
      return "repair";
  }
  return "unknown";
}

namespace {

void validate_name(const char* what, const std::string& id) {
  if (id.empty() || id.size() > detail::kNameChars) {
    throw_invalid(std::string(what) + " '" + id + "' has " + std::to_string(id.size()) +
                  " characters; it must have 1 to 128");
  }
  if (id == "." || id == "..") {
    throw_invalid(std::string(what) + " '" + id + "' is not allowed ('.' and '..' are refused)");
  }
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      throw_invalid(std::string(what) + " '" + id + "' contains the character '" +
                    std::string(1, c) + "'; only letters, digits, '.', '_' and '-' are allowed");
    }
  }
}

void validate_text(const char* what, const std::string& s, std::size_t max) {
  if (s.empty() || s.size() > max || s.find('\0') != std::string::npos) {
    throw_invalid("node pool " + std::string(what) + " '" + s + "' has " +
                  std::to_string(s.size()) + " characters; it must have 1 to " +
                  std::to_string(max) + " (no NUL)");
  }
}

void validate(const PoolOptions& o) {
  validate_name("node pool name", o.name);
  validate_name("engine id", o.engine_id);
  const PoolGeometry& g = o.geometry;
  if (g.slot_bytes < 1 || g.slot_bytes > (std::uint64_t{1} << 40))
    throw_invalid("node pool slot_bytes " + std::to_string(g.slot_bytes) +
                  " is out of range; it must be 1 .. 2^40");
  if (g.slot_count < 1 || g.slot_count > (std::uint32_t{1} << 31))
    throw_invalid("node pool slot_count " + std::to_string(g.slot_count) +
                  " is out of range; it must be 1 .. 2^31");
  if (g.world_size < 1 || g.world_size > 1024)
    throw_invalid("node pool world_size " + std::to_string(g.world_size) +
                  " is out of range; it must be 1 .. 1024");
  // The chunk bytes (world_size ranges of slot_count 256-aligned slots) must fit a file.
  const std::uint64_t stride = (g.slot_bytes + 255) / 256 * 256;
  if (stride > (std::uint64_t{1} << 60) / (std::uint64_t{g.slot_count} * g.world_size))
    throw_invalid("node pool of " + std::to_string(g.slot_count) + " chunks x " +
                  std::to_string(g.world_size) + " ranks x " + std::to_string(g.slot_bytes) +
                  " slot_bytes is more than 2^60 bytes; give fewer or smaller chunks");
  validate_text("layout", g.layout, 31);
  validate_text("dtype", g.dtype, 31);
  validate_text("fingerprint", g.fingerprint, 255);
  if (o.max_tenants < 1 || o.max_tenants > 64)
    throw_invalid("node pool max_tenants " + std::to_string(o.max_tenants) +
                  " is out of range; it must be 1 .. 64 (one bit of a pin mask each)");
  if (o.cap_bytes != 0 && o.cap_fraction != 0)
    throw_invalid("node pool: cap_bytes (" + std::to_string(o.cap_bytes) + ") and cap_fraction (" +
                  std::to_string(o.cap_fraction) + ") are both set; give at most one");
  if (!(o.cap_fraction >= 0 && o.cap_fraction <= 1))
    throw_invalid("node pool cap_fraction " + std::to_string(o.cap_fraction) +
                  " is out of range; it must be in (0, 1], or 0 for no cap");
  const auto ms = o.lock_timeout.count();
  if (ms < 1 || ms > 3600000)
    throw_invalid("node pool lock_timeout " + std::to_string(ms) +
                  " ms is out of range; it must be 1 ms .. 1 h");
  if (o.policy != PolicyKind::kLru && o.policy != PolicyKind::kArc)
    throw_invalid("node pool policy " + std::to_string(static_cast<int>(o.policy)) +
                  " is unknown; it must be lru or arc");
  const auto sweep = o.sweep_interval.count();
  if (sweep < 0 || sweep > 3600000)
    throw_invalid("node pool sweep_interval " + std::to_string(sweep) +
                  " ms is out of range; it must be 0 .. 1 h");
}

constexpr auto kFree = static_cast<std::uint32_t>(SlotState::kFree);
constexpr auto kWriting = static_cast<std::uint32_t>(SlotState::kWriting);
constexpr auto kReady = static_cast<std::uint32_t>(SlotState::kReady);

}  // namespace

std::filesystem::path pool_path(const std::filesystem::path& shm_dir, const std::string& name) {
  validate_name("node pool name", name);
  return shm_dir / ("kvoffload_" + name + ".pool");
}

namespace detail {

// Holds the lock for one operation; unlocks on every path out.
class PoolImpl::Guard {
 public:
  Guard(PoolImpl& p, Op op, bool hooked = true) : p_(p) { p_.lock(op, hooked); }
  ~Guard() { p_.unlock(); }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  PoolImpl& p_;
};

PoolImpl::PoolImpl(const PoolOptions& options, PoolFile file)
    : options_(options), file_(std::move(file)) {
  v_.bind(file_.base);
  pid_ = ::getpid();
  engine_hash_ = engine_hash(options_.engine_id.c_str());
}

PoolImpl::~PoolImpl() {
  detach();
}

void PoolImpl::attach_tenant() {
  const auto self = read_proc_stat(pid_);
  if (!self) throw_system_error("read", errno, "/proc/self/stat (the tenant's start time)");
  Guard g(*this, Op::kAttach);
  if (const std::uint64_t dead = dead_tenants(); dead != 0) {
    op_ = Op::kRepair;
    step_ = 0;
    repair(dead);
    op_ = Op::kAttach;
  }
  std::uint32_t free_rec = kNone;
  for (std::uint32_t t = 0; t < v_.tenants_n(); ++t) {
    const TenantRecord& r = v_.tenants[t];
    if (r.in_use == 0) {
      if (free_rec == kNone) free_rec = t;
      continue;
    }
    if (std::strncmp(r.engine_id, options_.engine_id.c_str(), kNameChars + 1) == 0) {
      throw Error(ErrorCode::kInUse, "node pool '" + file_.path.string() + "': engine '" +
                                         options_.engine_id + "' is already a tenant (PID " +
                                         std::to_string(r.pid) +
                                         "); give each engine its own --engine-id");
    }
  }
  if (free_rec == kNone) {
    throw Error(ErrorCode::kCapacity, "node pool '" + file_.path.string() + "' has all " +
                                          std::to_string(v_.tenants_n()) +
                                          " tenant records in use by live processes; " +
                                          "engine '" + options_.engine_id +
                                          "' cannot join (create the pool with a "
                                          "larger max_tenants)");
  }
  std::uint64_t cap = 0;
  if (options_.cap_bytes != 0) cap = options_.cap_bytes / v_.h->chunk_bytes;
  if (options_.cap_fraction != 0)
    cap = static_cast<std::uint64_t>(std::floor(options_.cap_fraction * v_.n()));
  if ((options_.cap_bytes != 0 || options_.cap_fraction != 0) && cap == 0) {
    throw_invalid("node pool cap of engine '" + options_.engine_id + "' (" +
                  (options_.cap_bytes != 0
                       ? std::to_string(options_.cap_bytes) + " bytes"
                       : std::to_string(options_.cap_fraction) + " of the pool") +
                  ") is less than one chunk of " + std::to_string(v_.h->chunk_bytes) + " bytes");
  }
  TenantRecord& r = v_.tenants[free_rec];
  std::memset(static_cast<void*>(&r), 0, sizeof r);
  r.pid = pid_;
  r.start_time = self->start_time;
  r.engine_hash = engine_hash_;
  r.cap_slots = static_cast<std::uint32_t>(std::min<std::uint64_t>(cap, v_.n()));
  r.lru_head = r.lru_tail = kNone;
  options_.engine_id.copy(r.engine_id, kNameChars);  // <= 128 chars: NUL-terminated (zeroed)
  step();
  r.in_use = 1;  // last: a record is a tenant only once it is complete
  tenant_ = free_rec;
  step();
}

void PoolImpl::lookup_locked(std::span<const BlockKey> keys, bool pin, LookupOutcome& out) {
  lookup_slots_.clear();
  std::uint32_t cross = 0;
  for (const BlockKey& key : keys) {
    const std::uint32_t s = v_.find(key);
    if (s == kNone || v_.slots[s].state != kReady) break;
    if (pin && v_.pin(s, tenant_) == 0xFFFF) break;  // a 16-bit count: the prefix ends here
    lookup_slots_.push_back(s);
    if (v_.slots[s].engine_hash != engine_hash_) ++cross;
  }
  const std::uint64_t bit = std::uint64_t{1} << tenant_;
  TenantRecord& t = me();
  // From the end of the prefix to its start, so keys[0] ends most recent.
  for (std::size_t j = lookup_slots_.size(); j-- > 0;) {
    const std::uint32_t s = lookup_slots_[j];
    SlotRecord& r = v_.slots[s];
    if (pin) {
      std::uint16_t& p = v_.pin(s, tenant_);
      ++p;
      step();
      if (p == 1) {
        if (r.pin_mask == 0) {
          v_.lru_leave(s);
          ++v_.h->n_pinned;
        }
        r.pin_mask |= bit;
        ++t.pinned;
      }
      promote(s);  // parked now: ARC changes its list only
      r.stamp = ++v_.h->clock;
      ++t.pins;
      step();
    } else if (r.pin_mask == 0) {
      v_.lru_leave(s);
      promote(s);
      v_.lru_enter(s);
      step();
    } else {
      promote(s);
      r.stamp = ++v_.h->clock;
    }
  }
  t.lookup_keys += keys.size();
  t.hits += lookup_slots_.size();
  t.cross_engine_hits += cross;
  out.hits = static_cast<std::uint32_t>(lookup_slots_.size());
  out.cross_engine_hits = cross;
  out.slots = lookup_slots_;
}

void PoolImpl::protect_present(std::span<const BlockKey> keys, std::uint32_t first,
                               std::uint64_t epoch) {
  // The call's own hits (the lookup prefix of lookup_and_prepare) and every key of it that is
  // ready already are never evicted by it.
  for (std::uint32_t i = 0; i < first && i < lookup_slots_.size(); ++i)
    v_.slots[lookup_slots_[i]].protect = epoch;
  for (std::uint32_t i = first; i < keys.size(); ++i) {
    const std::uint32_t s = v_.find(keys[i]);
    if (s != kNone && v_.slots[s].state == kReady) v_.slots[s].protect = epoch;
  }
}

// Evicts ready slot s: out of the lists, free, out of the key table; its key becomes a ghost
// (ARC); then it is reused (Note [Pool repair]).
void PoolImpl::evict(std::uint32_t s) {
  PoolHeader& h = *v_.h;
  SlotRecord& r = v_.slots[s];
  const BlockKey old = r.key();
  const std::uint32_t from = r.list;
  evicted_.push_back(old);
  v_.lru_leave(s);
  step();
  r.state = kFree;
  step();
  v_.erase(old, s);
  if (r.owner != kNone) --v_.tenants[r.owner].occupancy;
  --h.n_ready;
  --h.n_list[from];
  ++me().evictions;
  step();
  add_ghost(old, from);
}

// Room for one more store: a free slot (unless at the cap) or the policy's victim; kNone when
// there is none. Everything else is pinned or being written then: a tenant that died outside the
// lock may be holding it, so once per call (swept) this checks and, after a repair, looks again.
std::uint32_t PoolImpl::find_room(bool own_only, bool& swept) {
  for (;;) {
    if (!own_only && v_.h->free_head != kNone) return v_.h->free_head;
    const std::uint32_t s = pick_victim(own_only);
    if (s != kNone || swept) return s;
    swept = true;
    const std::uint64_t dead = dead_tenants();
    if (dead == 0) return kNone;
    const Op was = op_;
    const std::uint32_t at = step_;
    op_ = Op::kRepair;
    step_ = 0;
    repair(dead);
    op_ = was;
    step_ = at;
  }
}

void PoolImpl::prepare_locked(std::span<const BlockKey> keys, std::uint32_t first,
                              StoreOutcome& out) {
  store_positions_.clear();
  store_slots_.clear();
  evicted_.clear();
  PoolHeader& h = *v_.h;
  protect_present(keys, first, ++h.epoch);
  TenantRecord& t = me();
  enum { kRoom, kNoRoom, kCap } stopped = kRoom;
  bool swept = false;
  for (std::uint32_t i = first; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    const std::uint32_t present = v_.find(key);
    if (present != kNone) {
      ++(v_.slots[present].state == kReady ? out.skipped_present : out.skipped_writing);
      continue;
    }
    if (stopped != kRoom) {
      ++(stopped == kCap ? out.skipped_cap : out.skipped_no_room);
      continue;
    }
    const bool own_only = t.cap_slots != 0 && t.occupancy >= t.cap_slots;
    const std::uint32_t s = find_room(own_only, swept);
    if (s == kNone) {
      stopped = own_only ? kCap : kNoRoom;
      ++(stopped == kCap ? out.skipped_cap : out.skipped_no_room);
      continue;
    }
    SlotRecord& r = v_.slots[s];
    if (r.state == kReady) {
      evict(s);
    } else {
      v_.remove(h.free_head, h.free_tail, s);
      --h.n_free;
      step();
    }
    const std::uint32_t list = admit(key);
    r.key_hi = key.hi();
    r.key_lo = key.lo();
    r.owner = tenant_;
    r.engine_hash = engine_hash_;
    r.pin_mask = 0;
    r.list = list;
    step();
    r.state = kWriting;
    step();
    v_.insert(key, s);
    ++t.occupancy;
    ++h.n_writing;
    ++h.n_list[list];
    ++t.stores_prepared;
    store_positions_.push_back(i);
    store_slots_.push_back(s);
    step();
  }
  out.positions = store_positions_;
  out.slots = store_slots_;
  out.evicted = evicted_;
}

LookupOutcome PoolImpl::lookup(std::span<const BlockKey> keys, bool pin) {
  Guard g(*this, Op::kLookup);
  LookupOutcome out;
  lookup_locked(keys, pin, out);
  return out;
}

StoreOutcome PoolImpl::prepare_stores(std::span<const BlockKey> keys) {
  Guard g(*this, Op::kPrepare);
  lookup_slots_.clear();
  StoreOutcome out;
  prepare_locked(keys, 0, out);
  return out;
}

NodePool::Cycle PoolImpl::lookup_and_prepare(std::span<const BlockKey> keys, bool pin) {
  Guard g(*this, Op::kLookup);
  NodePool::Cycle c;
  lookup_locked(keys, pin, c.lookup);
  op_ = Op::kPrepare;
  step_ = 0;
  prepare_locked(keys, c.lookup.hits, c.store);
  return c;
}

// Every slot in range, writing, this tenant's, and given once; kState (nothing changed) else.
void PoolImpl::check_owned_writing(std::span<const std::uint32_t> slots, const char* what) {
  scratch_.assign(slots.begin(), slots.end());
  std::sort(scratch_.begin(), scratch_.end());
  for (std::size_t i = 0; i < scratch_.size(); ++i) {
    const std::uint32_t s = scratch_[i];
    if (s >= v_.n()) {
      throw_invalid(std::string(what) + ": slot " + std::to_string(s) +
                    " is out of range (the pool has " + std::to_string(v_.n()) + ")");
    }
    if (i > 0 && scratch_[i - 1] == s)
      throw Error(ErrorCode::kState,
                  std::string(what) + ": slot " + std::to_string(s) + " is given twice");
    const SlotRecord& r = v_.slots[s];
    if (r.state != kWriting || r.owner != tenant_) {
      throw Error(ErrorCode::kState,
                  std::string(what) + ": slot " + std::to_string(s) + " is " +
                      (r.state == kWriting ? "being written by another tenant"
                       : r.state == kReady ? "ready, not being written"
                                           : "free") +
                      "; only slots this tenant's prepare_stores returned can be " + what + "ed");
    }
  }
}

void PoolImpl::commit_stores(std::span<const std::uint32_t> slots) {
  Guard g(*this, Op::kCommit);
  check_owned_writing(slots, "commit");
  TenantRecord& t = me();
  for (const std::uint32_t s : slots) {
    SlotRecord& r = v_.slots[s];
    r.stamp = ++v_.h->clock;
    step();
    r.state = kReady;
    step();
    v_.push_front(v_.h->list_head[r.list], v_.h->list_tail[r.list], s);
    v_.opush_front(t, s);
    --v_.h->n_writing;
    ++v_.h->n_ready;
    ++t.stores_committed;
    step();
  }
}

void PoolImpl::abort_stores(std::span<const std::uint32_t> slots) {
  Guard g(*this, Op::kAbort);
  check_owned_writing(slots, "abort");
  TenantRecord& t = me();
  for (const std::uint32_t s : slots) {
    SlotRecord& r = v_.slots[s];
    r.state = kFree;
    step();
    v_.erase(r.key(), s);
    v_.push_front(v_.h->free_head, v_.h->free_tail, s);
    r.owner = kNone;
    --t.occupancy;
    --v_.h->n_writing;
    --v_.h->n_list[r.list];
    ++v_.h->n_free;
    ++t.stores_aborted;
    step();
  }
}

void PoolImpl::unpin(std::span<const std::uint32_t> slots) {
  Guard g(*this, Op::kUnpin);
  scratch_.assign(slots.begin(), slots.end());
  std::sort(scratch_.begin(), scratch_.end());
  for (std::size_t i = 0; i < scratch_.size();) {
    const std::uint32_t s = scratch_[i];
    std::size_t j = i;
    while (j < scratch_.size() && scratch_[j] == s) ++j;
    if (s >= v_.n()) {
      throw_invalid("unpin: slot " + std::to_string(s) + " is out of range (the pool has " +
                    std::to_string(v_.n()) + ")");
    }
    if (v_.pin(s, tenant_) < j - i) {
      throw Error(ErrorCode::kState, "unpin: slot " + std::to_string(s) + " is given " +
                                         std::to_string(j - i) + " times but this tenant pins it " +
                                         std::to_string(v_.pin(s, tenant_)) + " times");
    }
    i = j;
  }
  const std::uint64_t bit = std::uint64_t{1} << tenant_;
  TenantRecord& t = me();
  for (const std::uint32_t s : slots) {
    SlotRecord& r = v_.slots[s];
    std::uint16_t& p = v_.pin(s, tenant_);
    --p;
    step();
    if (p == 0) {
      r.pin_mask &= ~bit;
      --t.pinned;
      if (r.pin_mask == 0) {
        v_.lru_enter(s);
        --v_.h->n_pinned;
      }
      step();
    }
  }
}

std::uint32_t PoolImpl::reclaim_dead_tenants() {
  Guard g(*this, Op::kRepair);
  const std::uint64_t dead = dead_tenants();
  if (dead != 0) repair(dead);
  return static_cast<std::uint32_t>(std::popcount(dead));
}

void PoolImpl::detach() noexcept {
  if (tenant_ != kNone) {
    try {
      Guard g(*this, Op::kDetach);
      const std::uint64_t bit = std::uint64_t{1} << tenant_;
      TenantRecord& t = me();
      for (std::uint32_t s = 0; s < v_.n(); ++s) {
        SlotRecord& r = v_.slots[s];
        if (r.state == kWriting && r.owner == tenant_) {
          r.state = kFree;
          step();
          v_.erase(r.key(), s);
          v_.push_front(v_.h->free_head, v_.h->free_tail, s);
          r.owner = kNone;
          --v_.h->n_writing;
          --v_.h->n_list[r.list];
          ++v_.h->n_free;
          step();
          continue;
        }
        if (r.state == kReady && r.owner == tenant_) {
          // Its chunks stay (complete and useful to the others), owned by nobody.
          if (r.pin_mask == 0) v_.oremove(t, s);
          r.owner = kNone;
          step();
        }
        if (v_.pin(s, tenant_) != 0) {
          v_.pin(s, tenant_) = 0;
          step();
          r.pin_mask &= ~bit;
          if (r.pin_mask == 0) {
            v_.lru_enter(s);
            --v_.h->n_pinned;
          }
          step();
        }
      }
      t.in_use = 0;
      step();
      std::memset(static_cast<void*>(&t), 0, sizeof t);
      t.lru_head = t.lru_tail = kNone;
    } catch (...) {
      // The lock was not free in time (a stopped tenant holds it): our record stays until a
      // live tenant's sweep finds this process gone.
    }
    tenant_ = kNone;
  }
  file_.close();
}

PoolStats PoolImpl::stats() {
  Guard g(*this, Op::kLookup, false);
  PoolStats s;
  const PoolHeader& h = *v_.h;
  s.slot_count = h.slot_count;
  s.free = h.n_free;
  s.writing = h.n_writing;
  s.ready = h.n_ready;
  s.pinned = h.n_pinned;
  s.repairs = h.repairs;
  s.tenants_reclaimed = h.tenants_reclaimed;
  s.policy = static_cast<PolicyKind>(h.policy);
  s.arc_target = h.arc_target;
  s.recent = h.n_list[0];
  s.frequent = h.n_list[1];
  s.ghost_recent = h.n_ghost[0];
  s.ghost_frequent = h.n_ghost[1];
  for (std::uint32_t t = 0; t < v_.tenants_n(); ++t) {
    const TenantRecord& r = v_.tenants[t];
    if (r.in_use == 0) continue;
    TenantStats ts;
    ts.index = t;
    ts.engine_id = std::string(r.engine_id, strnlen(r.engine_id, sizeof r.engine_id));
    ts.pid = r.pid;
    ts.lookup_keys = r.lookup_keys;
    ts.hits = r.hits;
    ts.cross_engine_hits = r.cross_engine_hits;
    ts.stores_prepared = r.stores_prepared;
    ts.stores_committed = r.stores_committed;
    ts.stores_aborted = r.stores_aborted;
    ts.evictions = r.evictions;
    ts.pins = r.pins;
    ts.pinned = r.pinned;
    ts.occupancy = r.occupancy;
    ts.cap_slots = r.cap_slots;
    s.tenants.push_back(std::move(ts));
  }
  return s;
}

std::vector<SlotView> PoolImpl::snapshot() {
  Guard g(*this, Op::kLookup, false);
  std::vector<SlotView> out(v_.n());
  for (std::uint32_t s = 0; s < v_.n(); ++s) {
    const SlotRecord& r = v_.slots[s];
    out[s] =
        SlotView{s, static_cast<SlotState>(r.state), r.key(), r.owner, r.pin_mask, r.stamp, r.list};
  }
  return out;
}

std::byte* PoolImpl::chunk(std::uint32_t slot, std::uint32_t rank) const {
  if (slot >= v_.n() || rank >= v_.h->world_size) {
    throw_invalid("node pool chunk(" + std::to_string(slot) + ", " + std::to_string(rank) +
                  ") is out of range: slots 0.." + std::to_string(v_.n() - 1) + ", ranks 0.." +
                  std::to_string(v_.h->world_size - 1));
  }
  // Rank-major (Note [Pool layout] in pool_layout.hpp).
  return v_.data + v_.h->rank_stride * rank + v_.h->slot_stride * slot;
}

RankRange PoolImpl::rank_range(std::uint32_t rank) const {
  if (rank >= v_.h->world_size) {
    throw_invalid("node pool rank_range(" + std::to_string(rank) + ") is out of range: ranks 0.." +
                  std::to_string(v_.h->world_size - 1));
  }
  const std::uint64_t offset = v_.h->rank_stride * rank;
  return {.data = v_.data + offset,
          .bytes = v_.h->rank_stride,
          .file_offset = v_.h->data_offset + offset,
          .slot_stride = v_.h->slot_stride};
}

}  // namespace detail

NodePool NodePool::attach(const PoolOptions& options) {
  validate(options);
  PoolOptions o = options;
  if (o.shm_dir.empty()) o.shm_dir = default_shm_dir();
  const std::filesystem::path path = pool_path(o.shm_dir, o.name);
  auto impl = std::make_unique<detail::PoolImpl>(o, detail::PoolFile::open(o, path));
  impl->attach_tenant();
  return NodePool(std::move(impl));
}

NodePool::NodePool(std::unique_ptr<detail::PoolImpl> impl) : impl_(std::move(impl)) {}
NodePool::~NodePool() = default;
NodePool::NodePool(NodePool&&) noexcept = default;
NodePool& NodePool::operator=(NodePool&&) noexcept = default;

LookupOutcome NodePool::lookup(std::span<const BlockKey> keys, bool pin) {
  return impl_->lookup(keys, pin);
}
StoreOutcome NodePool::prepare_stores(std::span<const BlockKey> keys) {
  return impl_->prepare_stores(keys);
}
NodePool::Cycle NodePool::lookup_and_prepare(std::span<const BlockKey> keys, bool pin) {
  return impl_->lookup_and_prepare(keys, pin);
}
void NodePool::commit_stores(std::span<const std::uint32_t> slots) {
  impl_->commit_stores(slots);
}
void NodePool::abort_stores(std::span<const std::uint32_t> slots) {
  impl_->abort_stores(slots);
}
void NodePool::unpin(std::span<const std::uint32_t> slots) {
  impl_->unpin(slots);
}
std::uint32_t NodePool::reclaim_dead_tenants() {
  return impl_->reclaim_dead_tenants();
}
void NodePool::detach() noexcept {
  if (impl_) impl_->detach();
}
std::byte* NodePool::chunk(std::uint32_t slot, std::uint32_t rank) const {
  return impl_->chunk(slot, rank);
}
std::uint64_t NodePool::slot_stride() const noexcept {
  return impl_->slot_stride();
}
RankRange NodePool::rank_range(std::uint32_t rank) const {
  return impl_->rank_range(rank);
}
const PoolGeometry& NodePool::geometry() const noexcept {
  return impl_->geometry();
}
const std::filesystem::path& NodePool::path() const noexcept {
  return impl_->path();
}
std::uint32_t NodePool::tenant_index() const noexcept {
  return impl_->tenant();
}
bool NodePool::attached() const noexcept {
  return impl_ && impl_->attached();
}
PoolStats NodePool::stats() {
  return impl_->stats();
}
std::vector<SlotView> NodePool::snapshot() {
  return impl_->snapshot();
}
ArcState NodePool::arc_state() {
  return impl_->arc_state();
}
std::vector<std::string> NodePool::check_invariants() {
  return impl_->check_invariants();
}

}  // namespace kvoffload::pool
