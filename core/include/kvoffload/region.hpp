#pragma once
// The shared host region: one file `<shm_dir>/kvoffload_<engine_id>.region` per engine, mapped
// MAP_SHARED by every rank (and the scheduler). Exactly one process creates it; every other process
// joins the same memory. See docs/DESIGN.md §3 for the protocol and Note [Region lifetime] in
// core/src/region/attach.cpp for how creation, liveness and teardown fit together.
//
//   RegionOptions opts{.engine_id = "engine-0", .layout = {.num_chunks = 1024,
//                      .slot_bytes = 2 << 20, .world_size = 8}, .rank = 3};
//   kvoffload::Region region = kvoffload::Region::create_or_join(opts);
//   std::span<std::byte> mine = region.slot(/*chunk=*/17);   // rank 3's slot of chunk 17
//
// Errors are kvoffload::Error; nothing is left behind (file, descriptor, mapping) when
// create_or_join throws.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/export.h>
#include <kvoffload/geometry.hpp>
#include <kvoffload/live_page.hpp>

namespace kvoffload {

struct Syscalls;  // core/src/sys/syscalls.hpp: the test seam (internal) for every system call made
                  // here

enum class RegionRole { kCreator, kJoiner };
enum class PopulateMethod { kMadvise, kFallback, kNone };
// Note [Progressive bring-up] in core/src/region/bringup.cpp. kBlocking: create_or_join returns
// once this mapper's slots are allocated, populated and handed to on_piece_ready. kBackground: it
// returns once the region is mapped; a thread brings the slots up piece by piece.
enum class BringupMode { kBlocking, kBackground };
// A mapper's bring-up. Values are stored in the region header: do not renumber.
enum class BringupState : std::uint32_t {
  kPending = 0,
  kRunning = 1,
  kReady = 2,
  kFailed = 3,
  kStopped = 4
};

KVOFFLOAD_API std::string_view to_string(RegionRole role) noexcept;  // "creator" | "joiner"
KVOFFLOAD_API std::string_view to_string(
    PopulateMethod m) noexcept;  // "madvise" | "fallback" | "none"
KVOFFLOAD_API std::string_view to_string(BringupMode m) noexcept;  // "blocking" | "background"
// "pending" | "running" | "ready" | "failed" | "stopped"
KVOFFLOAD_API std::string_view to_string(BringupState s) noexcept;
// "blocking" | "background"; anything else throws kInvalidArgument naming the value.
KVOFFLOAD_API BringupMode parse_bringup_mode(std::string_view name);

inline constexpr std::uint64_t kDefaultBringupPieceBytes = std::uint64_t{1} << 30;
// Note [Growing pieces]: the first piece is small so a rank serves at once, and each next one
// doubles up to bringup_piece_bytes, so a large pool still comes up in few driver calls.
inline constexpr std::uint64_t kDefaultBringupFirstPieceBytes = std::uint64_t{64} << 20;

struct RegionOptions {
  std::string engine_id;  // 1..128 of [A-Za-z0-9._-], not "." or ".."
  RegionLayout layout;
  std::optional<std::uint32_t> rank;  // nullopt: an unranked mapper (the scheduler)
  std::filesystem::path shm_dir;      // empty: $KVOFFLOAD_SHM_DIR, else /dev/shm
  std::chrono::milliseconds join_timeout{30'000};
  unsigned populate_threads = 1;       // >= 1
  bool populate = true;                // pre-fault after mapping
  const Syscalls* syscalls = nullptr;  // nullptr: the real system calls; a table given
                                       // here must outlive the Region (tests only)
  BringupMode bringup = BringupMode::kBlocking;
  // Region bytes of the largest bring-up piece (> 0). Pieces grow (Note [Growing pieces]): the
  // first is min(bringup_first_piece_bytes, this), each next one twice the last up to this; a
  // piece is max(1, bytes / row_stride) rows.
  std::uint64_t bringup_piece_bytes = kDefaultBringupPieceBytes;
  std::uint64_t bringup_first_piece_bytes = kDefaultBringupFirstPieceBytes;  // > 0
  // Called for every piece of a ranked mapper once its pages are allocated and populated, before
  // the piece is published as ready (on GPU ranks: register `rows` with the device). Runs on the
  // bring-up thread in background mode; an exception fails the bring-up (state kFailed).
  std::function<void(std::span<std::byte> rows, std::uint64_t first_chunk,
                     std::uint64_t num_chunks)>
      on_piece_ready;
  // Runs at close() after every hook added with add_teardown_hook and before munmap. It is in
  // place before the first piece comes up, so it also runs when create_or_join fails in a
  // blocking bring-up: what on_piece_ready registered is released while its pages are mapped.
  std::function<void()> on_teardown;
};

// One rank's bring-up as the region header records it; any mapper can read any rank's.
struct RankBringup {
  BringupState state = BringupState::kPending;
  std::uint64_t ready_chunks = 0;  // rows [0, ready_chunks) are ready on that rank
  int sys_errno = 0;               // of a failure, when it had one
};

// This mapper's own bring-up.
struct BringupStatus {
  BringupState state = BringupState::kPending;
  std::uint64_t ready_chunks = 0;  // rows [0, ready_chunks) are ready for this mapper
  std::uint64_t num_chunks = 0;
  std::optional<Error> error;      // set when state is kFailed
  std::uint64_t failed_chunk = 0;  // first row of the piece that failed
  double seconds = 0.0;            // from create_or_join's start until ready or failed
};

struct PopulateReport {
  PopulateMethod method = PopulateMethod::kNone;
  std::uint64_t bytes = 0;  // bytes pre-faulted by this process
  double seconds = 0.0;
};

// One process's attachment to the region. Move-only; not synchronised: close() and the
// destructor must not race other calls on the same object (distinct Region objects, in one
// process or many, are independent attachments with their own lock). It carries the live
// statistics page its writers publish to (LivePageSink, kvoffload/live_page.hpp).
class KVOFFLOAD_API Region : public LivePageSink {
 public:
  // Creates the region, or joins it when another process created it (or is creating it), and
  // takes this mapper's role: its rank slot, or (unranked) the scheduler role. A role has one
  // holder at a time and is freed when its holder closes or dies (kill -9 included); while another
  // process holds it this throws kInUse naming the engine id, the role and the holder's PID
  // (Note [Owners] in core/src/region/owners.hpp).
  static Region create_or_join(const RegionOptions& options);

