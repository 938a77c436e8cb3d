// The pool file's layout, its key table and its intrusive lists (pool_layout.hpp).
#include "pool/pool_layout.hpp"

#include <bit>

namespace kvoffload::pool::detail {

namespace {

constexpr std::uint64_t round_up(std::uint64_t x, std::uint64_t to) noexcept {
  return (x + to - 1) / to * to;
}

constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

std::uint32_t tag_of(const BlockKey& key) noexcept {
  return static_cast<std::uint32_t>(key.hash() >> 32);
}

}  // namespace

Layout compute_layout(std::uint64_t slot_bytes, std::uint32_t slot_count, std::uint32_t world_size,
                      std::uint32_t max_tenants, std::uint64_t page) {
  Layout l{};
  // Rank-major (Note [Pool layout]): each rank's range holds its slot of every chunk, slots
  // 256-aligned, the range a page multiple so the next rank's starts on a page.
  l.slot_stride = round_up(slot_bytes, 256);
  l.rank_stride = round_up(l.slot_stride * slot_count, page);
  l.chunk_bytes = l.slot_stride * world_size;
  l.tenants_offset = round_up(sizeof(PoolHeader), 64);
  l.slots_offset = round_up(l.tenants_offset + sizeof(TenantRecord) * max_tenants, 64);
  l.pins_offset = round_up(l.slots_offset + sizeof(SlotRecord) * std::uint64_t{slot_count}, 64);
  l.table_offset =
      round_up(l.pins_offset + sizeof(std::uint16_t) * std::uint64_t{slot_count} * max_tenants, 64);
  l.table_buckets = std::bit_ceil(std::uint64_t{2} * slot_count);
  if (l.table_buckets < 16) l.table_buckets = 16;
  l.ghosts_offset = round_up(l.table_offset + sizeof(std::uint64_t) * l.table_buckets, 64);
  l.ghost_table_offset =
      round_up(l.ghosts_offset + sizeof(GhostRecord) * std::uint64_t{slot_count}, 64);
  l.data_offset = round_up(l.ghost_table_offset + sizeof(std::uint64_t) * l.table_buckets, page);
  l.file_bytes = l.data_offset + l.rank_stride * world_size;
  return l;
}

void View::bind(void* base) noexcept {
  auto* b = static_cast<std::byte*>(base);
  h = reinterpret_cast<PoolHeader*>(b);
  tenants = reinterpret_cast<TenantRecord*>(b + h->tenants_offset);
  slots = reinterpret_cast<SlotRecord*>(b + h->slots_offset);
  pins = reinterpret_cast<std::uint16_t*>(b + h->pins_offset);
  table = reinterpret_cast<std::uint64_t*>(b + h->table_offset);
  ghosts = reinterpret_cast<GhostRecord*>(b + h->ghosts_offset);
  ghost_table = reinterpret_cast<std::uint64_t*>(b + h->ghost_table_offset);
  data = b + h->data_offset;
}

namespace {

// Open addressing over `buckets` 8-byte entries (32 hash bits, the record index), used by the key
// table (slots) and the ghost table (ghost records); `matches(i)` says whether record i holds key.
template <class Matches>
std::uint32_t table_find(const std::uint64_t* table, std::uint64_t buckets, const BlockKey& key,
                         Matches matches) noexcept {
  const std::uint64_t mask = buckets - 1;
  const std::uint32_t tag = tag_of(key);
  for (std::uint64_t pos = tag & mask;; pos = (pos + 1) & mask) {
    const std::uint64_t e = table[pos];
    if (e == kEmpty) return kNone;
    if (static_cast<std::uint32_t>(e >> 32) == tag) {
      const auto i = static_cast<std::uint32_t>(e);
      if (matches(i)) return i;
    }
  }
}

void table_insert(std::uint64_t* table, std::uint64_t buckets, const BlockKey& key,
                  std::uint32_t i) noexcept {
  const std::uint64_t mask = buckets - 1;
  const std::uint32_t tag = tag_of(key);
  std::uint64_t pos = tag & mask;
  while (table[pos] != kEmpty) pos = (pos + 1) & mask;
  table[pos] = (static_cast<std::uint64_t>(tag) << 32) | i;
}

void table_erase(std::uint64_t* table, std::uint64_t buckets, const BlockKey& key,
                 std::uint32_t i) noexcept {
  const std::uint64_t mask = buckets - 1;
  const std::uint32_t tag = tag_of(key);
  const std::uint64_t want = (static_cast<std::uint64_t>(tag) << 32) | i;
  std::uint64_t pos = tag & mask;
  for (;; pos = (pos + 1) & mask) {
    if (table[pos] == kEmpty) return;
    if (table[pos] == want) break;
  }
  // Backward shift: later members of the probe run move into the hole when their home allows,
  // so there are no tombstones and lookups never slow down with churn.
  std::uint64_t hole = pos;
  for (std::uint64_t j = (pos + 1) & mask; table[j] != kEmpty; j = (j + 1) & mask) {
    const std::uint64_t home = (table[j] >> 32) & mask;
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      table[hole] = table[j];
      hole = j;
    }
  }
  table[hole] = kEmpty;
}

}  // namespace

