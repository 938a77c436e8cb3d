// The host backend: "device" memory is host memory, a stream is one worker thread draining an
// ordered queue, an event completes when its stream's worker passes it, and copies are memcpy,
// split over a small helper pool for large batches. It is the test double for everything above
// the DeviceRuntime interface and a real fallback, so it keeps the GPU rules that matter: the
// kernel path refuses host memory that is not registered (a GPU would fault there).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include <kvoffload/error.hpp>

#include "runtime/backend_factories.hpp"
#include "runtime/cpu_event.hpp"
#include "runtime/cpu_stream.hpp"
#include "util/log.hpp"

namespace kvoffload::detail {
namespace {

// Splitting costs a wake-up of each helper (microseconds idle, a time slice on a loaded machine),
// so only batches that take a millisecond or more on one thread are split.
constexpr std::uint64_t kDefaultSplitMinBytes = 8ULL << 20;
constexpr std::size_t kDeviceAlign = 4096;

// Splits a batch's bytes into parts that several threads copy. Part boundaries are computed from
// the batch's prefix sums, so no part allocates and every byte is copied exactly once.
struct PoolJob {
  const CopyDescriptor* descs = nullptr;
  const std::uint64_t* ends = nullptr;  // ends[i] = bytes of descs[0..i]
  std::size_t count = 0;
  std::uint64_t total = 0;
  unsigned parts = 1;
  unsigned next = 0;  // guarded by the pool mutex
  unsigned done = 0;  // guarded by the pool mutex

  [[nodiscard]] std::uint64_t boundary(unsigned k) const noexcept {
    if (k >= parts) return total;
    // Cache-line aligned so two threads never write the same line.
    return (total / parts * k) & ~std::uint64_t{63};
  }

  void copy_part(unsigned k) const noexcept {
    const std::uint64_t begin = boundary(k);
    const std::uint64_t end = boundary(k + 1);
    if (begin >= end) return;
    std::size_t i = static_cast<std::size_t>(std::upper_bound(ends, ends + count, begin) - ends);
    std::uint64_t pos = begin;
    while (pos < end && i < count) {
      const std::uint64_t desc_begin = ends[i] - descs[i].bytes;
      const std::uint64_t off = pos - desc_begin;
      const std::uint64_t n = std::min(ends[i], end) - pos;
      std::memcpy(static_cast<std::byte*>(descs[i].dst) + off,
                  static_cast<const std::byte*>(descs[i].src) + off, n);
      pos += n;
      ++i;
    }
  }
};

class CopyPool {
 public:
  explicit CopyPool(unsigned helpers) {
    threads_.reserve(helpers);
    for (unsigned t = 0; t < helpers; ++t) threads_.emplace_back([this] { helper(); });
  }
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;
  ~CopyPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  [[nodiscard]] unsigned helpers() const noexcept { return static_cast<unsigned>(threads_.size()); }

  // Copies the job with the helpers; the caller works too and returns when every part is done.
  void run(PoolJob& job) {
    std::unique_lock lock(mutex_);
    queue_.push_back(&job);
    work_cv_.notify_all();
    while (job.next < job.parts) {
      const unsigned k = job.next++;
      if (job.next == job.parts) queue_.erase(std::find(queue_.begin(), queue_.end(), &job));
      lock.unlock();
      job.copy_part(k);
      lock.lock();
      ++job.done;
    }
    done_cv_.wait(lock, [&] { return job.done == job.parts; });
  }

 private:
  void helper() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      PoolJob* job = queue_.front();
      const unsigned k = job->next++;
      if (job->next == job->parts) queue_.pop_front();
      lock.unlock();
      job->copy_part(k);
      lock.lock();
      if (++job->done == job->parts) done_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<PoolJob*> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class HostRuntime;

struct Task {
  enum class Kind : std::uint8_t { kCopy, kRecord, kWait, kFunc, kWaitFlag };
  Kind kind = Kind::kCopy;
  CopyPath path = CopyPath::kDma;
  std::vector<CopyDescriptor> descs;
  std::shared_ptr<Marker> marker;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  const std::uint32_t* flag = nullptr;
  std::uint32_t flag_value = 0;
};

// Blocks until *flag == value (a host flag gate, as cuStreamWaitValue32).
void wait_flag(const std::uint32_t* flag, std::uint32_t value) {
  std::atomic_ref<std::uint32_t> word(*const_cast<std::uint32_t*>(flag));
  while (word.load(std::memory_order_acquire) != value)
    std::this_thread::sleep_for(std::chrono::microseconds(20));
}

class HostStream {
 public:
  explicit HostStream(HostRuntime& runtime)
      : runtime_(runtime), queue_([this](Task& task) { execute(task); }) {}

