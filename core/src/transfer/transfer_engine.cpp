// The transfer engine. See Note [Engine ordering] below for how jobs, streams and events fit.
// Longer than ~500 lines for one idea: the job pipeline (submit, drain, wait, shutdown) of one Impl
// whose ordering and locks (Note [Engine ordering]) span all of it; calibration is calibrate.cpp.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <unordered_set>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "live/live_page.hpp"
#include "transfer/calibrate.hpp"
#include "transfer/planner.hpp"
#include "util/log.hpp"

namespace kvoffload {

// Note [Engine ordering]
// Each direction has one stream, one planner and a FIFO of in-flight jobs. submit() holds the
// direction's submit lock while it plans, enqueues (wait -> start event -> copies -> end event)
// and appends to the FIFO, so FIFO order is stream order. A job is finished when its end event has
// completed; since the stream is in order, only the FIFO head needs to be queried. A job whose
// enqueue failed part-way is failed, but it finishes only when the work already enqueued for it
// has: its end event is still recorded behind whatever made it onto the stream (or, if even that
// fails, submit synchronizes the stream), because a copy of a failed load still writes device
// blocks that the caller reuses as soon as it sees the result. Events come from a pool and return
// to it when a job is retired, so steady-state submission creates no events.
//
// Note [Job timing]
// A timing event costs more to record than one created with cudaEventDisableTiming (it writes a
// timestamp), and a job's copy time is only worth it when something reads it: JobResult::seconds
// (vLLM's transfer_time, `kvoffload run`'s rates) and the live page's copy time. So the events
// come from two pools: timing events, used only for a job's start and end when
// EngineOptions::job_timing is on, and plain ones (blocking sync, timing disabled) for the end of
// an untimed job and for the event a job records on the caller's stream to wait for it. An
// untimed job records only its end event.
//
// Note [Host segments]
// The copy kernel addresses host memory through the device address of its registration. With
// unified addressing (CUDA) that is the host address; on ROCm every registration call may map
// its piece anywhere on the device, so the engine keeps one segment per registered piece (host
// range, device-minus-host offset): from its own registration's pieces, or from the pieces the
// bring-up registered and told it about. A kernel batch translates each copy through its own
// segment and is split where a copy crosses into the next one. (Before, pieces with different
// offsets kept the kernel path off for good.)
//
// Note [Capturing streams]
// A job waits for the caller's stream by recording an event on it and making the lane wait for
// that event. If the stream is capturing a CUDA graph, the record is a node of the capture, and
// CUDA's cross-stream rule pulls the lane into the capture at the wait: the job's copies become
// graph nodes that never run, and the caller's capture fails at its end (unjoined). So a submit
// that waits on a capturing stream is refused before anything is enqueued. A job that waits on
// an event recorded during a capture is found out after the wait (the lane now captures) and
// failed; the caller's capture is lost by then, which the message says. Until that capture ends
// the lane captures too, so later submits on it are refused; once it ends the lane runs again.

struct TransferEngine::Impl {
  struct Inflight {
    JobId id{};
    std::uint64_t bytes = 0;
    Event start;
    Event end;
    bool failed = false;
    bool end_pending = false;  // failed, but work enqueued for it may still run until `end`
    std::string error;
  };
  struct Lane {
    Direction direction;
    Stream stream;
    std::optional<detail::Planner> planner;
    PathPolicy policy;
    std::mutex submit_mutex;             // planner, enqueue order
    std::deque<Inflight> inflight;       // guarded by state_mutex
    detail::TransferDirection counts{};  // guarded by state_mutex; mirrored to the live page
  };

