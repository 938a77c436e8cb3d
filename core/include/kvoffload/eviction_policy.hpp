#pragma once
// Eviction policies of the Manager (docs/DESIGN.md §6.2): which resident chunks leave first.
//
// A policy sees chunk slots (0..capacity-1), never the region. The Manager owns the slot states and
// tells the policy, in batches (one virtual call per batch, never per key), what happened:
//
//   insert(slots, keys)   new residents, write pending: tracked but NOT evictable yet
//   release(slots)        slots become evictable (store completed, last reader done)
//   hold(slots)           evictable slots become unevictable (first reader pinned them)
//   touch(slots)          an access, slots in prefix order: afterwards slots[0] is the most
//                         recent, so the tail of a prefix is evicted before its head
//   remove(slots)         slots leave without a trace (failed store); no ghost entry
//   evict(n, ...)         choose and remove exactly n evictable, unprotected slots
//
// Note [Parked slots]: an unevictable slot (write pending or pinned by readers) is taken out of the
// policy's eviction lists, keeping its membership (ARC's T1/T2 counts include it), and goes back
// to the most-recent end of its list when released. Eviction therefore never walks over pinned or
// pending chunks: a batch of n costs O(n + protected slots met), and each operation is O(1) per
// slot.
//
// Policies are thread-compatible, like the Manager that drives them.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <kvoffload/block_key.hpp>
#include <kvoffload/export.h>
#include <kvoffload/policy_kinds.h>

namespace kvoffload {

// Index of a chunk slot (a row of the region). 32 bits: a region has fewer than 2^32 chunks.
using SlotIndex = std::uint32_t;
inline constexpr SlotIndex kNoSlot = 0xFFFFFFFFu;

// The kinds, listed once in policy_kinds.h (with the C API's kvo_policy): kLru, kArc.
enum class PolicyKind : std::uint8_t {
#define KVOFFLOAD_POLICY_KIND_ENUMERATOR_(value, upper, camel, name) k##camel = (value),
  KVOFFLOAD_POLICY_KINDS(KVOFFLOAD_POLICY_KIND_ENUMERATOR_)
#undef KVOFFLOAD_POLICY_KIND_ENUMERATOR_
};

// Every kind with its name, in the order of policy_kinds.h.
struct PolicyKindName {
  PolicyKind kind;
  std::string_view name;
};
inline constexpr PolicyKindName kPolicyKinds[] = {
#define KVOFFLOAD_POLICY_KIND_ENTRY_(value, upper, camel, name) {PolicyKind::k##camel, #name},
    KVOFFLOAD_POLICY_KINDS(KVOFFLOAD_POLICY_KIND_ENTRY_)
#undef KVOFFLOAD_POLICY_KIND_ENTRY_
};

// Whether `kind` is one of the list (a PolicyKind can be cast from any number).
[[nodiscard]] constexpr bool is_policy_kind(PolicyKind kind) noexcept {
  for (const PolicyKindName& k : kPolicyKinds) {
    if (k.kind == kind) return true;
  }
  return false;
}

// "lru", "arc"; "unknown" for a value outside the list.
KVOFFLOAD_API std::string_view to_string(PolicyKind kind) noexcept;
// Parses a kind's name (case-insensitive); throws Error(kInvalidArgument) naming the text and the
// kinds otherwise.
KVOFFLOAD_API PolicyKind parse_policy_kind(std::string_view text);
// The kinds' names for a message or a help text: "lru or arc".
KVOFFLOAD_API std::string policy_kind_names();

// Slots the current eviction must not choose: those whose mark equals epoch. The Manager stamps the
// slots of the keys in a call's protected set, so the test is one load and compare, inlined.
struct VictimFilter {
  const std::uint32_t* marks = nullptr;
  std::uint32_t epoch = 0;
  [[nodiscard]] bool is_protected(SlotIndex slot) const noexcept {
    return marks != nullptr && marks[slot] == epoch;
  }
};

// Counters a policy exposes for statistics and tests. Names follow ARC; LRU reports all its
// residents as `recent` and has no ghosts.
struct PolicyCounters {
  std::uint64_t resident = 0;        // slots tracked (evictable or parked)
  std::uint64_t evictable = 0;       // slots in the eviction lists
  std::uint64_t recent = 0;          // ARC |T1| (seen once), LRU: resident
  std::uint64_t frequent = 0;        // ARC |T2| (seen at least twice)
  std::uint64_t ghost_recent = 0;    // ARC |B1|
  std::uint64_t ghost_frequent = 0;  // ARC |B2|
  std::uint64_t recent_target = 0;   // ARC p, the adaptive target size of T1
};

class KVOFFLOAD_API EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  EvictionPolicy() = default;
  EvictionPolicy(const EvictionPolicy&) = delete;
  EvictionPolicy& operator=(const EvictionPolicy&) = delete;

