#include "tier/file/io_pool.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <new>
#include <utility>

#include "util/log.hpp"

namespace kvoffload::detail {

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : alignment_(other.alignment_),
      data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    alignment_ = other.alignment_;
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

std::byte* AlignedBuffer::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return data_;
  void* p = nullptr;
  if (posix_memalign(&p, alignment_, bytes) != 0) throw std::bad_alloc();
  std::free(data_);
  data_ = static_cast<std::byte*>(p);
  capacity_ = bytes;
  return data_;
}

IoPool::IoPool(unsigned threads, unsigned read_threads, std::size_t alignment)
    : read_threads_(std::min(read_threads, threads)) {
  workers_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) workers_.push_back(IoWorker{AlignedBuffer(alignment)});
  threads_.reserve(threads);
  try {
    for (unsigned i = 0; i < threads; ++i) {
      const IoLane first = i < read_threads_ ? IoLane::kRead : IoLane::kWrite;
      threads_.emplace_back([this, i, first] { run(workers_[i], first); });
    }
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

IoPool::~IoPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void IoPool::submit(Task task, IoLane l) {
  {
    std::lock_guard lock(mutex_);
    lane(l).push_back(std::move(task));
  }
  cv_.notify_one();
}

void IoPool::submit_many(std::vector<Task>&& tasks, IoLane l) {
  if (tasks.empty()) return;
  {
    std::lock_guard lock(mutex_);
    auto& q = lane(l);
    for (auto& t : tasks) q.push_back(std::move(t));
  }
  cv_.notify_all();
}

void IoPool::run(IoWorker& worker, IoLane first) {
  std::deque<Task>& own = lane(first);
  std::deque<Task>& other = lane(first == IoLane::kRead ? IoLane::kWrite : IoLane::kRead);
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !own.empty() || !other.empty(); });
      // Drain before stopping: a queued task owns a batch slot that a waiter is counting on.
      std::deque<Task>& q = !own.empty() ? own : other;
      if (q.empty()) return;
      task = std::move(q.front());
      q.pop_front();
    }
    try {
      task(worker);
    } catch (const std::exception& e) {
      log().error("tier I/O task threw (a bug): {}", e.what());
    } catch (...) {
      log().error("tier I/O task threw a non-standard exception (a bug)");
    }
  }
}

}  // namespace kvoffload::detail
