#pragma once
// TransferEngine: moves KV blocks between device caches and this rank's host slots, asynchronously
// and stream-ordered (docs/DESIGN.md §5).
//
//   auto rt = kvoffload::make_runtime("auto");
//   kvoffload::TransferEngine engine(*rt, layout);            // or (rt, region, rank, groups, bpc)
//   engine.submit(JobId{7}, Direction::kStore, spec,
//   WaitOn::stream(StreamView::from_native(torch_stream))); for (const JobResult& r :
//   engine.poll()) { ... r.success ... }
//
// - submit() plans the job (validation, coalescing, path choice) on the caller's thread, makes the
//   direction's stream wait for `wait_on` (the engine's compute stream or an event), enqueues the
//   copies and returns. Stores (D2H) and loads (H2D) use separate streams and overlap; jobs of one
//   direction complete in submission order.
// - A job whose copy fails (at enqueue or asynchronously) completes as a failed result with the
//   error message, never as a success; later jobs still run.
// - A job id is refused (kInvalidArgument) while a job with that id is in flight or its result has
//   not been collected by poll()/wait(); afterwards it may be reused.
// - Host registration: the engine registers the whole host buffer once. If that fails it logs one
//   warning and uses DMA only (the kernel path never touches unregistered memory).
// - shutdown() (also run by the destructor, and by the Region's teardown hook when the engine was
//   built on a Region) refuses new jobs, drains both streams, keeps the results for poll(), then
//   releases events, streams and finally the host registration.
// The DeviceRuntime must outlive the engine. submit/poll/wait may be called from any threads.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/export.h>
#include <kvoffload/kv_layout.hpp>

namespace kvoffload {

class Region;

enum class JobId : std::uint64_t {};

struct JobResult {
  JobId job_id{};
  Direction direction = Direction::kStore;
  bool success = false;
  std::uint64_t bytes = 0;  // bytes the job copies (planned), also set for failed jobs
  // Copy time on the stream (after the wait); 0 when failed, and 0 without
  // EngineOptions::job_timing (not measured).
  double seconds = 0.0;
  std::string error;  // empty on success
};

// What a job waits for before its copies start.
class KVOFFLOAD_API WaitOn {
 public:
  constexpr WaitOn() noexcept = default;
  static constexpr WaitOn nothing() noexcept { return {}; }
  // Everything enqueued on `stream` so far (an event is recorded on it at submit).
  static constexpr WaitOn stream(StreamView s) noexcept {
    return WaitOn(Kind::kStream, s.native());
  }
  static constexpr WaitOn event(EventView e) noexcept { return WaitOn(Kind::kEvent, e.native()); }

  enum class Kind : std::uint8_t { kNothing, kStream, kEvent };
  [[nodiscard]] constexpr Kind kind() const noexcept { return kind_; }
  [[nodiscard]] constexpr StreamView stream_view() const noexcept {
    return StreamView::from_native(handle_);
  }
  [[nodiscard]] constexpr EventView event_view() const noexcept {
    return EventView::from_native(handle_);
  }

