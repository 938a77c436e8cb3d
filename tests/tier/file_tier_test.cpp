// FileTier: round trip, O_DIRECT fallback, damaged records as misses, per-item batch results,
// non-blocking contains, capacity eviction, validation and restart.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "tier/file/crc32c.hpp"
#include "tier/file/io_pool.hpp"
#include "tier_test_util.hpp"

namespace kvoffload {
namespace {

using test::FaultSyscalls;
using test::Op;
using TempDir = test::DiskTempDir;

std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

FileTierOptions options_for(const std::filesystem::path& root, std::uint64_t capacity = 64 << 20) {
  FileTierOptions o;
  o.root = root;
  o.capacity_bytes = capacity;
  o.io_threads = 2;
  return o;
}

// Stores `n` keys 1..n with payloads of `bytes` bytes; returns the payloads.
std::vector<std::vector<std::byte>> put_keys(SecondaryTier& tier, std::size_t n,
                                             std::size_t bytes) {
  std::vector<std::vector<std::byte>> data;
  std::vector<TierPut> puts;
  for (std::size_t i = 0; i < n; ++i) data.push_back(pattern(bytes, static_cast<std::uint32_t>(i)));
  for (std::size_t i = 0; i < n; ++i) puts.push_back({BlockKey::from_u64(i + 1), data[i]});
  const auto results = tier.put(puts).wait();
  for (const auto& r : results) EXPECT_EQ(r.status, TierItemStatus::kOk) << r.detail;
  return data;
}

TierItemResult get_one(SecondaryTier& tier, BlockKey key, std::span<std::byte> into) {
  const TierGet g{key, into};
  return tier.get(std::span(&g, 1)).wait()[0];
}

void expect_round_trip(SecondaryTier& tier, const std::vector<std::vector<std::byte>>& data) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    std::vector<std::byte> out(data[i].size(), std::byte{0x5A});
    const auto r = get_one(tier, BlockKey::from_u64(i + 1), out);
    ASSERT_EQ(r.status, TierItemStatus::kOk) << r.detail;
    EXPECT_EQ(out, data[i]) << "key " << i + 1;
  }
}

