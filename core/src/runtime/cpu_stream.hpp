#pragma once
// The in-order queue behind a CPU-side stream (the host backend's streams and the simulated
// device's): one worker thread runs the tasks in the order they were pushed; synchronize() waits
// for everything pushed before it; destruction drains the queue, then joins. The owner says what a
// task does (`execute`, called on the worker thread) and keeps the queue as its last member, so
// the worker stops before anything it uses is destroyed.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace kvoffload::detail {

template <typename Task>
class OrderedQueue {
 public:
  explicit OrderedQueue(std::function<void(Task&)> execute) : execute_(std::move(execute)) {
    worker_ = std::thread([this] { run(); });
  }
  OrderedQueue(const OrderedQueue&) = delete;
  OrderedQueue& operator=(const OrderedQueue&) = delete;
  ~OrderedQueue() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;  // the worker drains what is queued first
    }
    cv_.notify_all();
    worker_.join();
  }

  void push(Task task) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
      ++enqueued_;
    }
    cv_.notify_all();
  }

  // Waits until every task pushed before this call has run.
  void synchronize() {
    std::unique_lock lock(mutex_);
    const std::uint64_t ticket = enqueued_;
    idle_cv_.wait(lock, [&] { return finished_ >= ticket; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      execute_(task);
      lock.lock();
      ++finished_;
      idle_cv_.notify_all();
    }
  }

  std::function<void(Task&)> execute_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t finished_ = 0;
  bool stop_ = false;
  std::thread worker_;  // started in the constructor body, after every member above exists
};

}  // namespace kvoffload::detail
