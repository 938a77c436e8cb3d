#pragma once
// Live state of the engines on a node, read from outside without disturbing them.
//
// Every region carries a live statistics page (Note [Live stats] in core/src/live/live_page.hpp):
// the scheduler's Manager and TieredStore and each rank's TransferEngine and bring-up keep it
// current with a few relaxed stores per operation. Any process that can open the region file can
// read it: snapshot_engines() lists the regions of a shm dir as list_regions() does (no lock, no
// role: the liveness protocol never sees the reader) and copies each one's page.
//
//   for (const kvoffload::EngineSnapshot& e : kvoffload::snapshot_engines("/dev/shm")) {
//     if (e.live) std::printf("%s: %llu of %llu chunks used\n", e.region.engine_id.c_str(),
//                             e.live->scheduler.used, e.live->scheduler.num_chunks);
//   }
//
// Writers: Manager::publish_live_stats(region), TieredStore::publish_live_stats(region) (both done
// by OffloadStack::build), and a TransferEngine built on a Region (EngineOptions::live_stats).
// Counters count since their writer attached; gauges are current values.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <kvoffload/export.h>
#include <kvoffload/region.hpp>

namespace kvoffload {

struct Syscalls;

// The scheduler side: the Manager of the region's slots.
struct LiveScheduler {
  bool attached = false;  // a Manager published here (pid set)
  bool detached = false;  // ... and has stopped (its region closed or the Manager is gone)
  std::int64_t pid = 0;
  double attached_unix_seconds = 0;
  // Occupancy (gauges).
  std::uint64_t num_chunks = 0;
  std::uint64_t ready_chunks = 0;  // slots the Manager may hand out (bring-up)
  std::uint64_t used = 0;          // holding a key (write-pending or ready)
  std::uint64_t write_pending = 0;
  std::uint64_t pinned = 0;
  // Counters, in keys (ManagerStats).
  std::uint64_t lookup_keys = 0;
  std::uint64_t hits = 0;
  std::uint64_t hits_pending = 0;
  std::uint64_t misses = 0;
  std::uint64_t stores_prepared = 0;
  std::uint64_t stores_completed = 0;
  std::uint64_t stores_failed = 0;
  std::uint64_t stores_skipped_threshold = 0;
  std::uint64_t allocation_failures = 0;  // prepare_store calls that could not store
  std::uint64_t evictions = 0;
  std::uint64_t loads_prepared = 0;
  std::uint64_t loads_completed = 0;
};

// One secondary tier behind the region (TieredStore), counters in keys.
struct LiveTier {
  std::string name;
  std::uint64_t lookups = 0;  // keys asked (primary misses)
  std::uint64_t present = 0;  // answered present: a hit of this tier
  std::uint64_t pending = 0;  // answered pending (a remote check in flight)
  std::uint64_t promoted = 0;
  std::uint64_t promote_failed = 0;
  std::uint64_t offloaded = 0;
  std::uint64_t offload_failed = 0;
  [[nodiscard]] std::uint64_t misses() const noexcept {
    return lookups >= present + pending ? lookups - present - pending : 0;
  }
};

// One direction of one rank's TransferEngine.
struct LiveDirection {
  std::uint64_t jobs_submitted = 0;
  std::uint64_t jobs_succeeded = 0;
  std::uint64_t jobs_failed = 0;
  std::uint64_t bytes = 0;  // of succeeded jobs
  double copy_seconds = 0;  // copy time on the stream of succeeded jobs
  [[nodiscard]] std::uint64_t jobs_in_flight() const noexcept {
    const std::uint64_t done = jobs_succeeded + jobs_failed;
    return jobs_submitted >= done ? jobs_submitted - done : 0;
  }
  // bytes / copy_seconds / 1e9; 0 before the first copy.
  [[nodiscard]] double copy_gbps() const noexcept {
    return copy_seconds > 0 ? static_cast<double>(bytes) / copy_seconds / 1e9 : 0.0;
  }
};

struct LiveRank {
  std::uint32_t rank = 0;
  bool engine_attached = false;  // a TransferEngine published here (pid set)
  bool engine_detached = false;  // ... and has shut down
  std::int64_t pid = 0;
  double attached_unix_seconds = 0;
  bool host_registered = false;
  LiveDirection store;  // device to host
  LiveDirection load;   // host to device
  RankBringup bringup;  // the region header's readiness entry
  std::uint64_t bringup_populated_bytes = 0;
  std::uint64_t bringup_pieces = 0;
  double bringup_seconds = 0;  // since the rank's create_or_join, at its last piece
};

struct LiveStats {
  std::uint32_t version = 0;  // of the page layout
  // Every block was copied while no write was in progress (a writer killed in the middle of a
  // write leaves its block torn; the values are then the last ones it stored).
  bool consistent = true;
  LiveScheduler scheduler;
  std::vector<LiveTier> tiers;
  std::vector<LiveRank> ranks;  // world_size entries
};

struct EngineSnapshot {
  RegionInfo region;              // as list_regions() reports it (attached count, stale, ...)
  std::optional<LiveStats> live;  // when the page could be read
  std::string live_problem;       // why not, when it could not ("region still being created")
};

// The regions of `shm_dir` with their live pages, sorted by file name. Takes no lock; an entry
// that is not a region, or whose page cannot be read, is listed with its problem.
KVOFFLOAD_API std::vector<EngineSnapshot> snapshot_engines(const std::filesystem::path& shm_dir,
                                                           const Syscalls* syscalls = nullptr);

// This process's own view of an open region's page (the same copy a reader makes).
KVOFFLOAD_API LiveStats read_live_stats(const Region& region);

}  // namespace kvoffload
