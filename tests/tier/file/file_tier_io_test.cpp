// How FileTier moves bytes: the I/O pool's read-priority lanes, read threads serving gets and puts,
// page-aligned payloads moved in place and verified in the destination (still missing a damaged
// record), and a batch's finish time set with its last item.

#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "file_tier_test_util.hpp"
#include "sys/syscalls.hpp"
#include "tier/file/io_pool.hpp"
#include "tier_test_util.hpp"

namespace kvoffload {
namespace {

using test::expect_round_trip;
using test::get_one;
using test::Op;
using test::options_for;
using test::pattern;
using test::put_keys;
using TempDir = test::DiskTempDir;

std::string lane_order(unsigned threads, unsigned read_threads) {
  detail::IoPool pool(threads, read_threads, 4096);
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::mutex mutex;
  std::string order;
  std::atomic<int> done{0};
  // Every worker blocks first, so what follows queues up behind them.
  for (unsigned i = 0; i < threads; ++i) {
    pool.submit([&, released, i](detail::IoWorker&) {
      if (i == 0) started.set_value();
      released.wait();
      ++done;
    });
  }
  started.get_future().wait();
  auto record = [&](char c) {
    return [&, c](detail::IoWorker&) {
      std::lock_guard lock(mutex);
      order += c;
      ++done;
    };
  };
  std::vector<detail::IoPool::Task> writes;
  writes.emplace_back(record('w'));
  writes.emplace_back(record('w'));
  pool.submit_many(std::move(writes), detail::IoLane::kWrite);
  std::vector<detail::IoPool::Task> reads;
  reads.emplace_back(record('r'));
  pool.submit_many(std::move(reads), detail::IoLane::kRead);
  release.set_value();
  while (done.load() < static_cast<int>(threads) + 3) std::this_thread::yield();
  return order;
}

TEST(IoPool, ReadPriorityWorkersServeQueuedReadsBeforeEarlierWrites) {
  // One read-priority worker: the load queued after two stores runs first (vLLM's fs tier's
  // n_read_threads); without read workers the pool keeps submission order.
  EXPECT_EQ(lane_order(1, 1), "rww");
  EXPECT_EQ(lane_order(1, 0), "wwr");
}

TEST(IoPool, EachLaneIsServedWhenTheOtherIsEmpty) {
  // Only read-priority workers: writes still run (no starvation), reads first.
  detail::IoPool pool(2, 2, 4096);
  std::atomic<int> n{0};
  std::vector<detail::IoPool::Task> writes;
  writes.reserve(8);
  for (int i = 0; i < 8; ++i) writes.emplace_back([&](detail::IoWorker&) { ++n; });
  pool.submit_many(std::move(writes), detail::IoLane::kWrite);
  while (n.load() < 8) std::this_thread::yield();
  EXPECT_EQ(n.load(), 8);
}

TEST(FileTier, ReadThreadsServeGetsAndPutsAlike) {
  TempDir dir;
  auto o = options_for(dir.path() / "t");
  o.io_threads = 3;
  o.read_threads = 1;
  auto tier = FileTier::open(o);
  const auto data = put_keys(*tier, 6, 10000);
  expect_round_trip(*tier, data);
}

// A page-aligned buffer of n bytes filled with `seed`'s pattern (as vLLM's primary rows are).
struct AlignedBytes {
  explicit AlignedBytes(std::size_t n, std::uint32_t seed = 0) : size(n) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n) != 0) throw std::bad_alloc();
    data = static_cast<std::byte*>(p);
    const auto v = pattern(n, seed);
    std::memcpy(data, v.data(), n);
  }
  ~AlignedBytes() { std::free(data); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  [[nodiscard]] std::span<std::byte> span() const { return {data, size}; }
  std::byte* data = nullptr;
  std::size_t size = 0;
};

