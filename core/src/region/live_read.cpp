// Reading live statistics pages (Note [Live stats] in live_page.hpp): from another process
// through a read-only mapping of the region file (snapshot_engines), or from this process's own
// mapping (read_live_stats).
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/live_stats.hpp>

#include "live/live_page.hpp"
#include "region/header.hpp"
#include "region/listing.hpp"
#include "sys/sys.hpp"
#include "sys/syscalls.hpp"

namespace kvoffload {
namespace {

double ns_to_seconds(std::uint64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

LiveDirection direction_of(const detail::TransferDirection& d) {
  return LiveDirection{.jobs_submitted = d.submitted,
                       .jobs_succeeded = d.succeeded,
                       .jobs_failed = d.failed,
                       .bytes = d.bytes,
                       .copy_seconds = ns_to_seconds(d.copy_ns)};
}

// Copies everything out of a page whose header was checked. `table` is the readiness table of
// the same region.
LiveStats copy_page(const detail::LivePage& page, const detail::RankReadiness* table,
                    std::uint32_t world_size) {
  LiveStats out;
  out.version = page.header.version;
  detail::SchedulerBlock sb{};
  out.consistent = detail::live_read(page.scheduler, sb) && out.consistent;
  LiveScheduler& s = out.scheduler;
  s.attached = sb.pid != 0;
  s.detached = sb.detached_unix_ns != 0;
  s.pid = static_cast<std::int64_t>(sb.pid);
  s.attached_unix_seconds = ns_to_seconds(sb.attached_unix_ns);
  s.num_chunks = sb.num_chunks;
  s.ready_chunks = sb.ready_chunks;
  s.used = sb.used;
  s.write_pending = sb.write_pending;
  s.pinned = sb.pinned;
  s.lookup_keys = sb.lookup_keys;
  s.hits = sb.hits;
  s.hits_pending = sb.hits_pending;
  s.misses = sb.misses;
  s.stores_prepared = sb.stores_prepared;
  s.stores_completed = sb.stores_completed;
  s.stores_failed = sb.stores_failed;
  s.stores_skipped_threshold = sb.stores_skipped_threshold;
  s.allocation_failures = sb.allocation_failures;
  s.evictions = sb.evictions;
  s.loads_prepared = sb.loads_prepared;
  s.loads_completed = sb.loads_completed;

  detail::TiersBlock tb{};
  out.consistent = detail::live_read(page.tiers, tb) && out.consistent;
  const std::uint64_t tiers = std::min<std::uint64_t>(tb.count, detail::kLiveMaxTiers);
  for (std::uint64_t t = 0; t < tiers; ++t) {
    const detail::TierEntry& e = tb.tiers[t];
    out.tiers.push_back(LiveTier{.name = std::string(detail::tier_name(e)),
                                 .lookups = e.lookups,
                                 .present = e.present,
                                 .pending = e.pending,
                                 .promoted = e.promoted,
                                 .promote_failed = e.promote_failed,
                                 .offloaded = e.offloaded,
                                 .offload_failed = e.offload_failed});
  }

  auto* ranks = const_cast<detail::LivePage&>(page).ranks();
  auto* entries = const_cast<detail::RankReadiness*>(table);
  for (std::uint32_t r = 0; r < world_size; ++r) {
    detail::RankTransferBlock xb{};
    detail::RankBringupBlock bb{};
    out.consistent = detail::live_read(ranks[r].transfer, xb) && out.consistent;
    out.consistent = detail::live_read(ranks[r].bringup, bb) && out.consistent;
    LiveRank lr;
    lr.rank = r;
    lr.engine_attached = xb.pid != 0;
    lr.engine_detached = xb.detached_unix_ns != 0;
    lr.pid = static_cast<std::int64_t>(xb.pid);
    lr.attached_unix_seconds = ns_to_seconds(xb.attached_unix_ns);
    lr.host_registered = xb.host_registered != 0;
    lr.store = direction_of(xb.store);
    lr.load = direction_of(xb.load);
    detail::RankReadiness& entry = entries[r];
    lr.bringup.state =
        static_cast<BringupState>(std::atomic_ref(entry.state).load(std::memory_order_acquire));
    lr.bringup.ready_chunks = std::atomic_ref(entry.ready_chunks).load(std::memory_order_acquire);
    lr.bringup.sys_errno =
        static_cast<int>(std::atomic_ref(entry.sys_errno).load(std::memory_order_relaxed));
    lr.bringup_populated_bytes = bb.populated_bytes;
    lr.bringup_pieces = bb.pieces;
    lr.bringup_seconds = ns_to_seconds(bb.elapsed_ns);
    out.ranks.push_back(lr);
  }
  return out;
}

// Why a header's live area cannot be trusted, or "" when it can.
std::string check_area(const detail::RegionHeader& h, const struct stat& st) {
  const auto page = static_cast<std::size_t>(h.page_size);
  if (h.stats_offset != detail::stats_offset_for(page, h.world_size) ||
      h.stats_bytes != detail::stats_bytes_for(page, h.world_size) ||
      h.data_offset != h.stats_offset + h.stats_bytes) {
    return "its live statistics area is not where format version " +
           std::to_string(detail::kRegionVersion) + " puts it (corrupt header)";
  }
  if (static_cast<std::uint64_t>(st.st_size) < h.data_offset) {
    return "the file is shorter than its header area";
  }
  return {};
}

std::string check_page(const detail::LivePageHeader& p, std::uint32_t world_size) {
  if (std::memcmp(p.magic, detail::kLiveMagic, sizeof p.magic) != 0) {
    return "no live statistics page (bad magic)";
  }
  if (p.version != detail::kLiveVersion) {
    return "live statistics page of version " + std::to_string(p.version) + "; this reader knows " +
           std::to_string(detail::kLiveVersion);
  }
  if (p.world_size != world_size || p.max_tiers != detail::kLiveMaxTiers ||
      p.rank_stride != sizeof(detail::RankBlock) || p.ranks_offset != sizeof(detail::LivePage) ||
      p.bytes != detail::live_bytes(world_size)) {
    return "live statistics page does not match its region header (corrupt)";
  }
  return {};
}

}  // namespace

std::vector<EngineSnapshot> snapshot_engines(const std::filesystem::path& shm_dir,
                                             const Syscalls* syscalls) {
  const Syscalls& sys = syscalls != nullptr ? *syscalls : real_syscalls();
  struct Found {
    std::optional<LiveStats> live;
    std::string problem;
  };
  std::vector<std::pair<std::size_t, Found>> found;
  std::vector<RegionInfo> infos = detail::list_regions_with(
      shm_dir, sys,
      [&](std::size_t index, int fd, const struct stat& st, const detail::RegionHeader& h) {
        Found f;
        f.problem = check_area(h, st);
        if (f.problem.empty()) {
          // Read-only and shared: never a lock, never a write (Note [Live stats]).
          const auto len = static_cast<std::size_t>(h.stats_offset + h.stats_bytes);
          void* addr = sys.mmap(sys.context, nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
          if (addr == MAP_FAILED) {
            f.problem = "cannot map its live statistics: " + errno_name(errno);
          } else {
            const detail::Mapping mapping(sys, addr, len);
            const auto& page =
                *reinterpret_cast<const detail::LivePage*>(mapping.data() + h.stats_offset);
            f.problem = check_page(page.header, h.world_size);
            if (f.problem.empty()) {
              f.live = copy_page(page,
                                 reinterpret_cast<const detail::RankReadiness*>(
                                     mapping.data() + detail::kReadinessOffset),
                                 h.world_size);
            }
          }
        }
        found.emplace_back(index, std::move(f));
      });
  std::vector<EngineSnapshot> out;
  out.reserve(infos.size());
  for (RegionInfo& info : infos) {
    EngineSnapshot e;
    e.live_problem = info.problem;
    e.region = std::move(info);
    out.push_back(std::move(e));
  }
  for (auto& [index, f] : found) {
    out[index].live = std::move(f.live);
    out[index].live_problem = std::move(f.problem);
  }
  for (EngineSnapshot& e : out) {
    if (!e.live && e.live_problem.empty()) e.live_problem = "no readable region header";
  }
  return out;
}

LiveStats read_live_stats(const Region& region) {
  detail::LivePage* page = detail::live_page_of(region);
  if (page == nullptr) throw Error(ErrorCode::kState, "read_live_stats() on a closed region");
  const std::uint32_t world = region.geometry().world_size();
  const auto* table = reinterpret_cast<const detail::RankReadiness*>(
      reinterpret_cast<const std::byte*>(page) -
      detail::stats_offset_for(region.geometry().page_size(), world) + detail::kReadinessOffset);
  return copy_page(*page, table, world);
}

}  // namespace kvoffload
