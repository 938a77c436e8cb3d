#pragma once
// Events with a GPU's semantics for the CPU-side streams of the host backend and of the simulated
// device: one Marker per record, and a wait binds to the record it saw (as cudaStreamWaitEvent
// does), so a later re-record of the same event never releases or delays an earlier wait.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace kvoffload::detail {

struct Marker {
  using Clock = std::chrono::steady_clock;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;  // the simulated device faulted before it: never done, waiters released
  Clock::time_point stamp{};

  void complete() {
    {
      std::lock_guard lock(mutex);
      done = true;
      stamp = Clock::now();
    }
    cv.notify_all();
  }
  void abandon() {
    {
      std::lock_guard lock(mutex);
      abandoned = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return done || abandoned; });
  }
  bool is_done() {
    std::lock_guard lock(mutex);
    return done;
  }
  Clock::time_point completed_at() {
    std::lock_guard lock(mutex);
    return stamp;
  }
};

struct CpuEvent {
  std::mutex mutex;
  std::shared_ptr<Marker> latest;  // null: never recorded (complete)
  bool timing = false;

  std::shared_ptr<Marker> current() {
    std::lock_guard lock(mutex);
    return latest;
  }
  // Starts a new record and returns its marker (completed by whoever runs the record).
  std::shared_ptr<Marker> record() {
    auto m = std::make_shared<Marker>();
    std::lock_guard lock(mutex);
    latest = m;
    return m;
  }
};

}  // namespace kvoffload::detail
