#pragma once
// A bounded pool of I/O threads for the file tier. Each worker owns an aligned bounce buffer, so
// O_DIRECT transfers never allocate per item once the buffer has grown to the largest record.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvoffload::detail {

// Move-only page-aligned buffer (posix_memalign), grown on demand and never shrunk.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t alignment) noexcept : alignment_(alignment) {}
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  // At least `bytes` bytes; contents are not preserved across growth. Throws std::bad_alloc.
  std::byte* reserve(std::size_t bytes);
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t alignment_;
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
};

struct IoWorker {
  AlignedBuffer bounce;
};

class IoPool {
 public:
  using Task = std::function<void(IoWorker&)>;

  IoPool(unsigned threads, std::size_t alignment);
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;
  // Runs every task already queued, then joins the workers.
  ~IoPool();

  // Tasks must not throw (the tier catches inside them); a task that does is a bug and is logged.
  void submit(Task task);
  void submit_many(std::vector<Task>&& tasks);
  [[nodiscard]] unsigned threads() const noexcept { return static_cast<unsigned>(threads_.size()); }

 private:
  void run(IoWorker& worker);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::vector<IoWorker> workers_;
  std::vector<std::thread> threads_;
};

}  // namespace kvoffload::detail