  // A descriptor vector from the spare list, so steady-state submission does not allocate.
  std::vector<CopyDescriptor> take_buffer() {
    std::lock_guard lock(spare_mutex_);
    if (spare_.empty()) return {};
    std::vector<CopyDescriptor> v = std::move(spare_.back());
    spare_.pop_back();
    return v;
  }

  void push(Task task) { queue_.push(std::move(task)); }
  void synchronize() { queue_.synchronize(); }

 private:
  void execute(Task& task);  // on the worker thread

  HostRuntime& runtime_;
  std::mutex spare_mutex_;
  std::vector<std::vector<CopyDescriptor>> spare_;
  std::vector<std::uint64_t> ends_;  // worker-only scratch: prefix sums of a batch
  OrderedQueue<Task> queue_;         // last: its worker stops before the members above go
};

class HostRuntime final : public DeviceRuntime {
 public:
  explicit HostRuntime(const RuntimeOptions& options)
      : options_(options), pool_(helpers_for(options)) {
    split_min_ =
        options.host_split_min_bytes != 0 ? options.host_split_min_bytes : kDefaultSplitMinBytes;
    kernel_parts_ =
        options.kernel_max_blocks != 0 ? options.kernel_max_blocks : pool_.helpers() + 1;
  }
  ~HostRuntime() override = default;

  [[nodiscard]] std::string_view name() const noexcept override { return "host"; }
  [[nodiscard]] BackendInfo info() const override { return probe_host(); }
  [[nodiscard]] bool supports_kernel_path() const noexcept override { return true; }

  // Executes one copy batch in the calling (worker) thread, with helpers when it is large.
  void execute(std::span<const CopyDescriptor> batch, CopyPath path,
               std::vector<std::uint64_t>& ends) {
    ends.resize(batch.size());
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      total += batch[i].bytes;
      ends[i] = total;
    }
    unsigned parts = 1;
    const unsigned threads = pool_.helpers() + 1;
    if (path == CopyPath::kKernel) {
      parts = kernel_parts_;  // the "grid": fixed, like a bounded kernel launch
    } else if (total >= split_min_) {
      parts = threads;
    }
    // No part smaller than split_min / threads: a batch at the threshold uses every thread.
    const std::uint64_t min_part = std::max<std::uint64_t>(4096, split_min_ / threads);
    parts = static_cast<unsigned>(
        std::min<std::uint64_t>(parts, std::max<std::uint64_t>(1, total / min_part)));
    if (parts <= 1 || pool_.helpers() == 0) {
      for (const CopyDescriptor& d : batch) std::memcpy(d.dst, d.src, d.bytes);
      return;
    }
    PoolJob job;
    job.descs = batch.data();
    job.ends = ends.data();
    job.count = batch.size();
    job.total = total;
    job.parts = parts;
    pool_.run(job);
  }

 protected:
  RegistrationRecord do_register_host(void* ptr, std::size_t bytes,
                                      std::size_t /*align*/) override {
    std::lock_guard lock(reg_mutex_);
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    const std::uintptr_t end = begin + bytes;
    for (const Range& r : registered_) {
      if (begin < r.end && r.begin < end) {
        throw Error(ErrorCode::kDevice,
                    "host runtime: register_host: range overlaps an existing registration "
                    "(cudaHostRegister would fail with cudaErrorHostMemoryAlreadyRegistered)",
                    0, "register_host");
      }
    }
    const std::uintptr_t handle = ++next_registration_;
    registered_.push_back(Range{begin, end, handle});
    return RegistrationRecord{handle, ptr};  // host: the device pointer is the host pointer
  }

