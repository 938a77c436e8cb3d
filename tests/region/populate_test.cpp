// Populate on anonymous shared memory: unlike a fallocated tmpfs file, its pages are not resident
// until touched, so mincore tells exactly which pages the populate step made resident.
#include "region/populate.hpp"

#include <sys/mman.h>

#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/platform.hpp>

#include "fault_syscalls.hpp"

namespace kvoffload {
namespace {

using test::FaultSyscalls;
using test::Op;
using ::testing::HasSubstr;

class AnonShared {
 public:
  explicit AnonShared(std::size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    data_ = static_cast<std::byte*>(p);
  }
  ~AnonShared() { ::munmap(data_, bytes_); }
  AnonShared(const AnonShared&) = delete;
  AnonShared& operator=(const AnonShared&) = delete;
  [[nodiscard]] std::byte* data() const { return data_; }
  // Residency of every page.
  [[nodiscard]] std::vector<bool> resident() const {
    const std::size_t page = platform::page_size();
    std::vector<unsigned char> vec(bytes_ / page);
    if (::mincore(data_, bytes_, vec.data()) != 0) throw std::runtime_error("mincore");
    std::vector<bool> out(vec.size());
    for (std::size_t i = 0; i < vec.size(); ++i) out[i] = (vec[i] & 1) != 0;
    return out;
  }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Records every page the fallback touches (detail::TouchObserver), from any populate thread.
class TouchLog {
 public:
  [[nodiscard]] detail::TouchObserver observer() { return {&TouchLog::record, this}; }
  [[nodiscard]] std::size_t touches() const {
    const std::lock_guard lock(mu_);
    return touches_;
  }
  [[nodiscard]] std::set<std::byte*> pages() const {
    const std::lock_guard lock(mu_);
    return pages_;
  }