  Impl(DeviceRuntime& rt, KvLayout l, EngineOptions o)
      : runtime(rt), layout(std::move(l)), options(o) {
    layout.validate();
    lanes[0].direction = Direction::kStore;
    lanes[1].direction = Direction::kLoad;
    lanes[0].policy = options.store_policy;
    lanes[1].policy = options.load_policy;
    for (Lane& lane : lanes) {
      lane.planner.emplace(layout);
      lane.stream = runtime.create_stream();
    }
    if (options.register_host) {
      try {
        registration = runtime.register_host(layout.host.base, layout.host.buffer_bytes,
                                             layout.host.row_stride);
        add_segments(segments, registration);
        log().info("transfer engine: registered {} bytes of host memory with the {} runtime",
                   layout.host.buffer_bytes, runtime.name());
      } catch (const Error& e) {
        log().warn(
            "transfer engine: host registration failed ({}); using the slower DMA-only path, "
            "the copy kernel is disabled",
            e.what());
      }
    }
  }

  ~Impl() { shutdown(); }

  Lane& lane(Direction d) { return lanes[d == Direction::kStore ? 0 : 1]; }

  [[nodiscard]] bool kernel_allowed() const noexcept {
    return options.allow_kernel && runtime.supports_kernel_path() &&
           (static_cast<bool>(registration) || pieces_cover.load(std::memory_order_acquire));
  }
  // The segments of the registered host buffer (kernel_allowed() holds): Note [Host segments].
  [[nodiscard]] std::span<const detail::HostSegment> host_segments() const noexcept {
    return segments;  // written before pieces_cover was set, never after
  }

  // Appends `reg`'s pieces as segments, merging neighbours with the same offset.
  static void add_segments(std::vector<detail::HostSegment>& out, const HostRegistration& reg) {
    const auto* host = static_cast<const std::byte*>(reg.host_base());
    for (const DeviceSegment& s : reg.segments()) {
      const std::byte* h = host + s.offset;
      const std::ptrdiff_t delta = static_cast<const std::byte*>(s.device) - h;
      if (!out.empty() && out.back().host + out.back().bytes == h && out.back().delta == delta) {
        out.back().bytes += s.bytes;
      } else {
        out.push_back(detail::HostSegment{h, s.bytes, delta});
      }
    }
  }

  void note_piece(const HostRegistration& piece) {
    const auto* base = static_cast<const std::byte*>(layout.host.base);
    const auto* p = static_cast<const std::byte*>(piece.host_base());
    if (!piece || p < base || p + piece.bytes() > base + layout.host.buffer_bytes) {
      throw_invalid(
          "transfer engine: note_host_registration: the piece is not inside the engine's host "
          "buffer");
    }
    std::lock_guard lock(pieces_mu);
    if (pieces_cover.load(std::memory_order_relaxed) || !piece_bases.insert(p).second)
      throw_invalid("transfer engine: note_host_registration: piece told twice");
    add_segments(pending_segments, piece);  // copied now: the caller may move its pieces
    piece_bytes += piece.bytes();
    if (piece_bytes < layout.host.buffer_bytes) return;
    // The pieces cover the buffer: their segments, in address order, become the kernel path's.
    std::sort(
        pending_segments.begin(), pending_segments.end(),
        [](const detail::HostSegment& a, const detail::HostSegment& b) { return a.host < b.host; });
    for (const detail::HostSegment& seg : pending_segments) {
      if (!segments.empty() && segments.back().host + segments.back().bytes == seg.host &&
          segments.back().delta == seg.delta) {
        segments.back().bytes += seg.bytes;
      } else {
        segments.push_back(seg);
      }
    }
    pending_segments.clear();
    pieces_cover.store(true, std::memory_order_release);
  }

  // Needs state_mutex.
  // Needs state_mutex. Note [Job timing].
  Event take_event(bool timing) {
    std::vector<Event>& pool = timing ? timing_events : plain_events;
    if (!pool.empty()) {
      Event e = std::move(pool.back());
      pool.pop_back();
      return e;
    }
    return runtime.create_event(timing);
  }
  void give_event(Event&& e, bool timing) {
    if (e) (timing ? timing_events : plain_events).push_back(std::move(e));
  }

