#include "region/populate.hpp"

#include <sys/mman.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <kvoffload/error.hpp>

#include "sys/sys.hpp"
#include "util/log.hpp"

namespace kvoffload::detail {
namespace {

// Unranked mappers populate in pieces of this size so several threads can share the work.
constexpr std::uint64_t kUnrankedPiece = 64ULL << 20;

std::string describe_range(ByteRange r, const std::string& what) {
  char buf[96];
  (void)std::snprintf(buf, sizeof buf, "[%p, +%zu)", static_cast<void*>(r.begin), r.size);
  return std::string("MADV_POPULATE_WRITE on ") + buf + " of " + what;
}

// The error for a file-backed range that could not be allocated: it names how many bytes this
// mapper still needed, how many the filesystem has free now and the difference.
[[noreturn]] void throw_shortfall(const Syscalls& sys, const BackingFile& file,
                                  std::uint64_t needed, int err, const char* call,
                                  const std::string& what) {
  std::string free_now = "unknown (fstatvfs failed)";
  std::string shortfall;
  struct statvfs vfs {};
  if (file.dirfd >= 0 && sys.fstatvfs(sys.context, file.dirfd, &vfs) == 0) {
    const std::uint64_t avail = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    free_now = std::to_string(avail) + " bytes";
    shortfall = "; shortfall " + std::to_string(needed > avail ? needed - avail : 0) + " bytes";
  }
  throw Error(
      ErrorCode::kCapacity,
      std::string(call) + " could not allocate the pages of " + what + " (" + errno_name(err) +
          "): the shm filesystem " + file.dir +
          " ran out of space after the creator's capacity check. This mapper still needed " +
          std::to_string(needed) + " bytes for its slots and " + file.dir + " has " + free_now +
          " free" + shortfall +
          ". Another process took the space; free it, give the container a larger shm "
          "(--shm-size), share the host's (--ipc=host), or ask for a smaller region",
      err, call);
}

// Errors of MADV_POPULATE_WRITE that mean "the page could not be allocated" on a file mapping:
// EFAULT is the fault's SIGBUS (tmpfs full), ENOMEM a memory cgroup limit.
bool is_allocation_failure(int err) noexcept {
  return err == EFAULT || err == ENOMEM || err == ENOSPC;
}

// fallocate of the file pages behind `r` (page-aligned already).
void fallocate_range(const Syscalls& sys, const BackingFile& file, ByteRange r,
                     std::uint64_t needed, const std::string& what) {
  const auto offset = static_cast<off_t>(r.begin - file.file_base);
  const int rc = retry_eintr(
      [&] { return sys.fallocate(sys.context, file.fd, 0, offset, static_cast<off_t>(r.size)); });
  if (rc == 0) return;
  const int err = errno;
  if (err == ENOSPC || err == EDQUOT) throw_shortfall(sys, file, needed, err, "fallocate", what);
  throw_system_error("fallocate", err,
                     "of " + std::to_string(r.size) + " bytes at offset " + std::to_string(offset) +
                         " of " + what);
}

}  // namespace

void allocate(const Syscalls& sys, const PopulatePlan& plan, const BackingFile& file,
              const std::string& what) {
  std::uint64_t done = 0;
  for (std::size_t i = 0; i < plan.count(); ++i) {
    const ByteRange r = plan.range(i);
    fallocate_range(sys, file, r, plan.total_bytes() - done, what);
    done += r.size;
  }
}

PopulatePlan::PopulatePlan(const RegionGeometry& g, std::byte* data,
                           std::optional<std::uint32_t> rank)
    : data_(data), data_bytes_(g.data_bytes()) {
  const std::uint64_t page = g.page_size();
  if (rank) {
    // Row c: raw offset c·R + k·P rounded down to a page, up to the slot end rounded up. R is a
    // page multiple, so every row's range has the same length and lies inside the row.
    const std::uint64_t off = g.slot_offset(0, *rank);  // copy(rank) x slot_stride
    first_ = off / page * page;
    const std::uint64_t end = (off + g.slot_bytes() + page - 1) / page * page;
    length_ = end - first_;
    stride_ = g.row_stride();
    count_ = static_cast<std::size_t>(g.num_chunks());
    total_bytes_ = length_ * g.num_chunks();
  } else {
    first_ = 0;
    length_ = std::min<std::uint64_t>(kUnrankedPiece, data_bytes_);
    stride_ = length_;
    count_ = static_cast<std::size_t>((data_bytes_ + length_ - 1) / length_);
    total_bytes_ = data_bytes_;
  }
}

PopulatePlan PopulatePlan::rows(std::uint64_t first_row, std::uint64_t rows) const noexcept {
  PopulatePlan p = *this;
  p.first_ = first_ + first_row * stride_;
  p.count_ = static_cast<std::size_t>(rows);
  p.total_bytes_ = length_ * rows;
  return p;
}

ByteRange PopulatePlan::range(std::size_t i) const noexcept {
  const std::uint64_t begin = first_ + i * stride_;
  const std::uint64_t len = std::min(length_, data_bytes_ - begin);
  return {data_ + begin, static_cast<std::size_t>(len)};
}

void touch_pages_preserving(ByteRange range, std::size_t page_size,
                            TouchObserver observe) noexcept {
  for (std::size_t off = 0; off < range.size; off += page_size) {
    // A real write (so the page is allocated writable), of nothing: another rank may already
    // have stored KV bytes here, so `x = 0` would be wrong.
    std::atomic_ref<unsigned char> byte(*reinterpret_cast<unsigned char*>(range.begin + off));
    byte.fetch_or(0, std::memory_order_relaxed);
    if (observe.fn != nullptr) observe.fn(observe.ctx, range.begin + off);
  }
}

PopulateReport populate(const Syscalls& sys, const PopulatePlan& plan, std::size_t page_size,
                        unsigned threads, const std::string& what, const BackingFile& file,
                        TouchObserver observe) {
  if (threads == 0) throw_invalid("populate_threads is 0; it must be at least 1");
  const auto start = std::chrono::steady_clock::now();
  PopulateReport report;
  report.bytes = plan.total_bytes();
  if (plan.count() == 0) return report;

  const bool file_backed = file.fd >= 0;
  // Bytes populated so far, for the shortfall figure of an allocation failure.
  std::atomic<std::uint64_t> done{0};
  auto madvise_range = [&](ByteRange r) {
    const int rc =
        retry_eintr([&] { return sys.madvise(sys.context, r.begin, r.size, MADV_POPULATE_WRITE); });
    if (rc == 0) return;
    const int err = errno;
    if (file_backed && is_allocation_failure(err)) {
      throw_shortfall(sys, file, plan.total_bytes() - done.load(std::memory_order_relaxed), err,
                      "madvise", describe_range(r, what));
    }
    throw_system_error("madvise", err, describe_range(r, what));
  };

  // The probe: one call on the first page. Only EINVAL selects the fallback.
  ByteRange probe = plan.range(0);
  probe.size = std::min(probe.size, page_size);
  const int rc = retry_eintr(
      [&] { return sys.madvise(sys.context, probe.begin, probe.size, MADV_POPULATE_WRITE); });
  if (rc == 0) {
    report.method = PopulateMethod::kMadvise;
  } else if (errno == EINVAL) {
    report.method = PopulateMethod::kFallback;
    log().info("{}: MADV_POPULATE_WRITE not supported (EINVAL); touching pages instead", what);
  } else if (file_backed && is_allocation_failure(errno)) {
    throw_shortfall(sys, file, plan.total_bytes(), errno, "madvise", describe_range(probe, what));
  } else {
    throw_system_error("madvise", errno, describe_range(probe, what));
  }

  const bool use_madvise = report.method == PopulateMethod::kMadvise;
  auto work = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      const ByteRange r = plan.range(i);
      if (use_madvise) {
        madvise_range(r);
      } else {
        // Allocate before the first touch: touching a hole of a full tmpfs is a SIGBUS.
        if (file_backed) {
          fallocate_range(sys, file, r, plan.total_bytes() - done.load(std::memory_order_relaxed),
                          what);
        }
        touch_pages_preserving(r, page_size, observe);
      }
      done.fetch_add(r.size, std::memory_order_relaxed);
    }
  };

  const std::size_t n = plan.count();
  const std::size_t workers = std::min<std::size_t>(threads, n);
  if (workers <= 1) {
    work(0, n);
  } else {
    std::mutex mu;
    std::exception_ptr first_error;
    std::vector<std::thread> pool;
    pool.reserve(workers);
    auto run = [&](std::size_t b, std::size_t e) {
      try {
        work(b, e);
      } catch (...) {
        const std::lock_guard lock(mu);
        if (!first_error) first_error = std::current_exception();
      }
    };
    try {
      for (std::size_t t = 1; t < workers; ++t) {
        pool.emplace_back(run, n * t / workers, n * (t + 1) / workers);
      }
    } catch (const std::system_error& e) {
      for (auto& th : pool) th.join();
      throw Error(ErrorCode::kSystem,
                  "could not start populate threads for " + what + ": " + e.what(),
                  e.code().value(), "pthread_create");
    }
    run(0, n / workers);
    for (auto& th : pool) th.join();
    if (first_error) std::rethrow_exception(first_error);
  }

  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gbps =
      report.seconds > 0 ? static_cast<double>(report.bytes) / report.seconds / 1e9 : 0.0;
  log().info("{}: populated {} bytes with {} using {} thread(s) in {:.3f} s ({:.2f} GB/s)", what,
             report.bytes, to_string(report.method), workers, report.seconds, gbps);
  return report;
}

}  // namespace kvoffload::detail
