#pragma once
// The live statistics page of a region: its layout, and the sequence lock its writers and readers
// use. See Note [Live stats].
//
// Note [Live stats]
// ~~~~~~~~~~~~~~~~~
// An operator wants to see a running engine from outside: occupancy, hits and misses per tier,
// bytes and copy time each way, evictions, bring-up progress, failed jobs. That state lives in
// the region file itself, in a page-aligned area between the owner table and the data (the
// header records where: RegionHeader::stats_offset / stats_bytes), so it exists exactly as long as
// the region and any process that can open the file can read it.
//
// Writers are the processes that own the state: the scheduler's Manager (one SchedulerBlock),
// its TieredStore (the TiersBlock), and on each rank its TransferEngine (RankBlock::transfer) and
// its bring-up (RankBlock::bringup). Each block has exactly one writer thread at a time (the
// Manager and TieredStore run on the scheduler thread; the engine writes under its state mutex;
// the bring-up thread is the only writer of its block), and each block sits on its own cache
// lines, so two processes never write the same line. A writer mirrors the counters it keeps
// anyway: after an operation it stores the new values with relaxed atomic stores, bracketed by a
// sequence number (odd while a write is in progress): a few plain stores per operation on x86,
// no read-modify-write, no lock.
//
// Readers (`region list`, `top`, the exporter) open the file read-only, map the area PROT_READ,
// and copy each block under its sequence number, retrying a few times when a write was in
// progress (a writer that died mid-write leaves the number odd: the copy is then reported as not
// consistent rather than waited for). They take no lock and no role: the liveness flock, the
// creator lock and the last-out-unlinks protocol (Note [Region lifetime]) never see them.
// Counters are cumulative since their writer attached (a restarted rank starts from zero again,
// as a Prometheus counter does after a restart); gauges (used, pinned, ...) are current values.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include <kvoffload/live_page.hpp>

namespace kvoffload::detail {

inline constexpr char kLiveMagic[8] = {'K', 'V', 'O', 'L', 'I', 'V', 'E', 'S'};
inline constexpr std::uint32_t kLiveVersion = 1;
inline constexpr std::uint32_t kLiveMaxTiers = 8;
inline constexpr std::size_t kLiveTierNameBytes = 48;

// The first 64 bytes of the area: what a reader checks before trusting any offset.
struct LivePageHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t world_size;
  std::uint32_t max_tiers;
  std::uint32_t rank_stride;  // bytes per RankBlock
  std::uint64_t scheduler_offset;
  std::uint64_t tiers_offset;
  std::uint64_t ranks_offset;
  std::uint64_t bytes;  // of the whole live area in use (before page rounding)
  std::uint64_t reserved;
};
static_assert(sizeof(LivePageHeader) == 64);

// Written by the Manager (Manager::publish_live_stats). Every field is a u64 word.
struct alignas(64) SchedulerBlock {
  std::uint64_t seq;
  std::uint64_t pid;
  std::uint64_t attached_unix_ns;
  std::uint64_t num_chunks;
  std::uint64_t ready_chunks;
  std::uint64_t used;
  std::uint64_t write_pending;
  std::uint64_t pinned;
  std::uint64_t lookup_keys;
  std::uint64_t hits;
  std::uint64_t hits_pending;
  std::uint64_t misses;
  std::uint64_t stores_prepared;
  std::uint64_t stores_completed;
  std::uint64_t stores_failed;
  std::uint64_t stores_skipped_threshold;
  std::uint64_t allocation_failures;
  std::uint64_t evictions;
  std::uint64_t loads_prepared;
  std::uint64_t loads_completed;
  std::uint64_t detached_unix_ns;  // set when the Manager stops publishing (0 while it does)
  std::uint64_t reserved[11];
};
static_assert(sizeof(SchedulerBlock) == 256);

struct TierEntry {
  std::uint64_t name_words[kLiveTierNameBytes / 8];  // NUL-padded name, as words
  std::uint64_t lookups;                             // keys asked (primary misses)
  std::uint64_t present;                             // ... answered present
  std::uint64_t pending;                             // ... answered pending (check in flight)
  std::uint64_t promoted;                            // keys read back into the region
  std::uint64_t promote_failed;                      // reads that missed or failed at this tier
  std::uint64_t offloaded;                           // keys written to this tier
  std::uint64_t offload_failed;
  std::uint64_t reserved[3];
};
static_assert(sizeof(TierEntry) == 128);

// Written by the TieredStore (TieredStore::publish_live_stats).
struct alignas(64) TiersBlock {
  std::uint64_t seq;
  std::uint64_t pid;
  std::uint64_t count;  // tiers published (at most kLiveMaxTiers)
  std::uint64_t reserved[5];
  TierEntry tiers[kLiveMaxTiers];
};
static_assert(sizeof(TiersBlock) == 64 + kLiveMaxTiers * 128);

struct TransferDirection {
  std::uint64_t submitted;  // jobs
  std::uint64_t succeeded;
  std::uint64_t failed;
  std::uint64_t bytes;    // of succeeded jobs
  std::uint64_t copy_ns;  // copy time on the stream of succeeded jobs
};