  void submit(JobId id, Direction direction, const TransferSpec& spec, WaitOn wait_on) {
    refuse_capturing_wait(id, wait_on);
    Lane& ln = lane(direction);
    std::lock_guard submit_lock(ln.submit_mutex);
    refuse_captured_lane(id, direction, ln);
    {
      std::lock_guard lock(state_mutex);
      if (closed) throw Error(ErrorCode::kState, "transfer engine: submit after shutdown");
      if (!ids.insert(static_cast<std::uint64_t>(id)).second) {
        throw_invalid("transfer engine: duplicate job id " +
                      std::to_string(static_cast<std::uint64_t>(id)) +
                      " (a job with this id is in flight or its result was not collected)");
      }
    }
    detail::Plan plan;
    try {
      plan = ln.planner->plan(direction, spec);
    } catch (...) {
      std::lock_guard lock(state_mutex);
      ids.erase(static_cast<std::uint64_t>(id));
      throw;
    }
    const CopyPath path = detail::choose_path(ln.policy, plan, kernel_allowed());
    if (path == CopyPath::kKernel) {
      // Kernels address host memory through the registration's device pointers.
      ln.planner->shift_host_side(plan, direction, host_segments());
    }

    Inflight job;
    job.id = id;
    job.bytes = plan.bytes;
    Event wait_event;
    {
      std::lock_guard lock(state_mutex);
      if (options.job_timing) job.start = take_event(/*timing=*/true);
      job.end = take_event(options.job_timing);
      if (wait_on.kind() == WaitOn::Kind::kStream) wait_event = take_event(/*timing=*/false);
      ++stats.jobs_submitted;
      ++ln.counts.submitted;
      publish_live(ln);
      stats.fragments += plan.fragments;
      stats.descriptors += plan.copies.size();
      stats.last_descriptors = plan.copies.size();
      ++(path == CopyPath::kKernel ? stats.kernel_batches : stats.dma_batches);
    }
    enqueue_job(job, ln, direction, plan, path, wait_on, wait_event);
    std::lock_guard lock(state_mutex);
    // The wait event may be reused as soon as the wait is enqueued: a later record starts a new
    // generation, and the stream's wait is bound to the one recorded here.
    give_event(std::move(wait_event), /*timing=*/false);
    if (job.failed) {
      give_event(std::move(job.start), /*timing=*/true);
      if (!job.end_pending) give_event(std::move(job.end), options.job_timing);
    }
    ln.inflight.push_back(std::move(job));
  }

  // A job may not wait on a stream that is capturing a graph (Note [Capturing streams]).
  void refuse_capturing_wait(JobId id, const WaitOn& wait_on) {
    if (wait_on.kind() == WaitOn::Kind::kStream &&
        runtime.stream_capturing(wait_on.stream_view())) {
      throw Error(
          ErrorCode::kState,
          fmt::format("transfer engine: job {} would wait on stream {:#x}, which is capturing a "
                      "graph: its copies would become nodes of that capture and never run, and "
                      "the capture would fail unjoined. Submit after the capture ends (Note "
                      "[Capturing streams])",
                      static_cast<std::uint64_t>(id), wait_on.stream_view().native()),
          0, "stream_capturing");
    }
  }

  // Nor run on a lane whose stream an earlier job's wait pulled into a capture that still runs.
  // Needs the lane's submit_mutex.
  void refuse_captured_lane(JobId id, Direction direction, Lane& ln) {
    if (runtime.stream_capturing(ln.stream.view())) {
      // Pulled into a caller's capture by an earlier job's wait, and that capture still runs.
      throw Error(ErrorCode::kState,
                  fmt::format("transfer engine: job {} refused: the {} lane's stream is part of a "
                              "graph capture it was pulled into (an earlier job waited on an "
                              "event recorded during that capture), so its copies would become "
                              "graph nodes that never run. Submit after the capture ends (Note "
                              "[Capturing streams])",
                              static_cast<std::uint64_t>(id), to_string(direction)),
                  0, "stream_capturing");
    }
  }