  bool do_unregister_host(std::uintptr_t handle) noexcept override {
    std::lock_guard lock(reg_mutex_);
    auto it = std::find_if(registered_.begin(), registered_.end(),
                           [&](const Range& r) { return r.handle == handle; });
    if (it == registered_.end()) {
      log().error("host runtime: unregister of unknown registration {}", handle);
      return false;
    }
    registered_.erase(it);
    return true;
  }

  std::uintptr_t do_create_stream() override {
    return reinterpret_cast<std::uintptr_t>(new HostStream(*this));
  }
  void do_destroy_stream(std::uintptr_t stream) noexcept override {
    delete reinterpret_cast<HostStream*>(stream);
  }
  std::uintptr_t do_create_event(bool timing) override {
    auto* ev = new CpuEvent();
    ev->timing = timing;
    return reinterpret_cast<std::uintptr_t>(ev);
  }
  void do_destroy_event(std::uintptr_t event) noexcept override {
    delete reinterpret_cast<CpuEvent*>(event);
  }
  void* do_allocate_device(std::size_t bytes) override {
    const std::size_t rounded = (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
    void* p = std::aligned_alloc(kDeviceAlign, rounded);
    if (p == nullptr) {
      throw Error(ErrorCode::kDevice,
                  "host runtime: allocate_device of " + std::to_string(bytes) + " bytes failed",
                  ENOMEM, "aligned_alloc");
    }
    return p;
  }
  void do_free_device(void* ptr) noexcept override { std::free(ptr); }

  void do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                         CopyKind kind, CopyPath path) override {
    if (batch.empty()) return;
    if (path == CopyPath::kKernel) check_kernel_batch(batch, kind);
    if (stream == 0) {
      std::vector<std::uint64_t> ends;
      execute(batch, path, ends);
      return;
    }
    auto* s = reinterpret_cast<HostStream*>(stream);
    Task task;
    task.kind = Task::Kind::kCopy;
    task.path = path;
    task.descs = s->take_buffer();
    task.descs.assign(batch.begin(), batch.end());
    s->push(std::move(task));
  }

  void do_record_event(std::uintptr_t event, std::uintptr_t stream) override {
    auto marker = event_of(event)->record();
    if (stream == 0) {
      marker->complete();
      return;
    }
    Task task;
    task.kind = Task::Kind::kRecord;
    task.marker = std::move(marker);
    reinterpret_cast<HostStream*>(stream)->push(std::move(task));
  }

  void do_wait_event(std::uintptr_t stream, std::uintptr_t event) override {
    std::shared_ptr<Marker> marker = event_of(event)->current();
    if (!marker) return;  // never recorded: nothing to wait for
    if (stream == 0) {
      marker->wait();
      return;
    }
    Task task;
    task.kind = Task::Kind::kWait;
    task.marker = std::move(marker);
    reinterpret_cast<HostStream*>(stream)->push(std::move(task));
  }

  bool do_query_event(std::uintptr_t event) override {
    std::shared_ptr<Marker> marker = event_of(event)->current();
    return !marker || marker->is_done();
  }

  void do_synchronize_event(std::uintptr_t event) override {
    if (std::shared_ptr<Marker> marker = event_of(event)->current()) marker->wait();
  }

  void do_synchronize_stream(std::uintptr_t stream) override {
    if (stream != 0) reinterpret_cast<HostStream*>(stream)->synchronize();
  }

  double do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) override {
    auto* a = event_of(start);
    auto* b = event_of(end);
    const std::shared_ptr<Marker> ma = a->current();
    const std::shared_ptr<Marker> mb = b->current();
    if (!a->timing || !b->timing || !ma || !mb || !ma->is_done() || !mb->is_done()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "host runtime: elapsed_seconds needs two completed timing events", 0,
                  "elapsed_seconds");
    }
    return std::chrono::duration<double>(mb->completed_at() - ma->completed_at()).count();
  }