TEST(Crc32c, KnownVectorsAndPortableAgreement) {
  const char* text = "123456789";
  const auto bytes = std::as_bytes(std::span(text, 9));
  EXPECT_EQ(detail::crc32c(bytes), 0xE3069283u);
  EXPECT_EQ(detail::crc32c_portable(bytes), 0xE3069283u);
  std::vector<std::byte> zeros(32);
  EXPECT_EQ(detail::crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  const auto p = pattern(100'003, 7);
  EXPECT_EQ(detail::crc32c(p), detail::crc32c_portable(p));
  // Incremental equals one shot.
  const auto whole = detail::crc32c(p);
  const auto part =
      detail::crc32c(std::span(p).subspan(1000), detail::crc32c(std::span(p).first(1000)));
  EXPECT_EQ(part, whole);
}

TEST(FileTier, RoundTripAndReopenIndexesRecords) {
  TempDir dir;
  const auto root = dir.path() / "tier";
  std::vector<std::vector<std::byte>> data;
  {
    auto tier = FileTier::open(options_for(root));
    data = put_keys(*tier, 6, 10'000);  // not a multiple of the 4 KiB record alignment
    for (std::size_t i = 0; i < 6; ++i) EXPECT_TRUE(tier->contains(BlockKey::from_u64(i + 1)));
    EXPECT_FALSE(tier->contains(BlockKey::from_u64(99)));
    expect_round_trip(*tier, data);
    const auto st = tier->stats();
    EXPECT_EQ(st.entries, 6u);
    EXPECT_EQ(st.bytes, 6 * file_tier_record_bytes(10'000));
    EXPECT_EQ(st.puts_ok, 6u);
    EXPECT_EQ(st.gets_ok, 6u);
    EXPECT_TRUE(std::filesystem::exists(tier->record_path(BlockKey::from_u64(3))));
    EXPECT_TRUE(tier->close());
    EXPECT_THROW((void)tier->put({}), Error);
  }
  // Only records and the lock file: no temporary file survives a completed put.
  for (const auto& f : test::files_under(root)) {
    EXPECT_TRUE(f.ends_with(".kvb") || f == ".kvoffload-tier.lock") << f;
  }
  auto again = FileTier::open(options_for(root));
  for (std::size_t i = 0; i < 6; ++i) EXPECT_TRUE(again->contains(BlockKey::from_u64(i + 1)));
  expect_round_trip(*again, data);
}

TEST(FileTier, PutOfHeldKeyIsOkWithoutRewrite) {
  TempDir dir;
  auto tier = FileTier::open(options_for(dir.path() / "t"));
  put_keys(*tier, 1, 100);
  const auto other = pattern(100, 42);
  const TierPut p{BlockKey::from_u64(1), other};
  const auto r = tier->put(std::span(&p, 1)).wait()[0];
  EXPECT_EQ(r.status, TierItemStatus::kOk);
  std::vector<std::byte> out(100);
  ASSERT_EQ(get_one(*tier, BlockKey::from_u64(1), out).status, TierItemStatus::kOk);
  EXPECT_EQ(out, pattern(100, 0));  // the first write stands
}

TEST(FileTier, ForcedBufferedNeverUsesODirect) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto o = options_for(dir.path() / "t");
  o.direct_io = DirectIoMode::kBuffered;
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  EXPECT_FALSE(tier->stats().direct_io);
  expect_round_trip(*tier, put_keys(*tier, 3, 5000));
  for (int f : io->open_flags_seen()) EXPECT_EQ(f & O_DIRECT, 0);
}

TEST(FileTier, FallsBackWhenOpenRefusesODirect) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  io->set_rule([](const FaultSyscalls::Call& c) {
    return c.op == Op::kOpenat && (c.flags & O_DIRECT) != 0 ? EINVAL : 0;
  });
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  EXPECT_TRUE(tier->stats().direct_io);  // not tried yet
  const auto data = put_keys(*tier, 4, 9000);
  EXPECT_FALSE(tier->stats().direct_io);
  expect_round_trip(*tier, data);
  // After the refusal every open is buffered.
  const auto seen = io->open_flags_seen();
  std::size_t direct = 0;
  for (int f : seen) direct += (f & O_DIRECT) != 0 ? 1U : 0U;
  EXPECT_GE(direct, 1u);
  EXPECT_LE(direct, 2u);  // at most one refused try per I/O thread racing the first
  for (const auto& f : test::files_under(dir.path() / "t")) EXPECT_FALSE(f.ends_with(".tmp")) << f;
}

TEST(FileTier, FallsBackWhenFirstWriteRefusesODirect) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  io->set_rule([](const FaultSyscalls::Call& c) {
    return (c.op == Op::kPwrite || c.op == Op::kPread) && (c.flags & O_DIRECT) != 0 ? EINVAL : 0;
  });
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  const auto data = put_keys(*tier, 4, 9000);
  EXPECT_FALSE(tier->stats().direct_io);
  expect_round_trip(*tier, data);
}

// The real filesystems here: whatever mode each one accepts, the bytes come back.
TEST(FileTier, RoundTripOnTmpAndShm) {
  for (const char* base : {"/tmp", "/dev/shm"}) {
    if (!std::filesystem::is_directory(base)) continue;
    TempDir dir(base);
    auto tier = FileTier::open(options_for(dir.path() / "t"));
    expect_round_trip(*tier, put_keys(*tier, 3, 70'000));
    RecordProperty(std::string("direct_io_") + (base[1] == 't' ? "tmp" : "shm"),
                   tier->stats().direct_io ? "yes" : "no");
  }
}

class DamagedRecord : public ::testing::Test {
 protected:
  void SetUp() override {
    tier_ = FileTier::open(options_for(dir_.path() / "t"));
    data_ = put_keys(*tier_, 3, 20'000);
    path_ = tier_->record_path(BlockKey::from_u64(2));
    ASSERT_TRUE(std::filesystem::exists(path_));
  }
  void flip_byte(std::uint64_t offset) {
    const int fd = ::open(path_.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
    b ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
    ::close(fd);
  }
  // Key 2 reads as a miss, its destination untouched, it is forgotten; keys 1 and 3 still read.
  void expect_key2_miss() {
    std::vector<std::byte> out(20'000, std::byte{0x77});
    const auto r = get_one(*tier_, BlockKey::from_u64(2), out);
    EXPECT_EQ(r.status, TierItemStatus::kMiss) << r.detail;
    EXPECT_TRUE(
        std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x77}; }));
    tier_->drain();
    EXPECT_FALSE(tier_->contains(BlockKey::from_u64(2)));
    EXPECT_FALSE(std::filesystem::exists(path_));
    std::vector<std::byte> ok(20'000);
    EXPECT_EQ(get_one(*tier_, BlockKey::from_u64(1), ok).status, TierItemStatus::kOk);
    EXPECT_EQ(ok, data_[0]);
    EXPECT_EQ(get_one(*tier_, BlockKey::from_u64(3), ok).status, TierItemStatus::kOk);
    EXPECT_EQ(ok, data_[2]);
  }

  TempDir dir_;
  std::unique_ptr<FileTier> tier_;
  std::vector<std::vector<std::byte>> data_;
  std::filesystem::path path_;
};

TEST_F(DamagedRecord, FlippedPayloadByteIsMiss) {
  flip_byte(64 + 12'345);
  expect_key2_miss();
  EXPECT_EQ(tier_->stats().corrupt, 1u);
}

TEST_F(DamagedRecord, FlippedHeaderByteIsMiss) {
  flip_byte(file_tier_record_bytes(20'000) - 64 + 16);  // the header's payload length
  expect_key2_miss();
}

TEST_F(DamagedRecord, FlippedByteOfThePayloadsLastBlockIsMiss) {
  flip_byte(19'999);  // the payload's remainder lives in the tail block with the header
  expect_key2_miss();
}

TEST_F(DamagedRecord, TruncatedFileIsMiss) {
  std::filesystem::resize_file(path_, 4096);
  expect_key2_miss();
}

TEST_F(DamagedRecord, UnalignedTruncationIsMiss) {
  std::filesystem::resize_file(path_, 20'000);
  expect_key2_miss();
}

TEST_F(DamagedRecord, MissingFileIsMiss) {
  std::filesystem::remove(path_);
  EXPECT_TRUE(tier_->contains(BlockKey::from_u64(2)));  // the index has not seen it yet
  expect_key2_miss();
}

TEST_F(DamagedRecord, RecordOfAnotherKeyIsMiss) {
  std::filesystem::copy_file(tier_->record_path(BlockKey::from_u64(1)), path_,
                             std::filesystem::copy_options::overwrite_existing);
  expect_key2_miss();
}

TEST_F(DamagedRecord, WrongLengthIsMissAndKeepsNothingTorn) {
  std::vector<std::byte> out(10'000, std::byte{0x77});
  const auto r = get_one(*tier_, BlockKey::from_u64(2), out);
  EXPECT_EQ(r.status, TierItemStatus::kMiss);
  EXPECT_TRUE(
      std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x77}; }));
}

TEST(FileTier, PartialReadFailureIsReportedPerItem) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  const auto data = put_keys(*tier, 4, 8192);
  const std::string bad = tier->record_path(BlockKey::from_u64(3)).string();
  io->set_rule([bad](const FaultSyscalls::Call& c) {
    return c.op == Op::kPread && c.path == bad ? EIO : 0;
  });
  std::vector<std::vector<std::byte>> out(5, std::vector<std::byte>(8192));
  std::vector<TierGet> gets;
  for (std::size_t i = 0; i < 5; ++i) gets.push_back({BlockKey::from_u64(i + 1), out[i]});
  const auto results = tier->get(gets).wait();
  ASSERT_EQ(results.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(results[i].key, BlockKey::from_u64(i + 1));
    if (i == 2) {
      EXPECT_EQ(results[i].status, TierItemStatus::kFailed);
      EXPECT_EQ(results[i].sys_errno, EIO);
      EXPECT_NE(results[i].detail.find("pread"), std::string::npos) << results[i].detail;
    } else if (i == 4) {
      EXPECT_EQ(results[i].status, TierItemStatus::kMiss);  // never stored
    } else {
      EXPECT_EQ(results[i].status, TierItemStatus::kOk) << results[i].detail;
      EXPECT_EQ(out[i], data[i]);
    }
  }
  // An I/O error is not proof of damage: the record stays.
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(3)));
  EXPECT_EQ(tier->stats().gets_failed, 1u);
}

TEST(FileTier, PartialWriteFailureIsReportedPerItemAndLeavesNoTemp) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  const std::string bad_hex = BlockKey::from_u64(2).to_hex();
  io->set_rule([bad_hex](const FaultSyscalls::Call& c) {
    // EIO: an ENOSPC would evict and retry (Note [Full disk]; full_disk_test.cpp).
    return c.op == Op::kPwrite && c.path.find(bad_hex) != std::string::npos ? EIO : 0;
  });
  std::vector<std::vector<std::byte>> data;
  std::vector<TierPut> puts;
  for (std::uint32_t i = 0; i < 3; ++i) data.push_back(pattern(6000, i));
  for (std::uint32_t i = 0; i < 3; ++i) puts.push_back({BlockKey::from_u64(i + 1), data[i]});
  const auto results = tier->put(puts).wait();
  EXPECT_EQ(results[0].status, TierItemStatus::kOk);
  EXPECT_EQ(results[1].status, TierItemStatus::kFailed);
  EXPECT_EQ(results[1].sys_errno, EIO);
  EXPECT_EQ(results[2].status, TierItemStatus::kOk);
  tier->drain();
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(1)));
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(2)));
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(3)));
  for (const auto& f : test::files_under(dir.path() / "t")) EXPECT_FALSE(f.ends_with(".tmp")) << f;
  const auto st = tier->stats();
  EXPECT_EQ(st.puts_failed, 1u);
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.bytes, 2 * file_tier_record_bytes(6000));
  // The key can be stored again once the fault is gone.
  io->set_rule(nullptr);
  EXPECT_EQ(tier->put(std::span(&puts[1], 1)).wait()[0].status, TierItemStatus::kOk);
  expect_round_trip(*tier, data);
}