  // Enqueues the job's wait, its copies and its events on the lane's stream. A failure marks the
  // job failed; copies enqueued before it still run, and the job finishes after them.
  void enqueue_job(Inflight& job, Lane& ln, Direction direction, const detail::Plan& plan,
                   CopyPath path, const WaitOn& wait_on, const Event& wait_event) {
    const JobId id = job.id;
    try {
      const StreamView s = ln.stream.view();
      switch (wait_on.kind()) {
        case WaitOn::Kind::kNothing:
          break;
        case WaitOn::Kind::kStream:
          runtime.record_event(wait_event.view(), wait_on.stream_view());
          runtime.wait_event(s, wait_event.view());
          break;
        case WaitOn::Kind::kEvent:
          runtime.wait_event(s, wait_on.event_view());
          if (runtime.stream_capturing(s)) {
            throw Error(ErrorCode::kState,
                        "the event it waits on was recorded during a graph capture: the engine's "
                        "lane joined that capture (which will now fail unjoined); record the "
                        "event outside the capture (Note [Capturing streams])",
                        0, "stream_capturing");
          }
          break;
      }
      if (job.start) runtime.record_event(job.start.view(), s);
      runtime.enqueue_copies(
          s, plan.copies,
          direction == Direction::kStore ? CopyKind::kDeviceToHost : CopyKind::kHostToDevice, path);
      runtime.record_event(job.end.view(), s);
    } catch (const std::exception& e) {
      job.failed = true;
      job.error = e.what();
      log().error("transfer engine: {} job {} failed at submission: {}", to_string(direction),
                  static_cast<std::uint64_t>(id), e.what());
      // Copies enqueued before the failure still run: the job finishes after them.
      try {
        runtime.record_event(job.end.view(), ln.stream.view());
        job.end_pending = true;
      } catch (const std::exception&) {
        try {
          runtime.synchronize_stream(ln.stream.view());
        } catch (const std::exception& sync_error) {
          log().error("transfer engine: {} stream unusable after job {} failed: {}",
                      to_string(direction), static_cast<std::uint64_t>(id), sync_error.what());
        }
      }
    }
  }

  // Mirrors a lane's counters into the rank's live page (Note [Live stats]): a few relaxed stores.
  // Needs state_mutex (the engine is the block's only writer, one thread at a time).
  void publish_live(Lane& ln) noexcept {
    if (live == nullptr) return;
    using W = detail::LiveWrite;
    const W write(live->seq);
    detail::TransferDirection& d = ln.direction == Direction::kStore ? live->store : live->load;
    W::put(d.submitted, ln.counts.submitted);
    W::put(d.succeeded, ln.counts.succeeded);
    W::put(d.failed, ln.counts.failed);
    W::put(d.bytes, ln.counts.bytes);
    W::put(d.copy_ns, ln.counts.copy_ns);
    W::put(live->host_registered,
           static_cast<bool>(registration) || pieces_cover.load(std::memory_order_relaxed) ? 1 : 0);
  }

  // Starts publishing into `block` (the rank's transfer block of its region's page).
  void attach_live(detail::RankTransferBlock& block) {
    std::lock_guard lock(state_mutex);
    live = &block;
    {
      // A new engine on this rank (a restarted rank) starts its counters from zero.
      const detail::LiveWrite write(block.seq);
      detail::LiveWrite::put(block.pid, static_cast<std::uint64_t>(::getpid()));
      detail::LiveWrite::put(block.attached_unix_ns, detail::unix_now_ns());
      detail::LiveWrite::put(block.detached_unix_ns, 0);
    }
    for (Lane& ln : lanes) publish_live(ln);
  }