 private:
  static void record(void* ctx, std::byte* page) noexcept {
    auto* self = static_cast<TouchLog*>(ctx);
    const std::lock_guard lock(self->mu_);
    ++self->touches_;
    self->pages_.insert(page);
  }
  mutable std::mutex mu_;
  std::size_t touches_ = 0;
  std::set<std::byte*> pages_;
};

struct Case {
  bool fallback;
  unsigned threads;
};

class Populate : public ::testing::TestWithParam<Case> {};

// A ranked mapper populates exactly its own slots' pages; sentinel bytes survive.
TEST_P(Populate, RankedMapperMakesOnlyItsSlotsResidentAndKeepsBytes) {
  const std::size_t page = platform::page_size();
  // 3 ranks, slot = 1.5 pages: rank 1's slot spans pages 1..2 of each 5-page row.
  const auto g = RegionGeometry::compute(
      {.num_chunks = 16, .slot_bytes = page + page / 2, .world_size = 3}, page);
  ASSERT_EQ(g.row_stride(), 5 * page);
  AnonShared mem(g.data_bytes());
  // A peer already wrote into rank 1's pages of rows 3 and 9 (and a non-target page of row 4).
  // Sentinels a and b sit on the first byte of a target page, the byte the fallback touch
  // writes, so a touch that stores anything but the byte already there is caught.
  const std::size_t sentinel_a = 3 * g.row_stride() + 1 * page;  // rank 0's tail, page 1 of row 3
  const std::size_t sentinel_b = 9 * g.row_stride() + 2 * page;  // the slot's second page
  const std::size_t sentinel_c = g.slot_offset(4, 0);
  std::memset(mem.data() + sentinel_a, 0xA5, 1);
  std::memset(mem.data() + sentinel_b, 0x5A, 1);
  std::memset(mem.data() + sentinel_c, 0x3C, 1);

  FaultSyscalls sys;
  if (GetParam().fallback) sys.fail(Op::kMadvise, 1, EINVAL);
  const detail::PopulatePlan plan(g, mem.data(), 1U);
  TouchLog touched;
  const PopulateReport report =
      detail::populate(*sys.get(), plan, page, GetParam().threads, "test", {}, touched.observer());

  EXPECT_EQ(report.method,
            GetParam().fallback ? PopulateMethod::kFallback : PopulateMethod::kMadvise);
  EXPECT_EQ(report.bytes, 16U * 2U * page);
  if (GetParam().fallback) {
    EXPECT_EQ(sys.count(Op::kMadvise), 1);  // the probe only
  }
  const auto res = mem.resident();
  for (std::size_t row = 0; row < 16; ++row) {
    for (std::size_t p = 0; p < 5; ++p) {
      const bool target = p == 1 || p == 2;  // bytes [1.5, 3) pages -> pages 1 and 2
      const bool touched_by_test = row == 4 && p == 0;
      EXPECT_EQ(res[row * 5 + p], target || touched_by_test) << "row " << row << " page " << p;
    }
  }
  EXPECT_EQ(static_cast<unsigned char>(mem.data()[sentinel_a]), 0xA5);
  EXPECT_EQ(static_cast<unsigned char>(mem.data()[sentinel_b]), 0x5A);
  EXPECT_EQ(static_cast<unsigned char>(mem.data()[sentinel_c]), 0x3C);
  // The fallback touches each target page exactly once, at its first byte (no more: a touch per
  // cache line would cost 64 times the writes); madvise touches none.
  std::set<std::byte*> want;
  if (GetParam().fallback) {
    for (std::size_t row = 0; row < 16; ++row) {
      want.insert(mem.data() + row * g.row_stride() + 1 * page);
      want.insert(mem.data() + row * g.row_stride() + 2 * page);
    }
  }
  EXPECT_EQ(touched.touches(), want.size());
  EXPECT_EQ(touched.pages(), want);
}

// An unranked mapper populates everything.
TEST_P(Populate, UnrankedMapperMakesEveryPageResidentAndKeepsBytes) {
  const std::size_t page = platform::page_size();
  const auto g =
      RegionGeometry::compute({.num_chunks = 40, .slot_bytes = 3000, .world_size = 2}, page);
  AnonShared mem(g.data_bytes());
  // Every third page holds a byte where the fallback touch writes (its first byte).
  for (std::size_t off = 0; off < g.data_bytes(); off += 3 * page) {
    mem.data()[off] = static_cast<std::byte>(off / page % 251 + 1);
  }
  FaultSyscalls sys;
  if (GetParam().fallback) sys.fail(Op::kMadvise, 1, EINVAL);
  const detail::PopulatePlan plan(g, mem.data(), std::nullopt);
  TouchLog touched;
  const PopulateReport report =
      detail::populate(*sys.get(), plan, page, GetParam().threads, "test", {}, touched.observer());
  EXPECT_EQ(report.method,
            GetParam().fallback ? PopulateMethod::kFallback : PopulateMethod::kMadvise);
  EXPECT_EQ(report.bytes, g.data_bytes());
  for (const bool r : mem.resident()) ASSERT_TRUE(r);
  for (std::size_t off = 0; off < g.data_bytes(); off += 3 * page) {
    ASSERT_EQ(mem.data()[off], static_cast<std::byte>(off / page % 251 + 1)) << off;
  }
  const std::size_t pages = GetParam().fallback ? g.data_bytes() / page : 0;
  EXPECT_EQ(touched.touches(), pages) << "one touch per page";
  EXPECT_EQ(touched.pages().size(), pages);
}

INSTANTIATE_TEST_SUITE_P(MethodsAndThreads, Populate,
                         ::testing::Values(Case{false, 1}, Case{false, 4}, Case{true, 1},
                                           Case{true, 4}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.fallback ? "fallback" : "madvise") +
                                  "_" + std::to_string(param_info.param.threads) + "threads";
                         });

// Only EINVAL (a kernel before 5.14) selects the fallback. Every other errno the probe can meet --
// those madvise(2) lists, and the ones MADV_POPULATE_WRITE adds (EFAULT for a fault that would
// SIGBUS, EHWPOISON) -- is an error naming the errno and the range, and nothing is touched.
class ProbeErrno : public ::testing::TestWithParam<int> {};

TEST_P(ProbeErrno, PropagatesWithErrnoAndRangeAndTouchesNothing) {
  const int err = GetParam();
  const std::size_t page = platform::page_size();
  const auto g = RegionGeometry::compute({.num_chunks = 4, .slot_bytes = page}, page);
  AnonShared mem(g.data_bytes());
  FaultSyscalls sys;
  sys.fail(Op::kMadvise, 1, err);
  TouchLog touched;
  try {
    (void)detail::populate(*sys.get(), detail::PopulatePlan(g, mem.data(), std::nullopt), page, 1,
                           "region X", {}, touched.observer());
    FAIL() << "no error: " << errno_name(err) << " must not select the fallback";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kSystem);
    EXPECT_EQ(e.sys_errno(), err);
    EXPECT_EQ(e.call(), "madvise");
    EXPECT_THAT(e.what(), HasSubstr(errno_name(err)));
    EXPECT_THAT(e.what(), HasSubstr("MADV_POPULATE_WRITE on [0x"));
    EXPECT_THAT(e.what(), HasSubstr("region X"));
  }
  EXPECT_EQ(sys.count(Op::kMadvise), 1) << "the probe only";
  EXPECT_EQ(touched.touches(), 0U);
  for (const bool r : mem.resident()) EXPECT_FALSE(r);
}

INSTANTIATE_TEST_SUITE_P(EveryErrnoButEinval, ProbeErrno,
                         ::testing::Values(EPERM, EACCES, EAGAIN, EBADF, EFAULT, EHWPOISON, EIO,
                                           ENOMEM, ENOSYS, EOPNOTSUPP),
                         [](const auto& pi) { return errno_name(pi.param); });

// EINTR is not an answer: the probe is asked again, and madvise does the work.
TEST(PopulateErrors, InterruptedProbeIsRetried) {
  const std::size_t page = platform::page_size();
  const auto g = RegionGeometry::compute({.num_chunks = 4, .slot_bytes = page}, page);
  AnonShared mem(g.data_bytes());
  FaultSyscalls sys;
  sys.fail(Op::kMadvise, 1, EINTR);
  TouchLog touched;
  const PopulateReport report =
      detail::populate(*sys.get(), detail::PopulatePlan(g, mem.data(), std::nullopt), page, 1,
                       "region X", {}, touched.observer());
  EXPECT_EQ(report.method, PopulateMethod::kMadvise);
  EXPECT_EQ(touched.touches(), 0U);
  for (const bool r : mem.resident()) EXPECT_TRUE(r);
}

TEST(PopulateErrors, LaterRowFailureInAWorkerThreadReachesTheCaller) {
  const std::size_t page = platform::page_size();
  const auto g =
      RegionGeometry::compute({.num_chunks = 32, .slot_bytes = page, .world_size = 2}, page);
  AnonShared mem(g.data_bytes());
  FaultSyscalls sys;
  sys.fail(Op::kMadvise, 20, EFAULT);
  try {
    (void)detail::populate(*sys.get(), detail::PopulatePlan(g, mem.data(), 1U), page, 4,
                           "region Y");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), EFAULT);
    EXPECT_THAT(e.what(), HasSubstr("EFAULT"));
  }
}

TEST(PopulateErrors, ZeroThreadsRefused) {
  const std::size_t page = platform::page_size();
  const auto g = RegionGeometry::compute({.num_chunks = 1, .slot_bytes = page}, page);
  AnonShared mem(g.data_bytes());
  EXPECT_THROW(
      (void)detail::populate(real_syscalls(), detail::PopulatePlan(g, mem.data(), std::nullopt),
                             page, 0, "r"),
      Error);
}

}  // namespace
}  // namespace kvoffload