  Region(Region&& other) noexcept;
  Region& operator=(Region&& other) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() override;

  [[nodiscard]] const RegionGeometry& geometry() const noexcept;
  [[nodiscard]] RegionRole role() const noexcept;
  [[nodiscard]] const std::filesystem::path& path() const noexcept;
  [[nodiscard]] const std::string& engine_id() const noexcept;
  [[nodiscard]] std::optional<std::uint32_t> rank() const noexcept;
  // A copy: in background mode the bring-up thread adds to it until it is done.
  [[nodiscard]] PopulateReport populate_report() const;
  [[nodiscard]] bool is_open() const noexcept;

  // Start of the page-aligned data (geometry().data_bytes() bytes).
  [[nodiscard]] std::byte* data() const noexcept;
  // Rank `rank`'s slot of `chunk` (replicated: slot 0). Throws kInvalidArgument when out of range.
  [[nodiscard]] std::span<std::byte> slot(std::uint64_t chunk, std::uint32_t rank) const;
  // This mapper's own slot of `chunk`; throws kState for an unranked mapper.
  [[nodiscard]] std::span<std::byte> slot(std::uint64_t chunk) const;
  // The whole row of `chunk` (row_stride bytes, all copies and the padding).
  [[nodiscard]] std::span<std::byte> row(std::uint64_t chunk) const;

  // This mapper's bring-up (thread-safe). An unranked mapper is kReady at once in background mode
  // (it populates nothing; it uses only rows every rank made ready).
  [[nodiscard]] BringupStatus bringup_status() const;
  // Blocks until this mapper's bring-up is no longer running; throws its Error when it failed
  // (kState when it was stopped by close()).
  void wait_bringup() const;
  // What rank `rank` has published in the header (kInvalidArgument when out of range).
  [[nodiscard]] RankBringup rank_bringup(std::uint32_t rank) const;
  // Rows ready on every rank: the minimum of the ranks' ready prefixes. Never blocks.
  [[nodiscard]] std::uint64_t chunks_ready_on_all_ranks() const;