  void do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) override {
    if (stream == 0) {
      fn(arg);
      return;
    }
    Task task;
    task.kind = Task::Kind::kFunc;
    task.fn = fn;
    task.arg = arg;
    reinterpret_cast<HostStream*>(stream)->push(std::move(task));
  }

  void do_wait_host_flag(std::uintptr_t stream, const std::uint32_t* flag,
                         std::uint32_t value) override {
    if (stream == 0) {
      wait_flag(flag, value);
      return;
    }
    Task task;
    task.kind = Task::Kind::kWaitFlag;
    task.flag = flag;
    task.flag_value = value;
    reinterpret_cast<HostStream*>(stream)->push(std::move(task));
  }

  void do_memcpy_sync(void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void do_memset_sync(void* dst, int value, std::size_t bytes) override {
    if (bytes != 0) std::memset(dst, value, bytes);
  }

 private:
  struct Range {
    std::uintptr_t begin;
    std::uintptr_t end;
    std::uintptr_t handle;
  };

  static unsigned helpers_for(const RuntimeOptions& options) {
    unsigned threads = options.host_copy_threads;
    // Half the hardware threads (the engine's own threads need the rest), at most 4: a few
    // threads saturate a socket's memory bandwidth with memcpy.
    if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency() / 2, 1U, 4U);
    return threads - 1;
  }

  static CpuEvent* event_of(std::uintptr_t event) {
    if (event == 0) throw_invalid("host runtime: null event");
    return reinterpret_cast<CpuEvent*>(event);
  }

  // A GPU kernel dereferencing an unregistered host pointer faults; the host double refuses it
  // so tests catch an engine that would do that.
  void check_kernel_batch(std::span<const CopyDescriptor> batch, CopyKind kind) {
    const bool check_src = kind == CopyKind::kHostToDevice || kind == CopyKind::kHostToHost;
    const bool check_dst = kind == CopyKind::kDeviceToHost || kind == CopyKind::kHostToHost;
    std::lock_guard lock(reg_mutex_);
    auto registered = [&](const void* p, std::uint64_t n) {
      const auto b = reinterpret_cast<std::uintptr_t>(p);
      return std::any_of(registered_.begin(), registered_.end(),
                         [&](const Range& r) { return b >= r.begin && b + n <= r.end; });
    };
    for (const CopyDescriptor& d : batch) {
      if ((check_src && !registered(d.src, d.bytes)) ||
          (check_dst && !registered(d.dst, d.bytes))) {
        throw Error(ErrorCode::kDevice,
                    "host runtime: kernel-path copy touches host memory that is not registered "
                    "(a GPU kernel would fault here)",
                    0, "copy_kernel");
      }
    }
  }

  RuntimeOptions options_;
  CopyPool pool_;
  std::uint64_t split_min_ = kDefaultSplitMinBytes;
  unsigned kernel_parts_ = 1;
  std::mutex reg_mutex_;
  std::vector<Range> registered_;
  std::uintptr_t next_registration_ = 0;
};

void HostStream::execute(Task& task) {
  switch (task.kind) {
    case Task::Kind::kCopy:
      runtime_.execute(task.descs, task.path, ends_);
      task.descs.clear();
      {
        std::lock_guard lock(spare_mutex_);
        spare_.push_back(std::move(task.descs));
      }
      break;
    case Task::Kind::kRecord:
      task.marker->complete();
      break;
    case Task::Kind::kWait:
      task.marker->wait();
      break;
    case Task::Kind::kFunc:
      task.fn(task.arg);
      break;
    case Task::Kind::kWaitFlag:
      wait_flag(task.flag, task.flag_value);
      break;
  }
}

}  // namespace

std::unique_ptr<DeviceRuntime> make_host_runtime(const RuntimeOptions& options) {
  return std::make_unique<HostRuntime>(options);
}

BackendInfo probe_host() {
  return BackendInfo{"host", true, 1,
                     "host memory, worker-thread streams, memcpy (" +
                         std::to_string(std::thread::hardware_concurrency()) +
                         " hardware threads)"};
}

}  // namespace kvoffload::detail
