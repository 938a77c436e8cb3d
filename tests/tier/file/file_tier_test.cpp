// FileTier keeping records: CRC32C, round trips and a reopen that indexes the records, the O_DIRECT
// fallback, tmp and shm roots, a non-blocking contains, remove, capacity eviction, one owner per
// root, stale temporary files, validation and a failed open that leaves nothing. The suite goes
// on in file_tier_failures_test.cpp (damaged records, failed I/O) and file_tier_io_test.cpp (the
// I/O pool and in-place aligned transfers); its kit is file_tier_test_util.hpp.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "file_tier_test_util.hpp"
#include "tier/file/crc32c.hpp"
#include "tier_test_util.hpp"

namespace kvoffload {
namespace {

using test::expect_round_trip;
using test::FaultSyscalls;
using test::get_one;
using test::Op;
using test::options_for;
using test::pattern;
using test::put_keys;
using TempDir = test::DiskTempDir;

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

// Note [Three-way CRC32C]: the hardware path joins three chains per block of 3 x 8 KiB and of
// 3 x 256 bytes; at every length around those blocks, at every start alignment and from a
// non-zero CRC, it must give the table's value.
TEST(Crc32c, ThreeWayBlocksAgreeWithThePortableOneAtEveryLengthAndAlignment) {
  const auto p = pattern((4U << 20) + 64, 11);
  for (const std::size_t offset : {0U, 1U, 3U, 7U}) {
    for (const std::size_t n :
         {0U, 1U, 7U, 8U, 767U, 768U, 769U, 1536U, 24575U, 24576U, 24577U, 24576U + 768U + 13U,
          3U * 24576U - 1U, 65536U, 100'003U, 1U << 20, (1U << 20) + 4096U - 64U, 4U << 20}) {
      const auto s = std::span(p).subspan(offset, n);
      ASSERT_EQ(detail::crc32c(s, 0x1234567u), detail::crc32c_portable(s, 0x1234567u))
          << n << " bytes at offset " << offset;
    }
  }
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

// Note [Shared root]: two tiers (two engine instances) on one root read each other's records;
// a record one removes is a plain miss for the other; an owner alone and sharers refuse each other.
TEST(FileTier, SharedRootServesEachOthersRecords) {
  TempDir dir;
  const auto root = dir.path() / "t";
  auto shared = [&] {
    FileTierOptions o = options_for(root);
    o.shared = true;
    return o;
  };
  auto a = FileTier::open(shared());
  auto b = FileTier::open(shared());
  const auto data = put_keys(*a, 3, 10'000);
  EXPECT_TRUE(b->contains(BlockKey::from_u64(2)));
  EXPECT_FALSE(b->contains(BlockKey::from_u64(9)));
  std::vector<TierPresence> seen(2);
  const std::vector<BlockKey> asked{BlockKey::from_u64(1), BlockKey::from_u64(9)};
  b->lookup(asked, seen);
  EXPECT_EQ(seen, (std::vector<TierPresence>{TierPresence::kPresent, TierPresence::kAbsent}));
  expect_round_trip(*b, data);
  EXPECT_EQ(b->stats().entries, 3U);  // read back valid: indexed
  EXPECT_EQ(b->stats().puts_ok, 0U);
  // b's put of a key a stored takes a's record (no rewrite: the file keeps a's inode).
  const std::vector<std::byte> more = pattern(10'000, 99);
  const TierPut put4{BlockKey::from_u64(4), more};
  ASSERT_EQ(a->put(std::span(&put4, 1)).wait()[0].status, TierItemStatus::kOk);
  struct stat before {};
  ASSERT_EQ(::stat(a->record_path(put4.key).c_str(), &before), 0);
  ASSERT_EQ(b->put(std::span(&put4, 1)).wait()[0].status, TierItemStatus::kOk);
  struct stat after {};
  ASSERT_EQ(::stat(a->record_path(put4.key).c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_TRUE(b->contains(put4.key));
  // a removes key 1: b, which indexed it, misses without calling it corrupt.
  const BlockKey gone = BlockKey::from_u64(1);
  ASSERT_EQ(a->remove(std::span(&gone, 1)).wait()[0].status, TierItemStatus::kOk);
  std::vector<std::byte> out(10'000);
  EXPECT_EQ(get_one(*b, gone, out).status, TierItemStatus::kMiss);
  EXPECT_EQ(b->stats().corrupt, 0U);
  EXPECT_FALSE(b->contains(gone));
  // A tier that owns the root alone is refused while sharers hold it, and the other way round.
  try {
    (void)FileTier::open(options_for(root));
    FAIL() << "an exclusive open of a shared root succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kState) << e.what();
  }
  a->close();
  b->close();
  auto owner = FileTier::open(options_for(root));
  try {
    (void)FileTier::open(shared());
    FAIL() << "a shared open of an owned root succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not share it"), std::string::npos) << e.what();
  }
}

// An opener of a shared root removes the temporary files of writers that are gone and leaves a
// live writer's (its write may be in flight).
TEST(FileTier, SharedRootRemovesOnlyTheTempFilesOfGoneWriters) {
  TempDir dir;
  const auto root = dir.path() / "t";
  FileTierOptions o = options_for(root);
  o.shared = true;
  auto first = FileTier::open(o);
  put_keys(*first, 1, 100);
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const auto fan = root / "01";
  const std::string hex = BlockKey::from_u64(1).to_hex();
  const auto live = fan / ("." + hex + "." + std::to_string(::getpid()) + "-7.tmp");
  const auto dead = fan / ("." + hex + "." + std::to_string(gone) + "-7.tmp");
  const auto owner = fan / ("." + hex + ".7.tmp");  // an exclusive owner's: gone
  for (const auto& p : {live, dead, owner}) std::ofstream(p) << "partial";
  auto second = FileTier::open(o);
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_FALSE(std::filesystem::exists(owner));
  EXPECT_EQ(second->stats().entries, 1U);  // the first one's record, indexed at open
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

}  // namespace
}  // namespace kvoffload