TEST(FileTier, AlignedPayloadsMoveInPlaceAndVerifyInTheDestination) {
  // Sizes that end on a block, inside the header's block, and past it; aligned and unaligned
  // memory; both read paths. Every record must read back the same bytes either way.
  for (const std::size_t bytes : {std::size_t{65536}, std::size_t{65536 + 100},
                                  std::size_t{65536 + 4050}, std::size_t{1000}}) {
    for (const bool in_destination : {false, true}) {
      TempDir dir;
      auto o = options_for(dir.path() / "t");
      o.verify_in_destination = in_destination;
      auto tier = FileTier::open(o);
      const AlignedBytes src(bytes, static_cast<std::uint32_t>(bytes));
      const std::vector<std::byte> unaligned(src.data, src.data + bytes);
      const TierPut puts[] = {{BlockKey::from_u64(1), src.span()},
                              {BlockKey::from_u64(2), unaligned}};
      for (const auto& r : tier->put(puts).wait()) ASSERT_EQ(r.status, TierItemStatus::kOk);
      EXPECT_EQ(std::filesystem::file_size(tier->record_path(BlockKey::from_u64(1))),
                file_tier_record_bytes(bytes));
      for (const std::uint64_t k : {1, 2}) {
        const AlignedBytes into(bytes, 999);
        ASSERT_EQ(get_one(*tier, BlockKey::from_u64(k), into.span()).status, TierItemStatus::kOk);
        EXPECT_EQ(std::memcmp(into.data, src.data, bytes), 0) << bytes << " key " << k;
        std::vector<std::byte> plain(bytes);
        ASSERT_EQ(get_one(*tier, BlockKey::from_u64(k), plain).status, TierItemStatus::kOk);
        EXPECT_EQ(std::memcmp(plain.data(), src.data, bytes), 0);
      }
    }
  }
}

// The real record calls, except that a vectored read or write moves at most `step` bytes per call
// (a kernel may transfer less than asked: a signal, a filesystem's limit), with the calls counted.
struct ShortTransfers {
  static inline std::size_t step = 0;
  static inline std::atomic<int> reads{0};
  static inline std::atomic<int> writes{0};
  // The first iovecs of [iov, iov + n) holding at most `step` bytes, cut inside the last one.
  static int clip(const struct iovec* iov, int n, std::array<struct iovec, 4>& out) {
    std::size_t left = step;
    int m = 0;
    for (int i = 0; i < n && m < 4 && left > 0; ++i) {
      out[m] = iov[i];
      out[m].iov_len = std::min(out[m].iov_len, left);
      left -= out[m++].iov_len;
    }
    return m;
  }
  static Syscalls table() {
    Syscalls t = real_syscalls();
    t.preadv = [](void*, int fd, const struct iovec* iov, int n, off_t at) -> ssize_t {
      ++reads;
      std::array<struct iovec, 4> v{};
      return real_syscalls().preadv(nullptr, fd, v.data(), clip(iov, n, v), at);
    };
    t.pwritev = [](void*, int fd, const struct iovec* iov, int n, off_t at) -> ssize_t {
      ++writes;
      std::array<struct iovec, 4> v{};
      return real_syscalls().pwritev(nullptr, fd, v.data(), clip(iov, n, v), at);
    };
    return t;
  }
};

TEST(FileTier, ARecordMovesInOneCallAndShortTransfersAreContinued) {
  // 64 KiB + 100 in 4 KiB-aligned memory: the payload's 16 whole blocks in place, then a tail of
  // the last 100 bytes, padding and header; read back into aligned memory and verified there.
  constexpr std::size_t kBytes = 65536 + 100;
  const std::uint64_t rec = file_tier_record_bytes(kBytes);  // 72 KiB
  for (const std::size_t step : {std::size_t{1} << 30, std::size_t{5000}}) {
    ShortTransfers::step = step;
    ShortTransfers::reads = 0;
    ShortTransfers::writes = 0;
    const Syscalls table = ShortTransfers::table();
    TempDir dir;
    auto o = options_for(dir.path() / "t");
    o.verify_in_destination = true;
    // Whole calls under O_DIRECT; cut ones buffered (a cut at 5000 bytes is not block-aligned).
    o.direct_io = step == std::size_t{1} << 30 ? DirectIoMode::kAuto : DirectIoMode::kBuffered;
    o.syscalls = &table;
    o.io_threads = 1;
    auto tier = FileTier::open(o);
    const AlignedBytes src(kBytes, 5);
    const TierPut put{BlockKey::from_u64(1), src.span()};
    ASSERT_EQ(tier->put(std::span(&put, 1)).wait()[0].status, TierItemStatus::kOk);
    const AlignedBytes into(kBytes, 6);
    const auto r = get_one(*tier, BlockKey::from_u64(1), into.span());
    ASSERT_EQ(r.status, TierItemStatus::kOk) << r.detail;
    EXPECT_EQ(std::memcmp(into.data, src.data, kBytes), 0) << step;
    const int calls = step > rec ? 1 : static_cast<int>((rec + step - 1) / step);  // 15 at 5000
    EXPECT_EQ(ShortTransfers::writes.load(), calls) << step;
    EXPECT_EQ(ShortTransfers::reads.load(), calls) << step;
  }
}

