// Every way Region::create_or_join refuses, each checked for what it leaves behind: the process's
// descriptors and file-backed mappings are the same before and after, and the file at the path
// (someone else's, or a live region) is untouched. A refused joiner that kept its descriptor
// (opened, then refused for owner or mode) would fail here.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "region/header.hpp"
#include "region_helpers.hpp"
#include "skip.hpp"
#include "test_env.hpp"

namespace kvoffload {
namespace {

using test::expect_error;
using test::small_options;
using test::TempDir;
using ::testing::HasSubstr;

// A file at the region's path that some process is attached to: held open with the shared
// liveness lock, as an attached process holds it, so a joiner does not reclaim it as stale.
class AttachedFile {
 public:
  AttachedFile(const std::filesystem::path& path, const std::string& bytes) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ < 0) throw std::runtime_error("open " + path.string());
    if (::write(fd_, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()) ||
        ::flock(fd_, LOCK_SH) != 0) {
      throw std::runtime_error("write/flock " + path.string());
    }
  }
  AttachedFile(const AttachedFile&) = delete;
  AttachedFile& operator=(const AttachedFile&) = delete;
  ~AttachedFile() { ::close(fd_); }

 private:
  int fd_ = -1;
};

// What a case leaves at the path for the attempt to meet (a live region, an attached file...).
using Held = std::shared_ptr<void>;

Held hold(Region region) {
  return std::make_shared<Region>(std::move(region));
}

struct RefusalCase {
  std::string name;
  // Prepares the path and the options of the refused attempt; returns what must stay alive.
  std::function<Held(const std::filesystem::path& dir, RegionOptions& attempt)> prepare;
  ErrorCode code;
  std::string needle;
  bool needs_root = false;
};

std::filesystem::path path_of(const std::filesystem::path& dir, const std::string& id) {
  return region_path(dir, id);
}

// A live region (this process is its creator) for the attempt to join as rank 1.
Held live_region(const std::filesystem::path& dir, RegionOptions& attempt) {
  attempt = small_options(dir, "refuse", 1);
  return hold(Region::create_or_join(small_options(dir, "refuse", 0)));
}

// Overwrites `bytes` at `offset` of the region file through a descriptor of its own.
void patch_file(const std::filesystem::path& path, off_t offset, const void* bytes, std::size_t n) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes, n, offset), static_cast<ssize_t>(n));
  ::close(fd);
}