// An interrupted read or write is retried (util/retry_eintr.hpp), never reported.
TEST(FileTier, InterruptedReadsAndWritesAreRetried) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  std::atomic<int> writes{0};
  std::atomic<int> reads{0};
  io->set_rule([&](const FaultSyscalls::Call& c) {
    if (c.op == Op::kPwrite) return ++writes == 1 ? EINTR : 0;
    if (c.op == Op::kPread) return ++reads == 1 ? EINTR : 0;
    return 0;
  });
  const auto data = put_keys(*tier, 1, 6000);
  expect_round_trip(*tier, data);
  // The interrupted call, then the record again: one pwrite/pread, or two when the payload is
  // 4 KiB-aligned and moves in place with its header block (which the allocator decides: TSan's
  // aligns this buffer, the others do not).
  EXPECT_GE(writes.load(), 2);
  EXPECT_LE(writes.load(), 3);
  EXPECT_GE(reads.load(), 2);
  EXPECT_LE(reads.load(), 3);
  EXPECT_EQ(tier->stats().puts_failed, 0u);
  EXPECT_EQ(tier->stats().gets_failed, 0u);
}

TEST(FileTier, RenameFailureIsReportedAndLeavesNoTemp) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  io->set_rule([](const FaultSyscalls::Call& c) { return c.op == Op::kRenameat ? EXDEV : 0; });
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  const auto d = pattern(100, 1);
  const TierPut p{BlockKey::from_u64(1), d};
  const auto r = tier->put(std::span(&p, 1)).wait()[0];
  EXPECT_EQ(r.status, TierItemStatus::kFailed);
  EXPECT_EQ(r.sys_errno, EXDEV);
  tier->drain();
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(1)));
  EXPECT_EQ(test::files_under(dir.path() / "t"), std::set<std::string>{".kvoffload-tier.lock"});
}