  // Runs `hook` at close() before munmap, in reverse order of registration. The transfer engine
  // uses it to unregister host memory (teardown order: unregister, munmap, close).
  void add_teardown_hook(std::function<void()> hook);

  // The region's live statistics page (Note [Live stats] in core/src/live/live_page.hpp) as a
  // sink (kvoffload/live_page.hpp), where Manager::publish_live_stats,
  // TieredStore::publish_live_stats and the TransferEngine write: the page's bytes (empty once
  // closed), num_chunks of the geometry, "region <path>", and add_teardown_hook. Read it with
  // read_live_stats() (kvoffload/live_stats.hpp).
  [[nodiscard]] std::span<std::byte> live_area() const noexcept override;
  [[nodiscard]] std::uint64_t live_num_chunks() const noexcept override;
  [[nodiscard]] std::string live_name() const override;
  void on_live_close(std::function<void()> hook) override;

  // Detaches: stops and joins a background bring-up, hooks, munmap, releases the shared lock,
  // close; the last process out unlinks the file (only if the path still names our inode).
  // Idempotent, never throws; returns false when a step failed (each failure is logged; every later
  // step still runs).
  bool close() noexcept;

 private:
  struct Impl;
  explicit Region(std::unique_ptr<Impl> state);
  static void run_bringup(Impl& impl);
  std::unique_ptr<Impl> impl_;
};

// The path a region of `engine_id` has in `shm_dir` (validates the id).
KVOFFLOAD_API std::filesystem::path region_path(const std::filesystem::path& shm_dir,
                                                const std::string& engine_id);
// The directory used when none is given: $KVOFFLOAD_SHM_DIR, else /dev/shm.
KVOFFLOAD_API std::filesystem::path default_shm_dir();

// A role of a region and the live process holding it (Note [Owners]).
struct RegionOwner {
  std::optional<std::uint32_t> rank;  // nullopt: the scheduler role (the unranked mapper)
  std::uint32_t pid = 0;              // 0: the holder has not recorded its PID yet
};

struct RegionInfo {
  std::filesystem::path path;
  std::string engine_id;
  std::uint64_t file_bytes = 0;
  std::uint32_t attached = 0;              // processes holding the shared lock (from /proc/locks)
  bool stale = false;                      // no holder
  bool complete = false;                   // header says the region finished creation
  std::optional<RegionGeometry> geometry;  // when the header is readable
  // Roles held now, ranks in order then the scheduler; seen in /proc/locks, never locked.
  std::vector<RegionOwner> owners;
  // Empty for a region file; otherwise why this entry, named like a region, is not one we could
  // read ("a FIFO, not a region file", "a directory, ...", "no region header ..."). Such entries
  // are listed, never opened for blocking reads or followed, and never removed by clean.
  std::string problem;
};

// Regions in `shm_dir`, counted without taking any lock. An entry that is not a readable region
// is listed with its `problem`; it never fails or stalls the listing.
KVOFFLOAD_API std::vector<RegionInfo> list_regions(const std::filesystem::path& shm_dir,
                                                   const Syscalls* syscalls = nullptr);

struct CleanResult {
  std::vector<std::filesystem::path> removed;
  std::vector<std::filesystem::path> kept;  // in use (or not ours to remove)
  struct Skipped {
    std::filesystem::path path;
    std::string reason;  // "a FIFO, not a region file", ...
  };
  std::vector<Skipped> skipped;  // named like a region but not one: left alone
};

// Removes stale regions (all, or only `engine_id`'s). Never removes a region in use, another
// user's file, or a newer file that replaced the one inspected.
KVOFFLOAD_API CleanResult clean_regions(const std::filesystem::path& shm_dir,
                                        const std::optional<std::string>& engine_id = std::nullopt,
                                        const Syscalls* syscalls = nullptr);

}  // namespace kvoffload