std::vector<RefusalCase> refusal_cases() {
  std::vector<RefusalCase> cases;
  // ---- the joiner path ----
  cases.push_back({"WiderMode",
                   [](const auto& dir, RegionOptions& attempt) {
                     Held live = live_region(dir, attempt);
                     EXPECT_EQ(::chmod(path_of(dir, "refuse").c_str(), 0644), 0);
                     return live;
                   },
                   ErrorCode::kPermission, "has mode 0644"});
  cases.push_back({"AnotherOwner",
                   [](const auto& dir, RegionOptions& attempt) {
                     Held live = live_region(dir, attempt);
                     EXPECT_EQ(::chown(path_of(dir, "refuse").c_str(), 12345, 12345), 0);
                     return live;
                   },
                   ErrorCode::kPermission, "is owned by uid 12345", /*needs_root=*/true});
  cases.push_back({"NotARegularFile",
                   [](const auto& dir, RegionOptions& attempt) {
                     attempt = small_options(dir, "refuse", 1);
                     EXPECT_EQ(::mkfifo(path_of(dir, "refuse").c_str(), 0600), 0);
                     return Held();
                   },
                   ErrorCode::kPermission, "is not a regular file"});
  cases.push_back({"ADirectory",
                   [](const auto& dir, RegionOptions& attempt) {
                     attempt = small_options(dir, "refuse", 1);
                     std::filesystem::create_directory(path_of(dir, "refuse"));
                     return Held();
                   },
                   ErrorCode::kSystem, "EISDIR"});
  cases.push_back({"ASymbolicLink",
                   [](const auto& dir, RegionOptions& attempt) {
                     attempt = small_options(dir, "refuse", 1);
                     std::filesystem::create_symlink(dir / "elsewhere", path_of(dir, "refuse"));
                     return Held();
                   },
                   ErrorCode::kPermission, "is a symbolic link"});
  cases.push_back({"GeometryMismatch",
                   [](const auto& dir, RegionOptions& attempt) {
                     Held live = live_region(dir, attempt);
                     attempt.layout.slot_bytes = 4000;
                     return live;
                   },
                   ErrorCode::kMismatch, "slot_bytes=4000"});
  cases.push_back({"NotARegionHeader",
                   [](const auto& dir, RegionOptions& attempt) {
                     attempt = small_options(dir, "refuse", 1);
                     return Held(std::make_shared<AttachedFile>(path_of(dir, "refuse"),
                                                                std::string(4096, 'x')));
                   },
                   ErrorCode::kMismatch, "is not a kvoffload region"});
  cases.push_back({"ShorterThanAHeader",
                   [](const auto& dir, RegionOptions& attempt) {
                     attempt = small_options(dir, "refuse", 1);
                     return Held(std::make_shared<AttachedFile>(path_of(dir, "refuse"), "KVOFF"));
                   },
                   ErrorCode::kMismatch, "is shorter than a region header"});
  cases.push_back({"UnknownState",
                   [](const auto& dir, RegionOptions& attempt) {
                     Held live = live_region(dir, attempt);
                     const std::uint32_t state = 7;
                     patch_file(path_of(dir, "refuse"), offsetof(detail::RegionHeader, state),
                                &state, sizeof state);
                     return live;
                   },
                   ErrorCode::kMismatch, "has an unknown state 7"});
  cases.push_back({"ShorterThanItsGeometry",
                   [](const auto& dir, RegionOptions& attempt) {
                     Held live = live_region(dir, attempt);
                     EXPECT_EQ(::truncate(path_of(dir, "refuse").c_str(), 8192), 0);
                     return live;
                   },
                   ErrorCode::kMismatch, "is 8192 bytes, expected"});
  // ---- the creator path ----
  cases.push_back({"CapacityShortfall",
                   [](const auto& dir, RegionOptions& attempt) {
                     attempt = small_options(dir, "refuse", 0);
                     attempt.layout.num_chunks = 1ULL << 20;
                     attempt.layout.slot_bytes = 1ULL << 30;  // 2 PiB: no shm dir has it
                     return Held();
                   },
                   ErrorCode::kCapacity, "not enough shared memory"});
  cases.push_back({"ShmDirMissing",
                   [](const auto& dir, RegionOptions& attempt) {
                     attempt = small_options(dir / "missing", "refuse", 0);
                     return Held();
                   },
                   ErrorCode::kInvalidArgument, "does not exist"});
  return cases;
}

class Refusal : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(Refusal, LeavesNoDescriptorNoMappingAndThePathAsItWas) {
  const RefusalCase& c = GetParam();
  if (c.needs_root && ::geteuid() != 0) {
    KVO_SKIP("not-root") << "chown to another uid needs root";
  }
  const TempDir dir;
  RegionOptions attempt;
  const Held held = c.prepare(dir.path(), attempt);
  ASSERT_FALSE(HasFailure());
  attempt.join_timeout = std::chrono::milliseconds(10'000);
  const auto files = test::files_under(dir.path());
  struct stat before {};
  const bool existed = ::lstat(path_of(dir.path(), "refuse").c_str(), &before) == 0;
  const auto fds = test::fd_snapshot();
  const auto maps = test::maps_snapshot();

  const Error e = expect_error([&] { (void)Region::create_or_join(attempt); });
  EXPECT_EQ(e.code(), c.code) << e.what();
  EXPECT_THAT(e.what(), HasSubstr(c.needle));

  EXPECT_EQ(test::fd_snapshot(), fds) << "a descriptor of the refused attempt is still open";
  EXPECT_EQ(test::maps_snapshot(), maps) << "a mapping of the refused attempt is still there";
  EXPECT_EQ(test::files_under(dir.path()), files);
  struct stat after {};
  const bool exists = ::lstat(path_of(dir.path(), "refuse").c_str(), &after) == 0;
  ASSERT_EQ(exists, existed);
  if (existed) {
    EXPECT_EQ(after.st_ino, before.st_ino) << "the file at the path was replaced";
    EXPECT_EQ(after.st_mode, before.st_mode);
    EXPECT_EQ(after.st_uid, before.st_uid);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPath, Refusal, ::testing::ValuesIn(refusal_cases()),
                         [](const auto& pi) { return pi.param.name; });

}  // namespace
}  // namespace kvoffload
