// A file tier on a full disk (Note [Full disk] in file_tier.hpp): capacity capped by the free
// space at open and at every put batch, ENOSPC evicting the oldest records round after round until
// the record fits or no record is left, rate-limited warnings (util/rate_limited_log.hpp). Through
// the FaultSyscalls seam, and on a real 1 MiB tmpfs in a private mount namespace where the test
// may mount one.

#include <fcntl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>

#include "private_tmpfs.hpp"
#include "skip.hpp"
#include "tier_test_util.hpp"
#include "util/log.hpp"
#include "util/rate_limited_log.hpp"

namespace kvoffload {
namespace {

using test::FaultSyscalls;
using test::Op;
using TempDir = test::DiskTempDir;
using ::testing::HasSubstr;

constexpr std::size_t kPayload = 60000;
const std::uint64_t kRec = file_tier_record_bytes(kPayload);  // 61440

std::vector<std::byte> payload(std::uint64_t seed) {
  std::vector<std::byte> v(kPayload);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::byte>((seed * 131 + i * 7) & 0xFF);
  return v;
}

TierItemResult put_one(SecondaryTier& tier, std::uint64_t id, const std::vector<std::byte>& bytes) {
  const TierPut p{BlockKey::from_u64(id), bytes};
  return tier.put(std::span(&p, 1)).wait()[0];
}

bool reads_back(SecondaryTier& tier, std::uint64_t id) {
  std::vector<std::byte> out(kPayload);
  const TierGet g{BlockKey::from_u64(id), out};
  return tier.get(std::span(&g, 1)).wait()[0].status == TierItemStatus::kOk && out == payload(id);
}

FileTierOptions opts(const std::filesystem::path& root,
                     const std::shared_ptr<FaultSyscalls>& io = nullptr) {
  FileTierOptions o;
  o.root = root;
  o.capacity_bytes = 1ULL << 30;  // the run command's default: far more than the disk holds
  o.io_threads = 1;               // one worker: task order is submission order
  o.syscalls = io ? io->get() : nullptr;
  return o;
}

// Captures the library's log lines for the life of the object.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    sink_->set_pattern("%v");
    log().sinks().push_back(sink_);
    level_ = log().level();
    log().set_level(spdlog::level::warn);
  }
  ~LogCapture() {
    auto& sinks = log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    log().set_level(level_);
  }
  std::vector<std::string> lines_with(const std::string& needle) {
    std::vector<std::string> out;
    std::istringstream in(out_.str());
    for (std::string line; std::getline(in, line);) {
      if (line.find(needle) != std::string::npos) out.push_back(line);
    }
    return out;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

TEST(RateLimitedLog, OneLinePerCausePerIntervalWithTheCountHeldBack) {
  auto now = detail::RateLimitedLog::Clock::time_point{} + std::chrono::hours(1);
  detail::RateLimitedLog limiter(std::chrono::seconds(10), [&] { return now; });
  EXPECT_EQ(limiter.admit("ENOSPC"), std::optional<std::uint64_t>(0));
  for (int i = 0; i < 749; ++i) EXPECT_EQ(limiter.admit("ENOSPC"), std::nullopt);
  EXPECT_EQ(limiter.admit("EIO"), std::optional<std::uint64_t>(0));  // its own cause
  now += std::chrono::milliseconds(9999);
  EXPECT_EQ(limiter.admit("ENOSPC"), std::nullopt);
  now += std::chrono::milliseconds(1);
  EXPECT_EQ(limiter.admit("ENOSPC"), std::optional<std::uint64_t>(750));
  EXPECT_EQ(limiter.admit("ENOSPC"), std::nullopt);

  LogCapture capture;
  EXPECT_EQ(limiter.flush("tier x"), 1U);  // ENOSPC holds one; EIO none
  EXPECT_EQ(capture.lines_with("tier x"),
            std::vector<std::string>{
                "tier x: 1 more 'ENOSPC' events held back since the last such line"});
  EXPECT_EQ(limiter.flush("tier x"), 0U);
  now += std::chrono::seconds(10);
  EXPECT_TRUE(limiter.warn("ENOSPC", "put {} failed", 7));
  EXPECT_EQ(capture.lines_with("put 7"), std::vector<std::string>{"put 7 failed"});
}

TEST(FullDisk, CapacityIsCappedByTheFreeSpaceAtOpen) {
  const TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  io->set_filesystem_bytes(5 * kRec);
  auto tier = FileTier::open(opts(dir.path() / "t", io));
  EXPECT_EQ(tier->stats().capacity_bytes, 5 * kRec);  // not the configured 1 GiB
  for (std::uint64_t id = 1; id <= 8; ++id) {
    ASSERT_EQ(put_one(*tier, id, payload(id)).status, TierItemStatus::kOk) << id;
  }
  tier->drain();
  const TierStats st = tier->stats();
  EXPECT_EQ(st.entries, 5U);
  EXPECT_EQ(st.evictions, 3U);
  EXPECT_EQ(st.puts_failed, 0U);
  for (std::uint64_t id = 1; id <= 3; ++id)
    EXPECT_FALSE(tier->contains(BlockKey::from_u64(id))) << id;
  for (std::uint64_t id = 4; id <= 8; ++id) EXPECT_TRUE(reads_back(*tier, id)) << id;
  EXPECT_EQ(test::files_under(dir.path() / "t").size(), 6U);  // 5 records + the lock file
}

TEST(FullDisk, CapacityIsRecheckedAsItRuns) {
  const TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  io->set_filesystem_bytes(10 * kRec);
  auto tier = FileTier::open(opts(dir.path() / "t", io));
  for (std::uint64_t id = 1; id <= 4; ++id)
    ASSERT_EQ(put_one(*tier, id, payload(id)).status, TierItemStatus::kOk);
  EXPECT_EQ(tier->stats().capacity_bytes, 10 * kRec);
  // Someone else fills the disk: one record's worth is left besides our four.
  io->set_filesystem_bytes(5 * kRec);
  std::vector<std::vector<std::byte>> data{payload(5), payload(6), payload(7)};
  const std::vector<TierPut> puts{{BlockKey::from_u64(5), data[0]},
                                  {BlockKey::from_u64(6), data[1]},
                                  {BlockKey::from_u64(7), data[2]}};
  for (const auto& r : tier->put(puts).wait()) EXPECT_EQ(r.status, TierItemStatus::kOk) << r.detail;
  tier->drain();
  const TierStats st = tier->stats();
  EXPECT_EQ(st.capacity_bytes, 5 * kRec);  // 4 held + 1 free
  EXPECT_EQ(st.entries, 5U);
  EXPECT_EQ(st.evictions, 2U);
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(1)));
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(2)));
  for (std::uint64_t id = 3; id <= 7; ++id) EXPECT_TRUE(reads_back(*tier, id)) << id;
}

// Setting a record's header attribute (format 3, Note [File tier record]) can meet a full disk
// too (a filesystem that keeps it outside the inode): the same eviction and retry as a write's.
TEST(FullDisk, EnospcSettingTheHeaderEvictsTheOldestAndRetries) {
  const TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto tier = FileTier::open(opts(dir.path() / "t", io));
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(put_one(*tier, id, payload(id)).status, TierItemStatus::kOk);
  const std::string key4 = BlockKey::from_u64(4).to_hex();
  std::atomic<int> sets4{0};
  io->set_rule([&](const FaultSyscalls::Call& c) {
    if (c.op != Op::kFsetxattr || c.path.find(key4) == std::string::npos) return 0;
    return ++sets4 == 1 ? ENOSPC : 0;
  });
  const TierItemResult r = put_one(*tier, 4, payload(4));
  EXPECT_EQ(r.status, TierItemStatus::kOk) << r.detail;
  EXPECT_EQ(sets4.load(), 2);
  tier->drain();
  EXPECT_EQ(tier->stats().evictions, 1U);
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(1)));  // the oldest
  for (std::uint64_t id = 2; id <= 4; ++id) EXPECT_TRUE(reads_back(*tier, id)) << id;
  EXPECT_EQ(test::files_under(dir.path() / "t").size(), 4U);  // 3 records and the lock file
}

TEST(FullDisk, EnospcEvictsTheOldestAndRetriesUntilNoRecordIsLeft) {
  const TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  auto tier = FileTier::open(opts(dir.path() / "t", io));
  for (std::uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(put_one(*tier, id, payload(id)).status, TierItemStatus::kOk);
  const std::string key4 = BlockKey::from_u64(4).to_hex();
  std::atomic<int> writes4{0};
  io->set_rule([&](const FaultSyscalls::Call& c) {
    if (c.op != Op::kPwrite || c.path.find(key4) == std::string::npos) return 0;
    return ++writes4 == 1 ? ENOSPC : 0;  // the disk is full once
  });
  const TierItemResult r = put_one(*tier, 4, payload(4));
  EXPECT_EQ(r.status, TierItemStatus::kOk) << r.detail;
  // One ENOSPC, then the record once more, in one pwritev.
  EXPECT_EQ(writes4.load(), 2);
  tier->drain();
  EXPECT_EQ(tier->stats().evictions, 1U);
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(1)));  // the oldest
  EXPECT_FALSE(std::filesystem::exists(tier->record_path(BlockKey::from_u64(1))));
  for (std::uint64_t id = 2; id <= 4; ++id) EXPECT_TRUE(reads_back(*tier, id)) << id;

  // Full for good: a record evicted per round (each frees one record's bytes, what the write
  // needs) until none is left, then a failure that says so; no temp file stays.
  writes4 = 0;
  const std::string key5 = BlockKey::from_u64(5).to_hex();
  io->set_rule([&](const FaultSyscalls::Call& c) {
    if (c.op != Op::kPwrite || c.path.find(key5) == std::string::npos) return 0;
    ++writes4;
    return ENOSPC;
  });
  const TierItemResult f = put_one(*tier, 5, payload(5));
  EXPECT_EQ(f.status, TierItemStatus::kFailed);
  EXPECT_EQ(f.sys_errno, ENOSPC);
  EXPECT_THAT(f.detail,
              HasSubstr("(no record left to evict, after evicting 3 records in 3 rounds; the "
                        "filesystem of " +
                        (dir.path() / "t").string() + " is held by other files and by " +
                        std::to_string(kRec) + " bytes of this tier's writes in flight, "));
  EXPECT_THAT(f.detail, HasSubstr(" bytes free)"));
  EXPECT_EQ(writes4.load(), 4);  // the first write and one per round
  tier->drain();
  const TierStats st = tier->stats();
  EXPECT_EQ(st.evictions, 4U);
  EXPECT_EQ(st.entries, 0U);
  EXPECT_EQ(st.puts_failed, 1U);
  EXPECT_FALSE(tier->contains(BlockKey::from_u64(5)));
  EXPECT_EQ(test::files_under(dir.path() / "t").size(), 1U);  // the lock file
}