// Written by one rank's TransferEngine, under its state mutex.
struct alignas(64) RankTransferBlock {
  std::uint64_t seq;
  std::uint64_t pid;
  std::uint64_t attached_unix_ns;
  std::uint64_t host_registered;
  TransferDirection store;
  TransferDirection load;
  std::uint64_t detached_unix_ns;  // set when the engine shuts down (0 while it runs)
  std::uint64_t reserved;
};
static_assert(sizeof(RankTransferBlock) == 128);

// Written by one rank's bring-up (the thread that populates its slots).
struct alignas(64) RankBringupBlock {
  std::uint64_t seq;
  std::uint64_t populated_bytes;
  std::uint64_t elapsed_ns;  // since create_or_join started, at the last piece
  std::uint64_t pieces;
  std::uint64_t reserved[4];
};
static_assert(sizeof(RankBringupBlock) == 64);

struct alignas(64) RankBlock {
  RankTransferBlock transfer;
  RankBringupBlock bringup;
  std::uint64_t reserved[8];
};
static_assert(sizeof(RankBlock) == 256);

// The fixed part of the area; RankBlocks follow at ranks_offset, one per rank.
struct LivePage {
  LivePageHeader header;
  SchedulerBlock scheduler;
  TiersBlock tiers;

  [[nodiscard]] RankBlock* ranks() noexcept {
    return reinterpret_cast<RankBlock*>(reinterpret_cast<std::byte*>(this) + sizeof(LivePage));
  }
};
static_assert(sizeof(LivePage) % 64 == 0);

// The page in a sink's area; nullptr once the page is gone.
inline LivePage* live_page_of(const LivePageSink& sink) noexcept {
  const std::span<std::byte> area = sink.live_area();
  return area.size() < sizeof(LivePage) ? nullptr : reinterpret_cast<LivePage*>(area.data());
}

// Bytes of the area in use for `world_size` ranks (before rounding up to a page).
constexpr std::uint64_t live_bytes(std::uint32_t world_size) noexcept {
  return sizeof(LivePage) + std::uint64_t{world_size} * sizeof(RankBlock);
}

// Writes the page header into a zeroed area of at least live_bytes(world_size) bytes.
void format_live_page(std::span<std::byte> area, std::uint32_t world_size) noexcept;

// ---- the sequence lock (Note [Live stats]) ----

inline std::atomic_ref<std::uint64_t> live_word(std::uint64_t& w) noexcept {
  return std::atomic_ref<std::uint64_t>(w);
}

// One write of a block: begin, stores, end. Single writer per block, so the sequence number is
// read and stored rather than incremented atomically. The ordering is carried by the accesses
// themselves, not by fences (ThreadSanitizer does not model atomic_thread_fence, and GCC refuses
// it under -fsanitize=thread): each field is a release store, so a reader that acquires a field
// of an unfinished write also sees the odd sequence number stored before it; the closing store
// of the sequence number is a release too. On x86 these are the same plain movs as relaxed ones.
class LiveWrite {
 public:
  explicit LiveWrite(std::uint64_t& seq) noexcept : seq_(seq) {
    const std::uint64_t s = live_word(seq_).load(std::memory_order_relaxed);
    live_word(seq_).store(s + 1, std::memory_order_relaxed);
  }
  ~LiveWrite() {
    const std::uint64_t s = live_word(seq_).load(std::memory_order_relaxed);
    live_word(seq_).store(s + 1, std::memory_order_release);
  }
  LiveWrite(const LiveWrite&) = delete;
  LiveWrite& operator=(const LiveWrite&) = delete;

  static void put(std::uint64_t& field, std::uint64_t value) noexcept {
    live_word(field).store(value, std::memory_order_release);
  }

 private:
  std::uint64_t& seq_;
};

// Copies a block (all u64 words, the first one its sequence number) out of a mapping another
// process writes. Returns false when every try met a write in progress; `out` then holds the
// last (possibly torn) copy.
template <typename Block>
bool live_read(const Block& src, Block& out, int tries = 64) noexcept {
  static_assert(sizeof(Block) % 8 == 0);
  constexpr std::size_t kWords = sizeof(Block) / 8;
  // The mapping may be read-only: only loads go through these references (a plain mov on every
  // 64-bit target we build for).
  auto* words = reinterpret_cast<std::uint64_t*>(const_cast<Block*>(&src));
  auto* dst = reinterpret_cast<std::uint64_t*>(&out);
  for (int i = 0; i < tries; ++i) {
    // Acquire loads of the fields (pairing with LiveWrite's release stores): the second load of
    // the sequence number cannot move above them, and sees the odd number of any write whose
    // field was read.
    const std::uint64_t before = live_word(words[0]).load(std::memory_order_acquire);
    for (std::size_t w = 0; w < kWords; ++w)
      dst[w] = live_word(words[w]).load(std::memory_order_acquire);
    const std::uint64_t after = live_word(words[0]).load(std::memory_order_relaxed);
    if (before == after && before % 2 == 0) return true;
  }
  return false;
}

// The name of a tier as NUL-padded words (truncated to kLiveTierNameBytes - 1 bytes).
void put_tier_name(TierEntry& entry, std::string_view name) noexcept;
std::string_view tier_name(const TierEntry& entry) noexcept;

// Unix time in nanoseconds, for attached_unix_ns.
std::uint64_t unix_now_ns() noexcept;

}  // namespace kvoffload::detail