std::uint32_t View::find(const BlockKey& key) const noexcept {
  return table_find(table, h->table_buckets, key, [&](std::uint32_t s) {
    return s < n() && slots[s].key_hi == key.hi() && slots[s].key_lo == key.lo();
  });
}

void View::insert(const BlockKey& key, std::uint32_t slot) const noexcept {
  table_insert(table, h->table_buckets, key, slot);
}

void View::erase(const BlockKey& key, std::uint32_t slot) const noexcept {
  table_erase(table, h->table_buckets, key, slot);
}

void View::clear_table() const noexcept {
  for (std::uint64_t i = 0; i < h->table_buckets; ++i) table[i] = kEmpty;
}

std::uint32_t View::ghost_find(const BlockKey& key) const noexcept {
  return table_find(ghost_table, h->table_buckets, key, [&](std::uint32_t g) {
    return g < n() && ghosts[g].key_hi == key.hi() && ghosts[g].key_lo == key.lo();
  });
}

void View::ghost_insert(const BlockKey& key, std::uint32_t g) const noexcept {
  table_insert(ghost_table, h->table_buckets, key, g);
}

void View::ghost_erase(const BlockKey& key, std::uint32_t g) const noexcept {
  table_erase(ghost_table, h->table_buckets, key, g);
}

void View::clear_ghost_table() const noexcept {
  for (std::uint64_t i = 0; i < h->table_buckets; ++i) ghost_table[i] = kEmpty;
}

void View::reset_ghosts() const noexcept {
  for (std::uint32_t g = 0; g < n(); ++g) {
    GhostRecord& r = ghosts[g];
    r.list = 0;
    r.prev = kNone;
    r.next = g + 1 < n() ? g + 1 : kNone;
  }
  h->ghost_free = 0;
  h->ghost_head[0] = h->ghost_tail[0] = h->ghost_head[1] = h->ghost_tail[1] = kNone;
  h->n_ghost[0] = h->n_ghost[1] = 0;
  clear_ghost_table();
}

void View::push_front(std::uint32_t& head, std::uint32_t& tail, std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  r.prev = kNone;
  r.next = head;
  if (head != kNone) slots[head].prev = s;
  head = s;
  if (tail == kNone) tail = s;
}

void View::push_back(std::uint32_t& head, std::uint32_t& tail, std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  r.next = kNone;
  r.prev = tail;
  if (tail != kNone) slots[tail].next = s;
  tail = s;
  if (head == kNone) head = s;
}

void View::remove(std::uint32_t& head, std::uint32_t& tail, std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  if (r.prev != kNone) {
    slots[r.prev].next = r.next;
  } else {
    head = r.next;
  }
  if (r.next != kNone) {
    slots[r.next].prev = r.prev;
  } else {
    tail = r.prev;
  }
  r.prev = r.next = kNone;
}

void View::opush_front(TenantRecord& t, std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  r.oprev = kNone;
  r.onext = t.lru_head;
  if (t.lru_head != kNone) slots[t.lru_head].oprev = s;
  t.lru_head = s;
  if (t.lru_tail == kNone) t.lru_tail = s;
}

void View::opush_back(TenantRecord& t, std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  r.onext = kNone;
  r.oprev = t.lru_tail;
  if (t.lru_tail != kNone) slots[t.lru_tail].onext = s;
  t.lru_tail = s;
  if (t.lru_head == kNone) t.lru_head = s;
}

void View::oremove(TenantRecord& t, std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  if (r.oprev != kNone) {
    slots[r.oprev].onext = r.onext;
  } else {
    t.lru_head = r.onext;
  }
  if (r.onext != kNone) {
    slots[r.onext].oprev = r.oprev;
  } else {
    t.lru_tail = r.oprev;
  }
  r.oprev = r.onext = kNone;
}

void View::gpush_front(std::uint32_t list, std::uint32_t g) const noexcept {
  GhostRecord& r = ghosts[g];
  r.prev = kNone;
  r.next = h->ghost_head[list];
  if (r.next != kNone) ghosts[r.next].prev = g;
  h->ghost_head[list] = g;
  if (h->ghost_tail[list] == kNone) h->ghost_tail[list] = g;
}

void View::gremove(std::uint32_t list, std::uint32_t g) const noexcept {
  GhostRecord& r = ghosts[g];
  if (r.prev != kNone) {
    ghosts[r.prev].next = r.next;
  } else {
    h->ghost_head[list] = r.next;
  }
  if (r.next != kNone) {
    ghosts[r.next].prev = r.prev;
  } else {
    h->ghost_tail[list] = r.prev;
  }
  r.prev = r.next = kNone;
}

void View::lru_enter(std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  r.stamp = ++h->clock;
  push_front(h->list_head[r.list], h->list_tail[r.list], s);
  if (r.owner != kNone) opush_front(tenants[r.owner], s);
}

void View::lru_leave(std::uint32_t s) const noexcept {
  SlotRecord& r = slots[s];
  remove(h->list_head[r.list], h->list_tail[r.list], s);
  if (r.owner != kNone) oremove(tenants[r.owner], s);
}

std::uint64_t engine_hash(const char* id) noexcept {
  std::uint64_t x = 0xcbf29ce484222325ULL;
  for (; *id != '\0'; ++id) {
    x ^= static_cast<unsigned char>(*id);
    x *= 0x100000001b3ULL;
  }
  return x;
}

}  // namespace kvoffload::pool::detail