 private:
  constexpr WaitOn(Kind kind, std::uintptr_t handle) noexcept : kind_(kind), handle_(handle) {}
  Kind kind_ = Kind::kNothing;
  std::uintptr_t handle_ = 0;
};

// Path choice for one batch (after coalescing): kernel when at least kernel_min_count pieces of
// mean size below kernel_below_bytes, and only on registered host memory.
struct PathPolicy {
  std::uint64_t kernel_below_bytes = 32 * 1024;
  std::uint64_t kernel_min_count = 16;
};

struct EngineOptions {
  bool register_host = true;  // register the host buffer (needed for the kernel path)
  bool allow_kernel = true;   // false: DMA only
  PathPolicy store_policy{};
  PathPolicy load_policy{};
  // Engines built on a Region: mirror this rank's job counts, bytes and copy time into the
  // region's live statistics page (Note [Live stats] in core/src/live/live_page.hpp), a few
  // relaxed stores per submitted and per finished job.
  bool live_stats = true;
  // Measure each job's copy time (JobResult::seconds, the live page's copy time): two timing
  // events recorded around its copies. false: nothing reads the timings, so no timing event is
  // recorded; each job records one event (its end), created with cudaEventDisableTiming, and
  // seconds stays 0 (Note [Job timing] in transfer_engine.cpp).
  bool job_timing = true;
  bool calibrate = false;                        // run calibrate() in the constructor
  std::uint64_t calibration_bytes = 8ull << 20;  // bytes moved per measurement (>= 256 KiB)
};

struct EngineStats {
  std::uint64_t jobs_submitted = 0;
  std::uint64_t jobs_succeeded = 0;
  std::uint64_t jobs_failed = 0;
  std::uint64_t bytes_succeeded = 0;
  std::uint64_t dma_batches = 0;
  std::uint64_t kernel_batches = 0;
  std::uint64_t fragments = 0;         // (block, tensor) pieces planned
  std::uint64_t descriptors = 0;       // copies after coalescing
  std::uint64_t last_descriptors = 0;  // of the most recent job
  bool host_registered = false;
};

struct CalibrationPoint {
  Direction direction;
  std::uint64_t fragment_bytes;
  std::uint64_t count;
  double dma_gbps;
  double kernel_gbps;
};

struct CalibrationReport {
  std::vector<CalibrationPoint> points;
  PathPolicy store_policy;  // what the engine uses now
  PathPolicy load_policy;
  bool ran = false;  // false when the kernel path is unavailable (nothing to compare)
};

class KVOFFLOAD_API TransferEngine {
 public:
  // Host slots from layout.host (any host buffer). Validates the layout.
  TransferEngine(DeviceRuntime& runtime, KvLayout layout, EngineOptions options = {});
  // Host slots of `rank` in `region` (ranked or replicated). Registers the whole region data and
  // adds a teardown hook so the region's close() shuts the engine down (unregister before munmap).
  TransferEngine(DeviceRuntime& runtime, Region& region, std::uint32_t rank,
                 std::vector<KvGroup> groups, std::uint32_t blocks_per_chunk,
                 EngineOptions options = {});
  TransferEngine(TransferEngine&&) noexcept;
  TransferEngine& operator=(TransferEngine&&) noexcept;
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;
  ~TransferEngine();

  // Throws kInvalidArgument (bad spec or duplicate id; nothing enqueued), kState after shutdown.
  void submit(JobId job_id, Direction direction, const TransferSpec& spec, WaitOn wait_on = {});

  // Results of every job finished since the last poll (in completion order per direction).
  std::vector<JobResult> poll();
  // Blocks until every listed job finished; returns their results in the order given. Throws
  // kNotFound for an id that is not pending (never submitted, or already collected).
  std::vector<JobResult> wait(std::span<const JobId> ids);
  // Blocks until every submitted job finished; returns all uncollected results.
  std::vector<JobResult> wait_all();

  // Measures DMA and kernel bandwidth for fragment sizes 4 KiB..256 KiB in both directions on
  // scratch buffers, and sets each direction's kernel_below_bytes to the smallest size at which DMA
  // is at least as fast. Needs the kernel path (registered host memory); otherwise ran = false.
  CalibrationReport calibrate();

  // Progressive bring-up (RegionOptions::bringup): the caller registers the host buffer piece by
  // piece (EngineOptions::register_host = false) and tells the engine about each piece here. The
  // caller keeps the pieces registered until the engine has shut down (a region teardown hook
  // added before the engine's runs after it). Once the pieces cover the whole host buffer with one
  // device-minus-host offset, the kernel path opens; until then jobs use DMA. Throws
  // kInvalidArgument for a piece outside the host buffer or one told twice.
  void note_host_registration(const HostRegistration& piece);

  void shutdown() noexcept;

  [[nodiscard]] EngineStats stats() const;
  [[nodiscard]] bool host_registered() const;
  [[nodiscard]] const KvLayout& layout() const;
  [[nodiscard]] PathPolicy policy(Direction direction) const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvoffload
