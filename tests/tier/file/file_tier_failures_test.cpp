// FileTier when the disk goes wrong: every kind of damaged record (flipped bytes, truncation, a
// missing file, another key's record, a wrong length) is a miss, and failed, partial, interrupted
// reads and writes and a failed rename are reported per item and leave no temporary file; a key
// removed while its write is in flight is never renamed into place.

#include <fcntl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "file_tier_test_util.hpp"
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
  // The value of the record's header attribute (Note [File tier record], format 3).
  [[nodiscard]] std::vector<unsigned char> header_attribute() const {
    std::vector<unsigned char> v(256);
    const ssize_t n = ::getxattr(path_.c_str(), "user.kvoffload.v3", v.data(), v.size());
    EXPECT_GE(n, 0) << std::strerror(errno);
    v.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    return v;
  }
  void set_header_attribute(const std::vector<unsigned char>& v) const {
    ASSERT_EQ(::setxattr(path_.c_str(), "user.kvoffload.v3", v.data(), v.size(), 0), 0)
        << std::strerror(errno);
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
  std::vector<unsigned char> header = header_attribute();
  ASSERT_EQ(header.size(), 32U);
  header[0] ^= 0x01;  // the header's payload length
  set_header_attribute(header);
  expect_key2_miss();
}

TEST_F(DamagedRecord, HeaderAttributeOfAnotherSizeIsMiss) {
  std::vector<unsigned char> header = header_attribute();
  header.pop_back();
  set_header_attribute(header);
  std::vector<std::byte> out(20'000);
  EXPECT_EQ(get_one(*tier_, BlockKey::from_u64(2), out).detail,
            "header attribute of 31 bytes, expected 32");
  expect_key2_miss();
}

// Without its header attribute a record reads as one of format 2 (header in a trailer), which it
// is not: a miss, dropped.
TEST_F(DamagedRecord, MissingHeaderAttributeIsMiss) {
  ASSERT_EQ(::removexattr(path_.c_str(), "user.kvoffload.v3"), 0);
  std::vector<std::byte> out(20'000);
  EXPECT_EQ(get_one(*tier_, BlockKey::from_u64(2), out).detail,
            "bad magic or version (not a record, or one of an earlier format)");
  expect_key2_miss();
}

TEST_F(DamagedRecord, FlippedByteOfThePayloadsLastBlockIsMiss) {
  flip_byte(19'999);  // the payload's remainder lives in the tail block with the header
  expect_key2_miss();
}

TEST_F(DamagedRecord, TruncatedFileIsMiss) {
  std::filesystem::resize_file(path_, 4096);
  // Refused when the read ends early (no fstat per read; the detail says so).
  std::vector<std::byte> out(20'000);
  EXPECT_EQ(get_one(*tier_, BlockKey::from_u64(2), out).detail, "record ends early (short file)");
  expect_key2_miss();  // and it is forgotten
}

TEST_F(DamagedRecord, UnalignedTruncationIsMiss) {
  const bool direct = tier_->stats().direct_io;
  std::filesystem::resize_file(path_, 20'000);
  expect_key2_miss();
  // Without the fstat the read runs into the end of the file: that must not read as the
  // filesystem refusing O_DIRECT.
  EXPECT_EQ(tier_->stats().direct_io, direct);
}

// A record with bytes after its end (the tier never writes one) reads by its length: the record
// within it verifies, so it is a hit; the bytes after it are never read.
TEST_F(DamagedRecord, BytesAfterTheRecordAreIgnored) {
  const auto rec = file_tier_record_bytes(20'000);
  std::filesystem::resize_file(path_, rec + 4096);
  std::vector<std::byte> out(20'000);
  EXPECT_EQ(get_one(*tier_, BlockKey::from_u64(2), out).status, TierItemStatus::kOk);
  EXPECT_EQ(out, data_[1]);
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
  // The interrupted call, then the record again in one call (a record's pieces -- its payload
  // blocks in place when 4 KiB-aligned, its tail -- go in one pwritev / preadv).
  EXPECT_EQ(writes.load(), 2);
  EXPECT_EQ(reads.load(), 2);
  EXPECT_EQ(tier->stats().puts_failed, 0u);
  EXPECT_EQ(tier->stats().gets_failed, 0u);
}

// A key removed while its put is writing: the put fails (ECANCELED, "removed while being stored")
// instead of renaming its record into place, and leaves no file. The put's write waits, inside
// its first pwrite, until the remove has finished.
TEST(FileTier, APutWhoseKeyIsRemovedDuringItsWriteIsNotRenamedIntoPlace) {
  TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto o = options_for(dir.path() / "t");
  o.syscalls = io->get();
  auto tier = FileTier::open(o);
  const BlockKey key = BlockKey::from_u64(5);
  const std::string hex = key.to_hex();
  std::promise<void> writing;
  std::promise<void> removed;
  std::shared_future<void> removed_done = removed.get_future().share();
  std::atomic<int> writes{0};
  io->set_rule([&](const FaultSyscalls::Call& c) {
    if (c.op == Op::kPwrite && c.path.find(hex) != std::string::npos && ++writes == 1) {
      writing.set_value();
      removed_done.wait();
    }
    return 0;
  });
  const auto d = pattern(6000, 3);
  const TierPut p{key, d};
  TierBatch put = tier->put(std::span(&p, 1));
  writing.get_future().wait();
  EXPECT_EQ(tier->remove(std::span(&key, 1)).wait()[0].status, TierItemStatus::kOk);
  removed.set_value();
  const auto r = put.wait()[0];
  EXPECT_EQ(r.status, TierItemStatus::kFailed);
  EXPECT_EQ(r.sys_errno, ECANCELED);
  EXPECT_EQ(r.detail, "removed while being stored");
  tier->drain();
  io->set_rule(nullptr);
  EXPECT_FALSE(tier->contains(key));
  EXPECT_FALSE(std::filesystem::exists(tier->record_path(key)));
  EXPECT_EQ(test::files_under(dir.path() / "t"), std::set<std::string>{".kvoffload-tier.lock"});
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

}  // namespace
}  // namespace kvoffload