TEST(FileTier, ContainsDoesNotWaitForDiskIo) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  o.io_threads = 1;
  auto tier = FileTier::open(o);
  put_keys(*tier, 2, 100);

  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> entered;
  std::atomic<bool> entered_once{false};
  io->set_rule([&](const FaultSyscalls::Call& c) {
    if (c.op == Op::kPwrite) {
      if (!entered_once.exchange(true)) entered.set_value();
      released.wait();  // the disk is stuck until the test says otherwise
    }
    return 0;
  });
  const auto d = pattern(100, 9);
  const TierPut p{BlockKey::from_u64(50), d};
  TierBatch stuck = tier->put(std::span(&p, 1));
  entered.get_future().wait();  // the only I/O thread is inside pwrite now
  auto answers = std::async(std::launch::async, [&] {
    return std::array<bool, 3>{tier->contains(BlockKey::from_u64(1)),
                               tier->contains(BlockKey::from_u64(50)),
                               tier->contains(BlockKey::from_u64(77))};
  });
  const bool answered = answers.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(answered) << "contains() waited for the stuck write";
  EXPECT_FALSE(stuck.ready());
  release.set_value();
  ASSERT_EQ(stuck.wait()[0].status, TierItemStatus::kOk);
  const auto a = answers.get();
  EXPECT_TRUE(a[0]);
  EXPECT_FALSE(a[1]);  // not held until its write completed
  EXPECT_FALSE(a[2]);
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(50)));
}

TEST(FileTier, RemoveForgetsAndDeletes) {
  TempDir dir;
  auto tier = FileTier::open(options_for(dir.path() / "t"));
  put_keys(*tier, 3, 100);
  const auto path = tier->record_path(BlockKey::from_u64(2));
  const std::array<BlockKey, 2> keys{BlockKey::from_u64(2), BlockKey::from_u64(9)};
  EXPECT_EQ(tier->remove(keys).ok_count(), 2u);
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(2)));
  EXPECT_FALSE(std::filesystem::exists(path));
  std::vector<std::byte> out(100);
  EXPECT_EQ(get_one(*tier, BlockKey::from_u64(2), out).status, TierItemStatus::kMiss);
  EXPECT_EQ(get_one(*tier, BlockKey::from_u64(3), out).status, TierItemStatus::kOk);
}

