#pragma once
// A bounded pool of I/O threads for the file tier. Each worker owns an aligned bounce buffer, so
// O_DIRECT transfers never allocate per item once the buffer has grown to the largest record.
//
// Two lanes (as vLLM's fs tier has two thread groups): reads (promotions, which a request is
// waiting for) and writes. `read_threads` workers take the read lane first, the others the write
// lane first; each takes from the other lane when its own is empty, so neither starves. With
// read_threads == 0 there is one queue, in submission order.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
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

enum class IoLane : std::uint8_t { kRead = 0, kWrite = 1 };

class IoPool {
 public:
  using Task = std::function<void(IoWorker&)>;

  // read_threads <= threads.
  IoPool(unsigned threads, unsigned read_threads, std::size_t alignment);
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;
  // Runs every task already queued, then joins the workers.
  ~IoPool();

  // Tasks must not throw (the tier catches inside them); a task that does is a bug and is logged.
  void submit(Task task, IoLane lane = IoLane::kWrite);
  void submit_many(std::vector<Task>&& tasks, IoLane lane = IoLane::kWrite);
  [[nodiscard]] unsigned threads() const noexcept { return static_cast<unsigned>(threads_.size()); }

 private:
  void run(IoWorker& worker, IoLane first);
  std::deque<Task>& lane(IoLane l) noexcept {
    // Without read threads both lanes are one queue, so the order of submission is kept.
    return read_threads_ == 0 || l == IoLane::kWrite ? writes_ : reads_;
  }

  unsigned read_threads_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> reads_;
  std::deque<Task> writes_;
  bool stopping_ = false;
  std::vector<IoWorker> workers_;
  std::vector<std::thread> threads_;
};

}  // namespace kvoffload::detail