  // Moves finished FIFO heads into `completed`. Needs state_mutex.
  void drain() {
    for (Lane& ln : lanes) {
      const std::uint64_t finished_before = ln.counts.succeeded + ln.counts.failed;
      while (!ln.inflight.empty()) {
        Inflight& head = ln.inflight.front();
        JobResult r;
        r.job_id = head.id;
        r.direction = ln.direction;
        r.bytes = head.bytes;
        if (head.failed) {
          if (head.end_pending) {
            try {
              if (!runtime.query_event(head.end.view())) break;  // its enqueued copies still run
            } catch (const std::exception&) {
              // the stream failed after the job: nothing of it runs any more
            }
          }
          r.error = head.error;
        } else {
          try {
            if (!runtime.query_event(head.end.view())) break;
            r.success = true;
            if (head.start) {  // timed (Note [Job timing])
              try {
                r.seconds = runtime.elapsed_seconds(head.start.view(), head.end.view());
              } catch (const Error&) {
                r.seconds = 0.0;  // timing is informative; a missing figure never fails a job
              }
            }
          } catch (const std::exception& e) {
            r.error = e.what();
            log().error("transfer engine: {} job {} failed: {}", to_string(ln.direction),
                        static_cast<std::uint64_t>(head.id), e.what());
          }
        }
        if (r.success) {
          ++stats.jobs_succeeded;
          stats.bytes_succeeded += r.bytes;
          ++ln.counts.succeeded;
          ln.counts.bytes += r.bytes;
          ln.counts.copy_ns += static_cast<std::uint64_t>(r.seconds * 1e9);
        } else {
          ++stats.jobs_failed;
          ++ln.counts.failed;
        }
        give_event(std::move(head.start), /*timing=*/true);
        give_event(std::move(head.end), options.job_timing);
        ln.inflight.pop_front();
        completed.push_back(std::move(r));
      }
      if (ln.counts.succeeded + ln.counts.failed != finished_before) publish_live(ln);
    }
  }

  std::vector<JobResult> poll() {
    std::lock_guard lock(state_mutex);
    drain();
    std::vector<JobResult> out = std::move(completed);
    completed.clear();
    for (const JobResult& r : out) ids.erase(static_cast<std::uint64_t>(r.job_id));
    return out;
  }

  // Blocks until `lane_to_wait()` returns -1, synchronizing meanwhile on the head of the lane it
  // names (the lane holding a job still waited for: blocking on the other lane could wait for a
  // job that depends on something the caller has not released yet). Needs `lock` held; releases
  // it while blocking.
  template <typename LaneToWait>
  void block_until(std::unique_lock<std::mutex>& lock, LaneToWait lane_to_wait) {
    for (;;) {
      drain();
      const int l = lane_to_wait();
      if (l < 0) return;
      Lane& ln = lanes[l];
      if (ln.inflight.empty() || (ln.inflight.front().failed && !ln.inflight.front().end_pending)) {
        continue;  // drain() retires it
      }
      const EventView head = ln.inflight.front().end.view();
      ++waiters;
      lock.unlock();
      try {
        runtime.synchronize_event(head);
      } catch (const std::exception&) {
        // Reported through query_event in drain().
      }
      lock.lock();
      if (--waiters == 0) waiters_cv.notify_all();
    }
  }

  std::vector<JobResult> wait(std::span<const JobId> wanted) {
    std::unique_lock lock(state_mutex);
    for (JobId id : wanted) {
      if (!ids.contains(static_cast<std::uint64_t>(id))) {
        throw Error(ErrorCode::kNotFound,
                    "transfer engine: job " + std::to_string(static_cast<std::uint64_t>(id)) +
                        " is not pending (never submitted or already collected)");
      }
    }
    auto find_done = [&](JobId id) {
      return std::find_if(completed.begin(), completed.end(),
                          [&](const JobResult& r) { return r.job_id == id; });
    };
    block_until(lock, [&]() -> int {
      for (JobId id : wanted) {
        // An id collected meanwhile by another thread's poll() is no longer waited for.
        if (!ids.contains(static_cast<std::uint64_t>(id)) || find_done(id) != completed.end())
          continue;
        for (int l = 0; l < 2; ++l) {
          for (const Inflight& job : lanes[l].inflight) {
            if (job.id == id) return l;
          }
        }
      }
      return -1;
    });
    std::vector<JobResult> out;
    out.reserve(wanted.size());
    for (JobId id : wanted) {
      auto it = find_done(id);
      if (it == completed.end()) continue;  // listed twice: already moved out
      out.push_back(std::move(*it));
      completed.erase(it);
      ids.erase(static_cast<std::uint64_t>(id));
    }
    return out;
  }