TEST(FileTier, VerifyingInTheDestinationStillMissesADamagedRecord) {
  TempDir dir;
  auto o = options_for(dir.path() / "t");
  o.verify_in_destination = true;
  auto tier = FileTier::open(o);
  const AlignedBytes src(8192 + 300, 5);
  const TierPut p{BlockKey::from_u64(7), src.span()};
  ASSERT_EQ(tier->put(std::span(&p, 1)).wait()[0].status, TierItemStatus::kOk);
  const auto path = tier->record_path(BlockKey::from_u64(7));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');  // inside the first block, which lands in the destination
  }
  const AlignedBytes into(src.size, 1);
  const auto r = get_one(*tier, BlockKey::from_u64(7), into.span());
  EXPECT_EQ(r.status, TierItemStatus::kMiss);
  EXPECT_EQ(r.detail, "payload checksum mismatch");
  tier->drain();
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(7)));
  EXPECT_EQ(tier->stats().corrupt, 1u);
}

// Without verify_in_destination a get keeps the TierGet contract even into aligned memory: the
// record is verified in the bounce buffer, so a damaged one leaves the destination untouched.
TEST(FileTier, WithoutVerifyInDestinationADamagedRecordLeavesAnAlignedDestinationUntouched) {
  TempDir dir;
  auto tier = FileTier::open(options_for(dir.path() / "t"));  // verify_in_destination off
  const AlignedBytes src(8192 + 300, 5);
  const TierPut p{BlockKey::from_u64(7), src.span()};
  ASSERT_EQ(tier->put(std::span(&p, 1)).wait()[0].status, TierItemStatus::kOk);
  {
    std::fstream f(tier->record_path(BlockKey::from_u64(7)),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');  // inside the payload's first block
  }
  const AlignedBytes into(src.size, 1);
  const std::vector<std::byte> before(into.data, into.data + into.size);
  const auto r = get_one(*tier, BlockKey::from_u64(7), into.span());
  EXPECT_EQ(r.status, TierItemStatus::kMiss);
  EXPECT_EQ(r.detail, "payload checksum mismatch");
  EXPECT_EQ(std::memcmp(into.data, before.data(), before.size()), 0)
      << "the damaged record's bytes reached the destination";
}

// Note [File tier record], format 3: a row of 64 KiB in page-aligned memory is a file of 64 KiB,
// on disk too (its header is an extended attribute, in the inode), written with one pwritev and
// read with one preadv straight from and into the row; the header set once and read once.
TEST(FileTier, ARowOf64KiBIsARecordOf64KiBWrittenAndReadInOneCallEach) {
  constexpr std::size_t kBytes = 65536;
  EXPECT_EQ(file_tier_record_bytes(kBytes), kBytes);
  TempDir dir;
  test::FaultSyscalls io;
  std::mutex mu;
  std::map<Op, int> calls;  // of the record's files (its temp file and itself)
  const std::string key = BlockKey::from_u64(1).to_hex();
  io.set_rule([&](const test::FaultSyscalls::Call& c) {
    if (c.path.find(key) == std::string::npos) return 0;
    const std::lock_guard lock(mu);
    ++calls[c.op];
    return 0;
  });
  auto o = options_for(dir.path() / "t");
  o.verify_in_destination = true;
  o.syscalls = io.get();
  auto tier = FileTier::open(o);
  const AlignedBytes src(kBytes, 3);
  const TierPut put{BlockKey::from_u64(1), src.span()};
  ASSERT_EQ(tier->put(std::span(&put, 1)).wait()[0].status, TierItemStatus::kOk);
  const auto path = tier->record_path(BlockKey::from_u64(1));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), kBytes);
  EXPECT_LE(static_cast<std::uint64_t>(st.st_blocks) * 512, kBytes)
      << "the record takes more blocks than its payload";
  EXPECT_EQ(tier->stats().bytes, kBytes);
  const AlignedBytes into(kBytes, 4);
  const auto r = get_one(*tier, BlockKey::from_u64(1), into.span());
  ASSERT_EQ(r.status, TierItemStatus::kOk) << r.detail;
  EXPECT_EQ(std::memcmp(into.data, src.data, kBytes), 0);
  const std::lock_guard lock(mu);
  EXPECT_EQ(calls[Op::kPwrite], 1);
  EXPECT_EQ(calls[Op::kPread], 1);
  EXPECT_EQ(calls[Op::kFsetxattr], 1);
  EXPECT_EQ(calls[Op::kFgetxattr], 1);
}

