#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/geometry.hpp>

namespace kvoffload {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Runs `fn`, expecting Error(kInvalidArgument); returns its message.
template <typename F>
std::string invalid_message(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(Geometry, RankedRowsHoldEveryRankPaddedToAPage) {
  const auto g =
      RegionGeometry::compute({.num_chunks = 3, .slot_bytes = 1000, .world_size = 4}, 4096);
  EXPECT_EQ(g.copies(), 4U);
  EXPECT_EQ(g.row_stride(), 4096U);
  EXPECT_EQ(g.data_bytes(), 3U * 4096U);
  EXPECT_EQ(g.slot_offset(0, 0), 0U);
  EXPECT_EQ(g.slot_stride(), 1024U);  // 1000 rounded up to the default slot_align of 256
  EXPECT_EQ(g.slot_offset(2, 3), 2U * 4096U + 3U * 1024U);
  EXPECT_EQ(g.copy_index(3), 3U);

  const auto big =
      RegionGeometry::compute({.num_chunks = 2, .slot_bytes = 5000, .world_size = 2}, 4096);
  EXPECT_EQ(big.row_stride(), 12288U);  // 2 x 5120 rounded up to a page
  EXPECT_EQ(big.slot_offset(1, 1), 12288U + 5120U);
}

TEST(Geometry, ReplicatedLayoutSharesSlotZero) {
  const auto g = RegionGeometry::compute(
      {.num_chunks = 5, .slot_bytes = 6000, .world_size = 8, .replicated = true}, 4096);
  EXPECT_EQ(g.copies(), 1U);
  EXPECT_EQ(g.row_stride(), 8192U);
  EXPECT_EQ(g.data_bytes(), 5U * 8192U);
  for (std::uint32_t r = 0; r < 8; ++r) EXPECT_EQ(g.slot_offset(4, r), 4U * 8192U);
}

TEST(Geometry, UnrankedWorldOfOneIsOneSlotPerRow) {
  const auto g =
      RegionGeometry::compute({.num_chunks = 7, .slot_bytes = 4096, .world_size = 1}, 4096);
  EXPECT_EQ(g.row_stride(), 4096U);
  EXPECT_EQ(g.data_bytes(), 7U * 4096U);
}

TEST(Geometry, RefusesZeroInputsNamingTheValue) {
  EXPECT_THAT(invalid_message(
                  [] { (void)RegionGeometry::compute({.num_chunks = 0, .slot_bytes = 1}, 4096); }),
              AllOf(HasSubstr("num_chunks is 0"), HasSubstr("at least 1")));
  EXPECT_THAT(invalid_message(
                  [] { (void)RegionGeometry::compute({.num_chunks = 1, .slot_bytes = 0}, 4096); }),
              AllOf(HasSubstr("slot_bytes is 0"), HasSubstr("at least 1")));
  EXPECT_THAT(invalid_message([] {
                (void)RegionGeometry::compute({.num_chunks = 1, .slot_bytes = 1, .world_size = 0},
                                              4096);
              }),
              HasSubstr("world_size is 0"));
  EXPECT_THAT(invalid_message(
                  [] { (void)RegionGeometry::compute({.num_chunks = 1, .slot_bytes = 1}, 3000); }),
              HasSubstr("page size 3000"));
}

TEST(Geometry, RefusesRankAndChunkOutOfRange) {
  const auto g =
      RegionGeometry::compute({.num_chunks = 2, .slot_bytes = 64, .world_size = 4}, 4096);
  EXPECT_THAT(invalid_message([&] { (void)g.copy_index(4); }),
              AllOf(HasSubstr("rank 4"), HasSubstr("world_size is 4"), HasSubstr("0..3")));
  EXPECT_THAT(invalid_message([&] { (void)g.slot_offset(2, 0); }),
              AllOf(HasSubstr("chunk 2"), HasSubstr("0..1")));
  // Replicated still refuses a rank outside the world.
  const auto r = RegionGeometry::compute(
      {.num_chunks = 2, .slot_bytes = 64, .world_size = 4, .replicated = true}, 4096);
  EXPECT_THAT(invalid_message([&] { (void)r.copy_index(9); }), HasSubstr("rank 9"));
}

TEST(Geometry, RefusesSizesThatOverflow) {
  const auto max = std::numeric_limits<std::uint64_t>::max();
  EXPECT_THAT(invalid_message([&] {
                (void)RegionGeometry::compute(
                    {.num_chunks = 1, .slot_bytes = max / 2, .world_size = 4}, 4096);
              }),
              AllOf(HasSubstr("overflows"), HasSubstr("slot_bytes")));
  EXPECT_THAT(invalid_message([&] {
                (void)RegionGeometry::compute(
                    {.num_chunks = 1, .slot_bytes = std::uint64_t{1} << 61, .world_size = 4}, 4096);
              }),
              AllOf(HasSubstr("overflows"), HasSubstr("copies x slot_stride")));
  EXPECT_THAT(invalid_message([&] {
                (void)RegionGeometry::compute({.num_chunks = max / 1024, .slot_bytes = 4096}, 4096);
              }),
              AllOf(HasSubstr("overflows"), HasSubstr("num_chunks x row_stride")));
  // Exactly at the 2^62 bound a region is still accepted; one page more is not.
  const std::uint64_t limit_rows = (std::uint64_t{1} << 62) / 4096;
  EXPECT_NO_THROW(
      (void)RegionGeometry::compute({.num_chunks = limit_rows - 1, .slot_bytes = 4096}, 4096));
  EXPECT_THROW(
      (void)RegionGeometry::compute({.num_chunks = limit_rows + 1, .slot_bytes = 4096}, 4096),
      Error);
}

// Note [Slot alignment]: every slot of every rank starts on a slot_align boundary.
TEST(Geometry, EverySlotAddressIsAligned) {
  for (const std::uint64_t align : {16U, 256U, 4096U}) {
    SCOPED_TRACE("slot_align " + std::to_string(align));
    const auto g = RegionGeometry::compute(
        {.num_chunks = 5, .slot_bytes = 1000, .world_size = 4, .slot_align = align}, 4096);
    const std::uint64_t stride = (1000 + align - 1) / align * align;
    EXPECT_EQ(g.slot_align(), align);
    EXPECT_EQ(g.slot_stride(), stride);
    EXPECT_EQ(g.row_stride(), (4 * stride + 4095) / 4096 * 4096);
    for (std::uint64_t c = 0; c < 5; ++c) {
      for (std::uint32_t r = 0; r < 4; ++r) {
        const std::uint64_t off = g.slot_offset(c, r);
        EXPECT_EQ(off, c * g.row_stride() + r * stride);
        EXPECT_EQ(off % align, 0U) << "chunk " << c << " rank " << r;
        EXPECT_LE(off + 1000, (c + 1) * g.row_stride());  // the slot stays inside its row
      }
    }
  }
  // An exact multiple needs no padding.
  const auto exact =
      RegionGeometry::compute({.num_chunks = 1, .slot_bytes = 512, .world_size = 3}, 4096);
  EXPECT_EQ(exact.slot_stride(), 512U);
  EXPECT_EQ(exact.slot_offset(0, 2), 1024U);
}

TEST(Geometry, RefusesABadSlotAlignNamingTheValueAndTheRange) {
  for (const std::uint64_t bad : {0U, 8U, 100U, 8192U}) {
    EXPECT_THAT(invalid_message([&] {
                  (void)RegionGeometry::compute(
                      {.num_chunks = 1, .slot_bytes = 1, .slot_align = bad}, 4096);
                }),
                AllOf(HasSubstr("slot_align " + std::to_string(bad) + " "),
                      HasSubstr("power of two from 16"), HasSubstr("page size (4096)")));
  }
  EXPECT_NO_THROW(
      (void)RegionGeometry::compute({.num_chunks = 1, .slot_bytes = 1, .slot_align = 16}, 4096));
  EXPECT_NO_THROW(
      (void)RegionGeometry::compute({.num_chunks = 1, .slot_bytes = 1, .slot_align = 4096}, 4096));
}

TEST(Geometry, EqualityComparesLayoutAndDerivedValues) {
  const RegionLayout l{.num_chunks = 2, .slot_bytes = 64, .world_size = 2};
  EXPECT_EQ(RegionGeometry::compute(l, 4096), RegionGeometry::compute(l, 4096));
  RegionLayout other = l;
  other.replicated = true;
  EXPECT_FALSE(l == other);
  EXPECT_FALSE(RegionGeometry::compute(l, 4096) == RegionGeometry::compute(other, 4096));
  RegionLayout aligned = l;
  aligned.slot_align = 512;
  EXPECT_FALSE(l == aligned);
}

}  // namespace
}  // namespace kvoffload