TEST(FullDisk, RepeatedFailuresAreRateLimitedAndCounted) {
  const TempDir dir;
  auto io = std::make_shared<FaultSyscalls>();
  io->set_filesystem_bytes(0);  // nothing fits: every put fails at once
  LogCapture capture;
  {
    auto tier = FileTier::open(opts(dir.path() / "t", io));
    EXPECT_EQ(tier->stats().capacity_bytes, 0U);
    for (std::uint64_t id = 1; id <= 300; ++id) {
      const TierItemResult r = put_one(*tier, id, payload(id));
      ASSERT_EQ(r.status, TierItemStatus::kFailed);
      ASSERT_EQ(r.sys_errno, ENOSPC);
    }
    EXPECT_EQ(tier->stats().puts_failed, 300U);
    tier->close();  // flushes what is held back
  }
  // Every failure is accounted for: each line stands for itself plus the count it carries.
  const auto lines = capture.lines_with("': put of ");
  ASSERT_FALSE(lines.empty());
  EXPECT_LT(lines.size(), 300U);
  std::uint64_t total = 0;
  const std::regex held(R"(\((\d+) more like this held back)"),
      flushed(R"(: (\d+) more 'put ENOSPC' events)");
  for (const auto& line : lines) {
    EXPECT_THAT(line, HasSubstr("capped by the free space of"));
    total += 1;
    std::smatch m;
    if (std::regex_search(line, m, held)) total += std::stoull(m[1]);
  }
  for (const auto& line : capture.lines_with("more 'put ENOSPC' events")) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, flushed)) << line;
    total += std::stoull(m[1]);
  }
  EXPECT_EQ(total, 300U);
}