// Where the filesystem keeps no user extended attributes, the header goes in a trailer block
// (format 2, the earlier format: one more block); a tier reopened where attributes work reads
// those records (an upgrade keeps what an earlier kvoffload stored) and writes format 3.
TEST(FileTier, WithoutExtendedAttributesTheHeaderIsATrailerAndAnUpgradeReadsIt) {
  constexpr std::size_t kBytes = 65536;
  TempDir dir;
  const AlignedBytes src(kBytes, 8);
  const std::vector<std::byte> unaligned = pattern(kBytes + 100, 9);
  {
    test::FaultSyscalls io;
    io.set_rule([](const test::FaultSyscalls::Call& c) {
      return c.op == Op::kFsetxattr || c.op == Op::kFgetxattr ? EOPNOTSUPP : 0;
    });
    auto o = options_for(dir.path() / "t");
    o.syscalls = io.get();
    auto tier = FileTier::open(o);
    const TierPut puts[] = {{BlockKey::from_u64(1), src.span()},
                            {BlockKey::from_u64(2), unaligned}};
    for (const auto& r : tier->put(puts).wait()) ASSERT_EQ(r.status, TierItemStatus::kOk);
    EXPECT_EQ(std::filesystem::file_size(tier->record_path(BlockKey::from_u64(1))), kBytes + 4096);
    EXPECT_EQ(std::filesystem::file_size(tier->record_path(BlockKey::from_u64(2))), kBytes + 4096);
    EXPECT_EQ(tier->stats().bytes, 2 * (kBytes + 4096));
    const AlignedBytes into(kBytes, 1);
    ASSERT_EQ(get_one(*tier, BlockKey::from_u64(1), into.span()).status, TierItemStatus::kOk);
    EXPECT_EQ(std::memcmp(into.data, src.data, kBytes), 0);
    ASSERT_TRUE(tier->close());
  }
  for (const bool in_destination : {false, true}) {
    auto o = options_for(dir.path() / "t");
    o.verify_in_destination = in_destination;
    auto tier = FileTier::open(o);
    EXPECT_EQ(tier->stats().entries, in_destination ? 3U : 2U);
    const AlignedBytes into(kBytes, 2);
    const auto r = get_one(*tier, BlockKey::from_u64(1), into.span());
    ASSERT_EQ(r.status, TierItemStatus::kOk) << r.detail;
    EXPECT_EQ(std::memcmp(into.data, src.data, kBytes), 0);
    std::vector<std::byte> out(unaligned.size());
    ASSERT_EQ(get_one(*tier, BlockKey::from_u64(2), out).status, TierItemStatus::kOk);
    EXPECT_EQ(out, unaligned);
    if (!in_destination) {
      const TierPut p{BlockKey::from_u64(3), src.span()};
      ASSERT_EQ(tier->put(std::span(&p, 1)).wait()[0].status, TierItemStatus::kOk);
      EXPECT_EQ(std::filesystem::file_size(tier->record_path(BlockKey::from_u64(3))), kBytes);
    }
    ASSERT_TRUE(tier->close());
  }
}

TEST(TierBatch, FinishedAtIsSetWithTheLastItem) {
  const BlockKey keys[] = {BlockKey::from_u64(1), BlockKey::from_u64(2)};
  TierBatchPromise promise(keys);
  const TierBatch batch = promise.batch();
  EXPECT_FALSE(batch.finished_at().has_value());
  const auto before = std::chrono::steady_clock::now();
  promise.set(0, TierItemStatus::kOk);
  EXPECT_FALSE(batch.finished_at().has_value());
  promise.set(1, TierItemStatus::kMiss);
  const auto after = std::chrono::steady_clock::now();
  ASSERT_TRUE(batch.finished_at().has_value());
  EXPECT_GE(*batch.finished_at(), before);
  EXPECT_LE(*batch.finished_at(), after);
  EXPECT_FALSE(TierBatch().finished_at().has_value());  // an empty batch has no finishing time
}

}  // namespace
}  // namespace kvoffload
