// What is junk (Note [What is ours to remove] in core/src/region/ownership.hpp): a damaged or
// foreign file under a region's name is "not a region" to list, skipped by clean and refused,
// never removed, by a process creating the region there. Each entry is judged by all three.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "region/header.hpp"
#include "region_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload {
namespace {

using test::expect_error;
using test::small_options;
using test::TempDir;
using ::testing::HasSubstr;

detail::RegionHeader read_file_header(const std::filesystem::path& path) {
  detail::RegionHeader h{};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  EXPECT_TRUE(in.good()) << path;
  return h;
}

void write_file_header(const std::filesystem::path& path, const detail::RegionHeader& h) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  ::close(fd);
}

void write_file(const std::filesystem::path& path, const std::string& bytes, mode_t mode) {
  { std::ofstream(path, std::ios::binary) << bytes; }
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct JunkCase {
  std::string name;
  // Leaves an entry at the region's path for engine "junk" in `dir`.
  std::function<void(const std::filesystem::path& dir)> make;
  std::string reason;  // what list, clean and create all say about it
};

std::filesystem::path junk_path(const std::filesystem::path& dir) {
  return region_path(dir, "junk");
}

// A stale region whose header is then edited by `edit`.
void stale_then(const std::filesystem::path& dir,
                const std::function<void(detail::RegionHeader&)>& edit) {
  test::make_stale_region(small_options(dir, "junk"));
  detail::RegionHeader h = read_file_header(junk_path(dir));
  edit(h);
  write_file_header(junk_path(dir), h);
}

std::vector<JunkCase> junk_cases() {
  return {
      {"EightBytes", [](const auto& dir) { write_file(junk_path(dir), "12345678", 0600); },
       "shorter than a region header; not a region file"},
      {"EightBytesWiderMode", [](const auto& dir) { write_file(junk_path(dir), "12345678", 0644); },
       "has mode 0644, wider than the 0600"},
      {"BadMagic",
       [](const auto& dir) { write_file(junk_path(dir), std::string(16384, 'x'), 0600); },
       "no region header (bad magic or version); not a region file"},
      {"ChunkCountEdited",  // the 64 -> 255: the checksum no longer matches
       [](const auto& dir) { stale_then(dir, [](auto& h) { h.num_chunks = 255; }); },
       "corrupt header (its checksum does not match its fields"},
      {"WorldSizeEdited",  // 2 -> 256
       [](const auto& dir) { stale_then(dir, [](auto& h) { h.world_size = 256; }); },
       "corrupt header (its checksum does not match its fields"},
      {"ChunkCountEditedWithAMatchingChecksum",  // the size check catches what the sum cannot
       [](const auto& dir) {
         stale_then(dir, [](auto& h) {
           h.num_chunks = 255;
           h.data_bytes = 255 * h.row_stride;
           h.checksum = detail::header_checksum(h);
         });
       },
       "bytes but its header's geometry (255 chunks, world_size 2) needs"},
      {"OffsetsEditedWithAMatchingChecksum",
       [](const auto& dir) {
         stale_then(dir, [](auto& h) {
           h.row_stride *= 2;
           h.checksum = detail::header_checksum(h);
         });
       },
       "corrupt header (its offsets and strides disagree with its geometry)"},
  };
}

class Junk : public ::testing::TestWithParam<JunkCase> {};

TEST_P(Junk, ListCleanAndCreateAllCallItNotARegionAndNoneRemovesIt) {
  const JunkCase& c = GetParam();
  const TempDir dir;
  c.make(dir.path());
  ASSERT_FALSE(HasFailure());
  const std::filesystem::path path = junk_path(dir.path());
  const std::string before = file_bytes(path);

  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  if (c.name != "EightBytesWiderMode") {  // list shows every user's regions: no owner rule there
    EXPECT_THAT(listed[0].problem, HasSubstr(c.reason));
    EXPECT_FALSE(listed[0].geometry.has_value());
  }

  const CleanResult cleaned = clean_regions(dir.path());
  EXPECT_TRUE(cleaned.removed.empty());
  EXPECT_TRUE(cleaned.kept.empty()) << "kept means in use; nothing holds this file";
  ASSERT_EQ(cleaned.skipped.size(), 1U);
  EXPECT_THAT(cleaned.skipped[0].reason, HasSubstr(c.reason));

  const Error e =
      expect_error([&] { (void)Region::create_or_join(small_options(dir.path(), "junk")); });
  EXPECT_EQ(e.code(),
            c.name == "EightBytesWiderMode" ? ErrorCode::kPermission : ErrorCode::kMismatch);
  EXPECT_THAT(e.what(), HasSubstr(c.reason));
  EXPECT_THAT(e.what(), HasSubstr(path.string()));
  EXPECT_EQ(file_bytes(path), before) << "the file was changed or removed";
}

INSTANTIATE_TEST_SUITE_P(Region, Junk, ::testing::ValuesIn(junk_cases()),
                         [](const auto& test_case) { return test_case.param.name; });

// The counterpart: an intact stale region is ours, and both clean and create remove it.
TEST(JunkRule, AnIntactStaleRegionIsRemovedByCleanAndReclaimedByCreate) {
  const TempDir dir;
  test::make_stale_region(small_options(dir.path(), "junk"));
  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].problem, "");
  EXPECT_TRUE(listed[0].stale);
  EXPECT_EQ(clean_regions(dir.path()).removed.size(), 1U);
  test::make_stale_region(small_options(dir.path(), "junk"));
  Region r = Region::create_or_join(small_options(dir.path(), "junk"));
  EXPECT_EQ(r.role(), RegionRole::kCreator);
}

// Note [Old formats]: a stale region an older kvoffload left (format 1 to 3: same leading fields,
// no checksum) is ours: list names its format, clean removes it, and a process creating the
// region at its path reclaims it, as `run` does, under the one rule; held, it is kept.
class OldFormat : public ::testing::TestWithParam<std::uint32_t> {};

void make_old_format(const std::filesystem::path& dir, std::uint32_t version) {
  stale_then(dir, [&](auto& h) {
    h.version = version;
    h.checksum = 0;  // formats before 4 had none; the bytes there were zero
  });
}

TEST_P(OldFormat, AStaleOneIsListedAsOldAndRemovedByCleanAndByCreate) {
  const std::uint32_t version = GetParam();
  const TempDir dir;
  make_old_format(dir.path(), version);
  ASSERT_FALSE(HasFailure());
  const auto listed = list_regions(dir.path());
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_THAT(listed[0].problem, HasSubstr("a region of format " + std::to_string(version) +
                                           ", left by an older kvoffload"));
  EXPECT_TRUE(listed[0].stale);
  EXPECT_FALSE(listed[0].geometry.has_value()) << "never read as a region of this format";

  const CleanResult cleaned = clean_regions(dir.path());
  EXPECT_TRUE(cleaned.skipped.empty())
      << (cleaned.skipped.empty() ? "" : cleaned.skipped[0].reason);
  ASSERT_EQ(cleaned.removed.size(), 1U);
  EXPECT_FALSE(std::filesystem::exists(junk_path(dir.path())));

  make_old_format(dir.path(), version);
  Region r = Region::create_or_join(small_options(dir.path(), "junk"));
  EXPECT_EQ(r.role(), RegionRole::kCreator) << "the old file was not reclaimed";
}

TEST_P(OldFormat, AHeldOneIsKept) {
  const TempDir dir;
  make_old_format(dir.path(), GetParam());
  ASSERT_FALSE(HasFailure());
  const int fd = ::open(junk_path(dir.path()).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);  // an older kvoffload's process still attached
  const CleanResult cleaned = clean_regions(dir.path());
  EXPECT_TRUE(cleaned.removed.empty());
  EXPECT_EQ(cleaned.kept.size(), 1U);
  EXPECT_TRUE(std::filesystem::exists(junk_path(dir.path())));
  ::close(fd);
}

// Our magic and an old version are not proof enough: the layout must account for the size.
TEST_P(OldFormat, OneWhoseSizeTheLayoutDoesNotAccountForIsJunk) {
  const TempDir dir;
  make_old_format(dir.path(), GetParam());
  ASSERT_FALSE(HasFailure());
  std::filesystem::resize_file(junk_path(dir.path()),
                               std::filesystem::file_size(junk_path(dir.path())) + 4096);
  const std::string before = file_bytes(junk_path(dir.path()));
  const CleanResult cleaned = clean_regions(dir.path());
  EXPECT_TRUE(cleaned.removed.empty());
  ASSERT_EQ(cleaned.skipped.size(), 1U);
  EXPECT_THAT(cleaned.skipped[0].reason, HasSubstr("bad magic or version"));
  expect_error([&] { (void)Region::create_or_join(small_options(dir.path(), "junk")); });
  EXPECT_EQ(file_bytes(junk_path(dir.path())), before);
}

INSTANTIATE_TEST_SUITE_P(Region, OldFormat, ::testing::Values(1U, 2U, 3U),
                         [](const auto& test_case) {
                           return "Format" + std::to_string(test_case.param);
                         });

// The checksum covers every fixed field and leaves out only the state, which changes once after
// publication (creating -> ready).
TEST(HeaderChecksum, CoversEveryFieldButTheState) {
  const RegionGeometry g =
      RegionGeometry::compute({.num_chunks = 4, .slot_bytes = 3000, .world_size = 2}, 4096);
  const detail::RegionHeader h = detail::make_header(g, "sum");
  EXPECT_EQ(h.checksum, detail::header_checksum(h));
  EXPECT_EQ(detail::header_problem(h, h.data_offset + h.data_bytes), "");
  detail::RegionHeader ready = h;
  ready.state = static_cast<std::uint32_t>(detail::RegionState::kReady);
  EXPECT_EQ(detail::header_checksum(ready), h.checksum);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&h);
  for (std::size_t i = 0; i < offsetof(detail::RegionHeader, checksum); ++i) {
    if (i >= offsetof(detail::RegionHeader, state) &&
        i < offsetof(detail::RegionHeader, state) + sizeof h.state) {
      continue;
    }
    detail::RegionHeader edited = h;
    reinterpret_cast<unsigned char*>(&edited)[i] = bytes[i] ^ 0x01;
    EXPECT_NE(detail::header_checksum(edited), h.checksum) << "byte " << i;
  }
}

}  // namespace
}  // namespace kvoffload