  std::vector<JobResult> wait_all() {
    std::unique_lock lock(state_mutex);
    block_until(lock, [&]() -> int {
      if (!lanes[0].inflight.empty()) return 0;
      return lanes[1].inflight.empty() ? -1 : 1;
    });
    std::vector<JobResult> out = std::move(completed);
    completed.clear();
    for (const JobResult& r : out) ids.erase(static_cast<std::uint64_t>(r.job_id));
    return out;
  }

  void shutdown() noexcept {
    // No submit is in progress once both submit locks are held; later submits see `closed`.
    {
      std::scoped_lock submit_locks(lanes[0].submit_mutex, lanes[1].submit_mutex);
      std::lock_guard lock(state_mutex);
      if (closed) return;
      closed = true;
    }
    for (Lane& ln : lanes) {
      try {
        if (ln.stream) runtime.synchronize_stream(ln.stream.view());
      } catch (const std::exception& e) {
        log().error("transfer engine: draining the {} stream failed: {}", to_string(ln.direction),
                    e.what());
      }
    }
    std::unique_lock lock(state_mutex);
    waiters_cv.wait(lock, [&] { return waiters == 0; });
    try {
      drain();  // every end event has completed (or failed): results stay for poll()
    } catch (const std::exception& e) {
      log().error("transfer engine: collecting results at shutdown failed: {}", e.what());
    }
    for (Lane& ln : lanes) {
      for (Inflight& job : ln.inflight) {  // only after a failed drain: report, never complete
        JobResult r{job.id,    ln.direction, false,
                    job.bytes, 0.0,          "transfer engine shut down before the job finished"};
        completed.push_back(std::move(r));
      }
      if (!ln.inflight.empty()) {
        ln.counts.failed += ln.inflight.size();
        publish_live(ln);
      }
      ln.inflight.clear();
    }
    // The page is in the region's mapping, which may go right after this (the region's teardown
    // hook runs shutdown before munmap): nothing is published any more.
    if (live != nullptr) {
      const detail::LiveWrite write(live->seq);
      detail::LiveWrite::put(live->detached_unix_ns, detail::unix_now_ns());
    }
    live = nullptr;
    // Release order: events, then streams, then the host registration (no copy can touch host
    // memory any more), all before a Region unmaps.
    timing_events.clear();
    plain_events.clear();
    for (Lane& ln : lanes) ln.stream.reset();
    if (registration && !registration.reset()) {
      log().error("transfer engine: unregistering host memory failed (see above)");
    }
  }

  DeviceRuntime& runtime;
  KvLayout layout;
  EngineOptions options;
  HostRegistration registration;
  // Pieces registered by the caller (note_host_registration), not owned.
  std::mutex pieces_mu;
  std::set<const std::byte*> piece_bases;
  std::vector<detail::HostSegment> pending_segments;  // until the pieces cover the buffer
  std::uint64_t piece_bytes = 0;
  std::atomic<bool> pieces_cover{false};
  std::vector<detail::HostSegment> segments;  // Note [Host segments]
  Lane lanes[2];

