// Progressive bring-up (Note [Progressive bring-up]): a ranked mapper allocates, populates and
// publishes its slots piece by piece in row order, in create_or_join or on its own thread, and
// the status and readiness-table readers built on what it publishes.

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "live/live_page.hpp"
#include "region/header.hpp"
#include "region/populate.hpp"
#include "region/region_internal.hpp"
#include "sys/syscalls.hpp"
#include "util/log.hpp"

// Note [Progressive bring-up]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A ranked mapper brings its slots up in pieces of rows (Note [Growing pieces]):
// allocate + populate the piece's ranges (Note [Allocation by populate]), hand the piece to
// on_piece_ready (a GPU rank registers it there, so no single driver call covers more than a
// piece), then publish it: the rank's entry in the readiness table after the header (one
// RankReadiness per rank, in the shared mapping, written with release stores and read with
// acquire loads) advances its ready prefix. Pieces go in row order, so "rows [0, n) are ready on
// rank r" is one number per rank, and the rows ready on every rank are the minimum of those
// numbers (chunks_ready_on_all_ranks). The scheduler feeds that minimum to the Manager
// (Manager::set_ready_chunks), which hands out only slots of ready rows: before a row is ready on
// every rank a lookup of its keys misses and a store that finds no ready room is skipped;
// neither blocks.
// kBlocking runs the pieces in create_or_join and throws the first failure (the Region is then
// closed like any failed creation). kBackground runs them on one thread per mapper (each piece
// still populates with populate_threads threads) and turns a failure into state kFailed with the
// Error kept for bringup_status() / wait_bringup() and the errno in the rank's table entry: the
// rows made ready before it stay usable, nothing crashes. close() stops the thread between pieces
// and joins it before the teardown hooks, and marks the rank stopped (ready prefix 0: a detached
// rank serves nothing). A rank killed mid-way leaves its entry "running" with the prefix it
// reached; its liveness lock is gone, so the region is reclaimed as stale once everyone left.
// An unranked mapper (the scheduler) has no entry: in background mode it populates nothing and
// touches only rows every rank made ready; in blocking mode it populates the whole region.
//
// Note [Growing pieces]
// ~~~~~~~~~~~~~~~~~~~~~
// A piece is the unit of readiness and of registration: nothing of it serves until the whole
// piece is populated and registered. One size cannot do both jobs: 1 GiB pieces keep a 4 TiB
// pool at 4096 driver calls but make a 4 GiB pool wait for a whole GiB (seconds) before the
// first request; 64 MiB pieces serve at once but cost 16 times the calls. So the first piece is
// bringup_first_piece_bytes (64 MiB) and each next one doubles, up to bringup_piece_bytes
// (1 GiB): the first rows serve after 64 MiB, and the pool still comes up in about
// log2(max/first) + size/max pieces (4 GiB: 64+128+256+512 MiB, three of 1 GiB, then the 64 MiB
// left: 8 pieces).
// Sizes are in rows (bytes / row_stride, at least one row), so the doubling is exact in rows.

namespace kvoffload {

std::string_view to_string(BringupMode m) noexcept {
  return m == BringupMode::kBlocking ? "blocking" : "background";
}

std::string_view to_string(BringupState s) noexcept {
  switch (s) {
    case BringupState::kPending:
      return "pending";
    case BringupState::kRunning:
      return "running";
    case BringupState::kReady:
      return "ready";
    case BringupState::kFailed:
      return "failed";
    case BringupState::kStopped:
      return "stopped";
  }
  return "unknown";
}

BringupMode parse_bringup_mode(std::string_view name) {
  if (name == "blocking") return BringupMode::kBlocking;
  if (name == "background") return BringupMode::kBackground;
  throw_invalid("bring-up mode '" + std::string(name) +
                "' is unknown; use 'background' or 'blocking'");
}

std::string_view to_string(PopulateMethod m) noexcept {
  switch (m) {
    case PopulateMethod::kMadvise:
      return "madvise";
    case PopulateMethod::kFallback:
      return "fallback";
    case PopulateMethod::kNone:
      return "none";
  }
  return "none";
}

// The pieces of a ranked mapper (Note [Progressive bring-up]). Throws the first failure after
// recording it in the status and the rank's table entry.
void Region::run_bringup(Impl& s) {
  const RegionGeometry& g = s.geometry;
  const std::uint32_t rank = *s.rank;
  detail::RankReadiness& entry = s.table[rank];
  // This thread is the only writer of the rank's bring-up block (Note [Live stats]).
  detail::RankBringupBlock& live = s.live->ranks()[rank].bringup;
  std::uint64_t live_bytes = 0;
  std::uint64_t live_pieces = 0;
  auto publish_progress = [&] {
    const detail::LiveWrite write(live.seq);
    detail::LiveWrite::put(live.populated_bytes, live_bytes);
    detail::LiveWrite::put(live.pieces, live_pieces);
    detail::LiveWrite::put(
        live.elapsed_ns,
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - s.started)
                                       .count()));
  };
  publish_progress();
  detail::table_ready(entry).store(0, std::memory_order_release);
  detail::table_errno(entry).store(0, std::memory_order_relaxed);
  detail::table_state(entry).store(static_cast<std::uint32_t>(BringupState::kRunning),
                                   std::memory_order_release);
  const Syscalls& sys = *s.sys;
  const std::string what = "region " + s.path.string();
  const detail::PopulatePlan plan(g, s.data, s.rank);
  const detail::BackingFile file{
      .fd = s.fd.get(), .file_base = s.mapping.data(), .dirfd = s.dir.get(), .dir = s.shm_dir};
  auto finish = [&](BringupState state, std::optional<Error> error, std::uint64_t failed_chunk) {
    publish_progress();
    if (error)
      detail::table_errno(entry).store(static_cast<std::uint32_t>(error->sys_errno()),
                                       std::memory_order_relaxed);
    if (state == BringupState::kStopped)
      detail::table_ready(entry).store(0, std::memory_order_release);
    detail::table_state(entry).store(static_cast<std::uint32_t>(state), std::memory_order_release);
    const std::lock_guard lock(s.mu);
    s.bringup.state = state;
    s.bringup.error = std::move(error);
    s.bringup.failed_chunk = failed_chunk;
    s.bringup.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
    s.cv.notify_all();
  };
  std::uint64_t first = 0;
  std::uint64_t rows = 0;
  std::uint64_t next_rows = s.first_piece_rows;  // Note [Growing pieces]
  try {
    for (; first < g.num_chunks(); first += rows) {
      if (s.stop.load(std::memory_order_relaxed)) {
        finish(BringupState::kStopped, std::nullopt, first);
        return;
      }
      rows = std::min(next_rows, g.num_chunks() - first);
      next_rows = next_rows > s.piece_rows / 2 ? s.piece_rows : next_rows * 2;  // no overflow
      const detail::PopulatePlan piece = plan.rows(first, rows);
      if (s.populate_pages) {
        const PopulateReport r =
            detail::populate(sys, piece, g.page_size(), s.populate_threads, what, file);
        live_bytes += r.bytes;
        const std::lock_guard lock(s.mu);
        s.populate.method = r.method;
        s.populate.bytes += r.bytes;
        s.populate.seconds += r.seconds;
      } else {
        detail::allocate(sys, piece, file, what);
      }
      if (s.on_piece_ready) {
        s.on_piece_ready(
            {s.data + first * g.row_stride(), static_cast<std::size_t>(rows * g.row_stride())},
            first, rows);
      }
      detail::table_ready(entry).store(first + rows, std::memory_order_release);
      ++live_pieces;
      publish_progress();
      const std::lock_guard lock(s.mu);
      s.bringup.ready_chunks = first + rows;
    }
  } catch (const Error& e) {
    log().error("{}: bring-up of rank {} failed at chunks [{}, {}): {}", what, rank, first,
                first + rows, e.what());
    finish(BringupState::kFailed, e, first);
    throw;
  } catch (const std::exception& e) {
    Error wrapped(ErrorCode::kInternal, what + ": bring-up of rank " + std::to_string(rank) +
                                            " failed at chunk " + std::to_string(first) + ": " +
                                            e.what());
    log().error("{}", wrapped.what());
    finish(BringupState::kFailed, wrapped, first);
    throw wrapped;
  }
  finish(BringupState::kReady, std::nullopt, 0);
}

BringupStatus Region::bringup_status() const {
  const std::lock_guard lock(impl_->mu);
  return impl_->bringup;
}

void Region::wait_bringup() const {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->bringup.state != BringupState::kRunning; });
  if (impl_->bringup.state == BringupState::kFailed && impl_->bringup.error)
    throw *impl_->bringup.error;
  if (impl_->bringup.state == BringupState::kStopped) {
    throw Error(ErrorCode::kState, "region " + impl_->path.string() +
                                       ": bring-up was stopped by close() before it finished");
  }
}

RankBringup Region::rank_bringup(std::uint32_t rank) const {
  if (!is_open()) throw Error(ErrorCode::kState, "rank_bringup() on a closed region");
  (void)impl_->geometry.copy_index(rank);  // validates the rank
  detail::RankReadiness& e = impl_->table[rank];
  RankBringup r;
  r.state = static_cast<BringupState>(detail::table_state(e).load(std::memory_order_acquire));
  r.ready_chunks = detail::table_ready(e).load(std::memory_order_acquire);
  r.sys_errno = static_cast<int>(detail::table_errno(e).load(std::memory_order_relaxed));
  return r;
}

std::uint64_t Region::chunks_ready_on_all_ranks() const {
  if (!is_open()) throw Error(ErrorCode::kState, "chunks_ready_on_all_ranks() on a closed region");
  const RegionGeometry& g = impl_->geometry;
  std::uint64_t ready = g.num_chunks();
  for (std::uint32_t r = 0; r < g.world_size(); ++r) {
    // A value past num_chunks can only come from a corrupt table; never hand out such rows.
    ready = std::min(ready, detail::table_ready(impl_->table[r]).load(std::memory_order_acquire));
  }
  return ready;
}

}  // namespace kvoffload