TEST(FileTier, CapacityEvictsOldestFirst) {
  TempDir dir;
  const std::uint64_t rec = file_tier_record_bytes(5000);
  auto tier = FileTier::open(options_for(dir.path() / "t", 3 * rec));
  put_keys(*tier, 2, 5000);
  std::vector<std::byte> out(5000);
  ASSERT_EQ(get_one(*tier, BlockKey::from_u64(1), out).status,
            TierItemStatus::kOk);  // 1 is now newer than 2
  const auto d3 = pattern(5000, 3), d4 = pattern(5000, 4);
  const std::array<TierPut, 2> more{TierPut{BlockKey::from_u64(3), d3},
                                    TierPut{BlockKey::from_u64(4), d4}};
  EXPECT_EQ(tier->put(more).ok_count(), 2u);
  tier->drain();
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(2)));
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(1)));
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(3)));
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(4)));
  EXPECT_FALSE(std::filesystem::exists(tier->record_path(BlockKey::from_u64(2))));
  const auto st = tier->stats();
  EXPECT_EQ(st.entries, 3u);
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_LE(st.bytes, st.capacity_bytes);
  // A record larger than the whole capacity fails on its own.
  const auto big = pattern(4 * rec, 5);
  const TierPut p{BlockKey::from_u64(5), big};
  const auto r = tier->put(std::span(&p, 1)).wait()[0];
  EXPECT_EQ(r.status, TierItemStatus::kFailed);
  EXPECT_EQ(r.sys_errno, ENOSPC);
}

TEST(FileTier, SecondOwnerOfRootIsRefused) {
  TempDir dir;
  auto first = FileTier::open(options_for(dir.path() / "t"));
  try {
    (void)FileTier::open(options_for(dir.path() / "t"));
    FAIL() << "second open succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kState);
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  first->close();
  EXPECT_NO_THROW((void)FileTier::open(options_for(dir.path() / "t")));
}

TEST(FileTier, StaleTempFilesAreRemovedAndForeignFilesIgnored) {
  TempDir dir;
  const auto root = dir.path() / "t";
  {
    auto tier = FileTier::open(options_for(root));
    put_keys(*tier, 1, 100);
  }
  const auto fan = root / "01";
  std::ofstream(fan / ("." + BlockKey::from_u64(1).to_hex() + ".7.tmp")) << "partial";
  std::ofstream(fan / "notes.txt") << "not ours";
  std::ofstream(fan / (BlockKey::from_u64(2).to_hex() + ".kvb")) << "short";  // implausible size
  auto tier = FileTier::open(options_for(root));
  EXPECT_FALSE(std::filesystem::exists(fan / ("." + BlockKey::from_u64(1).to_hex() + ".7.tmp")));
  EXPECT_TRUE(std::filesystem::exists(fan / "notes.txt"));
  EXPECT_TRUE(tier->contains(BlockKey::from_u64(1)));
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(2)));
  EXPECT_EQ(tier->stats().entries, 1u);
}

TEST(FileTier, ValidationRefusesBadOptionsAndTouchesNothing) {
  TempDir dir;
  const auto file = dir.path() / "plain-file";
  std::ofstream(file) << "x";
  const auto before = test::files_under(dir.path());
  auto expect_invalid = [](const FileTierOptions& o, std::string_view needle) {
    try {
      (void)FileTier::open(o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid(options_for(""), "empty");
  expect_invalid(options_for("relative/dir"), "not absolute");
  expect_invalid(options_for(dir.path() / "t", 0), "capacity_bytes");
  expect_invalid(options_for(file), "not a directory");
  expect_invalid(options_for(dir.path() / "no" / "such" / "dir"), "parent");
  auto o = options_for(dir.path() / "t");
  o.io_threads = 0;
  expect_invalid(o, "io_threads");
  o.io_threads = 2;
  o.read_threads = 3;
  expect_invalid(o, "read_threads 3 exceeds io_threads 2");
  EXPECT_EQ(test::files_under(dir.path()), before);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "t"));
}

TEST(FileTier, FailedOpenLeavesNothingBehind) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  io->set_rule([](const FaultSyscalls::Call& c) { return c.op == Op::kFlock ? ENOLCK : 0; });
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  const auto fds = test::fd_snapshot();
  try {
    (void)FileTier::open(o);
    FAIL() << "open succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), ENOLCK);
    EXPECT_EQ(e.call(), "flock");
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "t"));
  EXPECT_EQ(test::fd_snapshot(), fds);
}

// The order in which a pool runs the tasks queued behind a blocked worker.
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