  [[nodiscard]] virtual PolicyKind kind() const noexcept = 0;
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  // Number of slots this policy was built for (the Manager's num_chunks).
  [[nodiscard]] virtual std::uint32_t capacity() const noexcept = 0;

  // New residents (parked: write pending). keys[i] is the key stored in slots[i]; ARC looks it up
  // in its ghost lists (a ghost hit adapts the T1 target and admits the key into T2).
  virtual void insert(std::span<const SlotIndex> slots, std::span<const BlockKey> keys) = 0;
  // Parked slots become evictable, at the most-recent end; slots[0] ends most recent.
  virtual void release(std::span<const SlotIndex> slots) = 0;
  // Evictable slots become parked.
  virtual void hold(std::span<const SlotIndex> slots) = 0;
  // Accesses in prefix order (slots[0] ends most recent). Parked slots keep their place until
  // released but ARC still promotes them from T1 to T2.
  virtual void touch(std::span<const SlotIndex> slots) = 0;
  // Keys a touch named that are not resident, in call order (the Manager calls it after touch()
  // with the same call's absent keys). vLLM's ARC adapts its T1 target on ghost hits here; the
  // native policies ignore them.
  virtual void touch_missing(std::span<const BlockKey> /*keys*/) {}
  // Slots leave without becoming ghosts (a failed store frees its slots).
  virtual void remove(std::span<const SlotIndex> slots) = 0;
  // Removes exactly `count` evictable slots not protected by `filter` and writes them to
  // victims_out (size >= count). slot_keys[s] is the key in slot s (ARC keeps evicted keys as
  // ghosts). The caller guarantees that enough candidates exist (evictable minus protected
  // evictable >= count); returns the number written, which is then `count`. Exception: the vLLM
  // policies return 0 and change nothing when they do not find `count` (vLLM's ARC can refuse
  // despite enough candidates, as vLLM's does).
  virtual std::size_t evict(std::size_t count, const VictimFilter& filter,
                            std::span<const BlockKey> slot_keys,
                            std::span<SlotIndex> victims_out) = 0;
  // Forgets everything (residents and ghosts; ARC's p back to 0).
  virtual void reset() = 0;

  [[nodiscard]] virtual std::size_t evictable_count() const noexcept = 0;
  [[nodiscard]] virtual PolicyCounters counters() const noexcept = 0;
};

// Least recently used over the evictable slots.
KVOFFLOAD_API std::unique_ptr<EvictionPolicy> make_lru_policy(std::uint32_t capacity);
// Adaptive replacement cache (Megiddo & Modha, FAST'03) with ghost lists bounded as in the paper:
// |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
KVOFFLOAD_API std::unique_ptr<EvictionPolicy> make_arc_policy(std::uint32_t capacity);
KVOFFLOAD_API std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, std::uint32_t capacity);

// vLLM's CachePolicy implementations (vllm/v1/kv_offload/cpu/policies/{lru,arc}.py), for
// ManagerSemantics::kVllm. LRU (vLLM >= 68567ef2df): a list of the evictable blocks only; a block
// enters it at the most recent end when its store or its last load completes (within one release,
// the last slot ends most recent), touch moves only blocks in it (slots[0] ends most recent), and
// an eviction that finds fewer than n unprotected candidates changes nothing and returns 0.
// ARC: every resident stays in T1/T2, pinned or write-pending or not: release() and hold() only
// flip evictability and never move a slot, and eviction walks past unevictable slots; insert
// enters T1 and drops any ghost of the key without adapting; touch promotes a ready T1
// slot to T2 (a write-pending one goes to T1's recent end) and adapts the (fractional) T1 target
// on ghost hits (touch_missing); eviction takes T1's next candidate while the remaining |T1| is
// at least floor(target), else T2's; B1 and B2 are each bounded by the capacity, oldest dropped.
KVOFFLOAD_API std::unique_ptr<EvictionPolicy> make_vllm_lru_policy(std::uint32_t capacity);
KVOFFLOAD_API std::unique_ptr<EvictionPolicy> make_vllm_arc_policy(std::uint32_t capacity);
KVOFFLOAD_API std::unique_ptr<EvictionPolicy> make_vllm_policy(PolicyKind kind,
                                                               std::uint32_t capacity);

}  // namespace kvoffload