// A real 1 MiB tmpfs in a private mount namespace (needs CAP_SYS_ADMIN; skipped with the failing
// step and errno otherwise).
TEST(FullDisk, RealSmallTmpfsStaysWithinItsSpaceAndSurvivesAFullDisk) {
  const auto result = test::run_on_private_tmpfs("1m", [](const std::filesystem::path& mnt) {
    int code = 0;
    auto check = [&](bool ok, int fail_code, const std::string& what) {
      if (!ok && code == 0) {
        (void)std::fprintf(stderr, "check %d failed: %s\n", fail_code, what.c_str());
        code = fail_code;
      }
    };
    struct statvfs vfs {};
    ::statvfs(mnt.c_str(), &vfs);
    const std::uint64_t free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    auto io = std::make_shared<FaultSyscalls>();
    auto tier = FileTier::open(opts(mnt, io));
    check(tier->stats().capacity_bytes == free, 1,
          std::to_string(tier->stats().capacity_bytes) + " != " + std::to_string(free));
    const std::uint64_t fit = free / kRec;  // 17 records of 60 KiB in 1 MiB
    for (std::uint64_t id = 1; id <= 2 * fit; ++id) {
      const TierItemResult r = put_one(*tier, id, payload(id));
      check(r.status == TierItemStatus::kOk, 2, std::to_string(id) + ": " + r.detail);
    }
    tier->drain();
    TierStats st = tier->stats();
    check(st.entries == fit && st.evictions == fit && st.puts_failed == 0, 3,
          std::to_string(st.entries) + " entries, " + std::to_string(st.evictions) + " evictions");
    // Another writer takes every free byte between the tier's measurement and its write (when
    // the record's temp file is opened): the write meets a real ENOSPC, the tier evicts its
    // oldest record and retries.
    const std::string key = BlockKey::from_u64(1000).to_hex();
    bool filled = false;
    io->set_rule([&](const FaultSyscalls::Call& c) {
      if (filled || c.op != Op::kOpenat || c.path.find(key) == std::string::npos) return 0;
      filled = true;
      struct statvfs now {};
      ::statvfs(mnt.c_str(), &now);
      const auto rest = static_cast<off_t>(static_cast<std::uint64_t>(now.f_bavail) * now.f_frsize);
      const int fd = ::open((mnt / "filler").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
      check(fd >= 0 && rest > 0 && ::fallocate(fd, 0, 0, rest) == 0, 4, "filler");
      ::close(fd);
      return 0;
    });
    const std::uint64_t evictions_before = st.evictions;
    const TierItemResult r = put_one(*tier, 1000, payload(1000));
    check(filled, 5, "the rule never ran");
    check(r.status == TierItemStatus::kOk, 6, r.detail);
    check(reads_back(*tier, 1000), 7, "read back");
    tier->drain();
    st = tier->stats();
    // One eviction to fit the capacity measured at the put, one more after the ENOSPC.
    check(st.puts_failed == 0 && st.evictions == evictions_before + 2 && st.entries == fit - 1, 8,
          std::to_string(st.entries) + " entries, " + std::to_string(st.evictions) + " evictions");
    tier->close();
    return code;
  });
  if (!result.skip_reason.empty()) KVO_SKIP("no-mount-namespace") << result.skip_reason;
  ASSERT_TRUE(WIFEXITED(result.wait_status)) << result.wait_status;
  EXPECT_EQ(result.exit_code, 0);
}

// The disk fills again after the first eviction (the tier's other I/O threads, or another
// process, take the space it freed): the tier evicts again, round after round, until the record
// fits. Before, one retry only: "No space left on device (again after evicting 1 records)".
TEST(FullDisk, EnospcAgainAfterEvictingEvictsAgainUntilTheRecordFits) {
  const auto result = test::run_on_private_tmpfs("1m", [](const std::filesystem::path& mnt) {
    int code = 0;
    auto check = [&](bool ok, int fail_code, const std::string& what) {
      if (!ok && code == 0) {
        (void)std::fprintf(stderr, "check %d failed: %s\n", fail_code, what.c_str());
        code = fail_code;
      }
    };
    auto io = std::make_shared<FaultSyscalls>();
    auto tier = FileTier::open(opts(mnt, io));
    const std::uint64_t fit = tier->stats().capacity_bytes / kRec;
    for (std::uint64_t id = 1; id <= fit; ++id) {
      const TierItemResult r = put_one(*tier, id, payload(id));
      check(r.status == TierItemStatus::kOk, 1, std::to_string(id) + ": " + r.detail);
    }
    tier->drain();
    const TierStats before = tier->stats();
    check(before.entries == fit && before.puts_failed == 0, 2,
          std::to_string(before.entries) + " entries of " + std::to_string(fit));
    // Just before each of the new record's first three writes, another file takes every free
    // byte (what the previous round's eviction freed included): three real ENOSPCs.
    const std::string key = BlockKey::from_u64(1000).to_hex();
    int fills = 0;
    io->set_rule([&](const FaultSyscalls::Call& c) {
      if (fills == 3 || c.op != Op::kPwrite || c.path.find(key) == std::string::npos) return 0;
      struct statvfs now {};
      ::statvfs(mnt.c_str(), &now);
      const auto rest = static_cast<off_t>(static_cast<std::uint64_t>(now.f_bavail) * now.f_frsize);
      const auto filler = mnt / ("filler" + std::to_string(++fills));
      const int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
      check(fd >= 0 && rest > 0 && ::fallocate(fd, 0, 0, rest) == 0, 3,
            filler.string() + " of " + std::to_string(rest) + " bytes");
      ::close(fd);
      return 0;
    });
    const TierItemResult r = put_one(*tier, 1000, payload(1000));
    check(fills == 3, 4, std::to_string(fills) + " fills");
    check(r.status == TierItemStatus::kOk, 5, r.detail);
    check(reads_back(*tier, 1000), 6, "read back");
    tier->drain();
    const TierStats st = tier->stats();
    // One eviction to fit the capacity measured at the put, then one per ENOSPC.
    check(st.puts_failed == 0 && st.evictions == before.evictions + 4 && st.entries == fit - 3, 7,
          std::to_string(st.entries) + " entries, " + std::to_string(st.evictions) + " evictions");
    for (std::uint64_t id = 1; id <= 4; ++id)
      check(!tier->contains(BlockKey::from_u64(id)), 8, std::to_string(id) + " still held");
    for (std::uint64_t id = 5; id <= fit; ++id) check(reads_back(*tier, id), 9, std::to_string(id));
    tier->close();
    return code;
  });
  if (!result.skip_reason.empty()) KVO_SKIP("no-mount-namespace") << result.skip_reason;
  ASSERT_TRUE(WIFEXITED(result.wait_status)) << result.wait_status;
  EXPECT_EQ(result.exit_code, 0);
}

}  // namespace
}  // namespace kvoffload