  mutable std::mutex state_mutex;
  std::condition_variable waiters_cv;
  int waiters = 0;
  bool closed = false;
  std::unordered_set<std::uint64_t> ids;  // in flight or uncollected
  std::vector<JobResult> completed;
  std::vector<Event> timing_events;  // Note [Job timing]
  std::vector<Event> plain_events;
  EngineStats stats;
  detail::RankTransferBlock* live = nullptr;  // guarded by state_mutex; null: not publishing
};

// ---- calibration (the measuring: transfer/calibrate.cpp) ----

CalibrationReport TransferEngine::calibrate() {
  Impl& im = *impl_;
  CalibrationReport report;
  report.store_policy = im.lanes[0].policy;
  report.load_policy = im.lanes[1].policy;
  if (!im.kernel_allowed()) {
    log().info("transfer engine: calibration skipped: the kernel path is not available");
    return report;
  }
  // Applied after each direction is measured, under that lane's submit lock.
  const auto apply = [&im](Direction d, std::uint64_t threshold) {
    std::lock_guard lock(im.lane(d).submit_mutex);
    im.lane(d).policy.kernel_below_bytes = threshold;
    log().info("transfer engine: calibrated {}: kernel for mean pieces below {} bytes",
               to_string(d), threshold);
  };
  detail::calibrate_paths(im.runtime, im.options.calibration_bytes, report, apply);
  report.store_policy = im.lanes[0].policy;
  report.load_policy = im.lanes[1].policy;
  report.ran = true;
  return report;
}

// ---- public wrappers ----

TransferEngine::TransferEngine(DeviceRuntime& runtime, KvLayout layout, EngineOptions options)
    : impl_(std::make_shared<Impl>(runtime, std::move(layout), options)) {
  if (options.calibrate) calibrate();
}

TransferEngine::TransferEngine(DeviceRuntime& runtime, Region& region, std::uint32_t rank,
                               std::vector<KvGroup> groups, std::uint32_t blocks_per_chunk,
                               EngineOptions options) {
  KvLayout layout;
  layout.groups = std::move(groups);
  layout.blocks_per_chunk = blocks_per_chunk;
  layout.host = HostSlots::from_region(region, rank);
  impl_ = std::make_shared<Impl>(runtime, std::move(layout), options);
  if (options.live_stats) impl_->attach_live(detail::live_page_of(region)->ranks()[rank].transfer);
  // The region may close before the engine is destroyed: its close() then shuts the engine down
  // (drain, unregister) before munmap. A weak pointer: a destroyed engine needs nothing.
  region.add_teardown_hook([weak = std::weak_ptr<Impl>(impl_)] {
    if (auto impl = weak.lock()) impl->shutdown();
  });
  if (options.calibrate) calibrate();
}

TransferEngine::TransferEngine(TransferEngine&&) noexcept = default;
TransferEngine& TransferEngine::operator=(TransferEngine&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->shutdown();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
TransferEngine::~TransferEngine() {
  if (impl_) impl_->shutdown();
}

namespace {
TransferEngine::Impl& need(const std::shared_ptr<TransferEngine::Impl>& impl) {
  if (!impl) throw Error(ErrorCode::kState, "transfer engine: moved-from engine");
  return *impl;
}
}  // namespace

void TransferEngine::note_host_registration(const HostRegistration& piece) {
  need(impl_).note_piece(piece);
}
void TransferEngine::submit(JobId job_id, Direction direction, const TransferSpec& spec,
                            WaitOn wait_on) {
  need(impl_).submit(job_id, direction, spec, wait_on);
}
std::vector<JobResult> TransferEngine::poll() {
  return need(impl_).poll();
}
std::vector<JobResult> TransferEngine::wait(std::span<const JobId> ids) {
  return need(impl_).wait(ids);
}
std::vector<JobResult> TransferEngine::wait_all() {
  return need(impl_).wait_all();
}
void TransferEngine::shutdown() noexcept {
  if (impl_) impl_->shutdown();
}
EngineStats TransferEngine::stats() const {
  Impl& im = need(impl_);
  std::lock_guard lock(im.state_mutex);
  EngineStats s = im.stats;
  s.host_registered = static_cast<bool>(im.registration) || im.pieces_cover.load();
  return s;
}
bool TransferEngine::host_registered() const {
  return stats().host_registered;
}
const KvLayout& TransferEngine::layout() const {
  return need(impl_).layout;
}
PathPolicy TransferEngine::policy(Direction direction) const {
  Impl& im = need(impl_);
  std::lock_guard lock(im.lane(direction).submit_mutex);
  return im.lane(direction).policy;
}

}  // namespace kvoffload
