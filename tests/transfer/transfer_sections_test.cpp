// The transfer suite (transfer_test.cpp), continued: groups that fill chunks of their own and share
// tensor sections (vLLM's layout), and how group chunks and sections are validated.
#include <gtest/gtest.h>

#include "transfer_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

// vLLM's layout (kvoffload.vllm): two unique device tensors, each with one section of
// bpc x (padded page) bytes in a slot; group 0 copies a 96-byte layer of tensor 0 and tensor 1,
// group 1 a 112-byte layer of tensor 0, so the groups share tensor 0's section and each group
// fills chunks of its own (TransferSpec::group_chunks), each from its own position.
struct SharedSections {
  static constexpr std::uint32_t kBpc = 2;
  static constexpr std::uint64_t kBlocks = 16;
  static constexpr std::uint64_t kChunks = 6;
  static constexpr std::uint64_t kPad0 = 128;  // tensor 0's padded page (its block stride)
  static constexpr std::uint64_t kPage1 = 64;
  static constexpr std::uint64_t kSlot = kBpc * (kPad0 + kPage1);
  struct Ref {
    std::size_t tensor;
    std::uint64_t page;  // bytes copied per block (vLLM's unpadded page)
  };
  // refs[g]: what group g copies.
  const std::vector<std::vector<Ref>> refs{{{0, 96}, {1, kPage1}}, {{0, 112}}};

  explicit SharedSections(DeviceRuntime& rt) : rt_(rt), host(kChunks * kSlot) {
    dev.push_back(rt.allocate_device(kBlocks * kPad0));
    dev.push_back(rt.allocate_device(kBlocks * kPage1));
    const std::uint64_t stride[] = {kPad0, kPage1};
    const std::uint64_t offset[] = {0, kBpc * kPad0};
    layout.blocks_per_chunk = kBpc;
    for (const auto& group : refs) {
      KvGroup g;
      for (const Ref& r : group) {
        DeviceTensor t;
        t.base = reinterpret_cast<std::uintptr_t>(dev[r.tensor].data());
        t.num_blocks = kBlocks;
        t.page_bytes = r.page;
        t.block_stride = stride[r.tensor];
        t.host_offset = offset[r.tensor];
        t.host_page_stride = stride[r.tensor];
        g.tensors.push_back(t);
      }
      layout.groups.push_back(std::move(g));
    }
    layout.host = HostSlots::from_buffer(host.span(), kSlot);
  }

  void randomize(std::mt19937_64& rng) {
    dev_image.clear();
    for (DeviceBuffer& d : dev) {
      std::vector<std::byte> img(d.bytes());
      fill_random(img, rng);
      rt_.memcpy_sync(d.data(), img.data(), img.size());
      dev_image.push_back(std::move(img));
    }
    fill_random(host.span(), rng);
    host_image.assign(host.span().begin(), host.span().end());
  }

  // The reference: group g's block i at chunk chunks[g][(skip + i) / bpc], position (skip + i) %
  // bpc of each of its refs' sections.
  void model(Direction d, const std::vector<std::vector<std::uint64_t>>& chunks,
             const std::vector<std::uint32_t>& skips,
             const std::vector<std::vector<std::uint64_t>>& blocks) {
    const std::uint64_t stride[] = {kPad0, kPage1};
    const std::uint64_t offset[] = {0, kBpc * kPad0};
    for (std::size_t g = 0; g < refs.size(); ++g) {
      for (const Ref& r : refs[g]) {
        for (std::size_t i = 0; i < blocks[g].size(); ++i) {
          const std::uint64_t pos = skips[g] + i;
          std::byte* h = host_image.data() + chunks[g][pos / kBpc] * kSlot + offset[r.tensor] +
                         (pos % kBpc) * stride[r.tensor];
          std::byte* v = dev_image[r.tensor].data() + blocks[g][i] * stride[r.tensor];
          if (d == Direction::kStore) {
            std::memcpy(h, v, r.page);
          } else {
            std::memcpy(v, h, r.page);
          }
        }
      }
    }
  }

  void expect_matches_model() {
    for (std::size_t i = 0; i < dev.size(); ++i) {
      std::vector<std::byte> got(dev[i].bytes());
      rt_.memcpy_sync(got.data(), dev[i].data(), got.size());
      ASSERT_TRUE(got == dev_image[i]) << "device tensor " << i << " differs from the model";
    }
    ASSERT_TRUE(std::equal(host_image.begin(), host_image.end(), host.span().begin()))
        << "host buffer differs from the model";
  }

  DeviceRuntime& rt_;
  KvLayout layout;
  HostBuffer host;
  std::vector<DeviceBuffer> dev;
  std::vector<std::vector<std::byte>> dev_image;
  std::vector<std::byte> host_image;
};

TransferSpec group_spec(std::vector<GroupChunks>& per_group,
                        const std::vector<std::vector<std::uint64_t>>& chunks,
                        const std::vector<std::uint32_t>& skips,
                        std::vector<std::span<const std::uint64_t>>& views,
                        const std::vector<std::vector<std::uint64_t>>& blocks) {
  per_group.clear();
  for (std::size_t g = 0; g < chunks.size(); ++g) per_group.push_back({chunks[g], skips[g]});
  views.assign(blocks.begin(), blocks.end());
  TransferSpec spec;
  spec.group_blocks = views;
  spec.group_chunks = per_group;
  return spec;
}

TEST_P(TransferTest, GroupsWithChunksOfTheirOwnShareTensorSections) {
  std::mt19937_64 rng(31);
  SharedSections cache(rt());
  cache.layout.validate();
  EXPECT_TRUE(cache.layout.groups_share_sections());
  EXPECT_EQ(cache.layout.chunk_payload_bytes(), SharedSections::kSlot);
  TransferEngine engine(rt(), cache.layout);
  cache.randomize(rng);
  std::vector<GroupChunks> per_group;
  std::vector<std::span<const std::uint64_t>> views;
  // Group 0: 3 blocks from position 1 (chunks 3, 1); group 1: 2 blocks from 0 (chunk 2).
  std::vector<std::vector<std::uint64_t>> chunks{{3, 1}, {2}};
  std::vector<std::uint32_t> skips{1, 0};
  std::vector<std::vector<std::uint64_t>> blocks{{5, 6, 7}, {9, 10}};
  engine.submit(JobId{1}, Direction::kStore, group_spec(per_group, chunks, skips, views, blocks));
  cache.model(Direction::kStore, chunks, skips, blocks);
  auto r = engine.wait_all();
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  EXPECT_EQ(r[0].bytes, 3 * (96 + 64) + 2 * 112u);
  cache.expect_matches_model();

  // Back into other blocks, group 1 alone, then both groups (group 1 from position 1).
  blocks = {{}, {0, 15}};
  chunks = {{}, {2}};
  skips = {0, 0};
  engine.submit(JobId{2}, Direction::kLoad, group_spec(per_group, chunks, skips, views, blocks));
  cache.model(Direction::kLoad, chunks, skips, blocks);
  ASSERT_TRUE(engine.wait_all().at(0).success);
  cache.expect_matches_model();
  blocks = {{11, 12, 13}, {14}};
  chunks = {{3, 1}, {2}};
  skips = {1, 1};
  engine.submit(JobId{3}, Direction::kLoad, group_spec(per_group, chunks, skips, views, blocks));
  cache.model(Direction::kLoad, chunks, skips, blocks);
  ASSERT_TRUE(engine.wait_all().at(0).success);
  cache.expect_matches_model();
}

TEST_P(TransferTest, GroupChunksAndSectionsAreValidated) {
  SharedSections cache(rt());
  TransferEngine engine(rt(), cache.layout);
  std::vector<GroupChunks> per_group;
  std::vector<std::span<const std::uint64_t>> views;
  auto expect_invalid = [&](const std::vector<std::vector<std::uint64_t>>& chunks,
                            const std::vector<std::uint32_t>& skips,
                            const std::vector<std::vector<std::uint64_t>>& blocks, Direction d,
                            const std::string& needle) {
    try {
      engine.submit(JobId{1}, d, group_spec(per_group, chunks, skips, views, blocks));
      ADD_FAILURE() << "accepted a bad spec (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid({{0}, {0}}, {0, 0}, {{1, 2}, {3, 4}}, Direction::kStore,
                 "duplicate host chunk id 0");
  expect_invalid({{0, 1}, {}}, {0, 0}, {{1}, {}}, Direction::kStore, "fill 1 chunks, but 2");
  expect_invalid({{0}, {}}, {2, 0}, {{1}, {}}, Direction::kStore, "skip 2");
  expect_invalid({{0}, {6}}, {0, 0}, {{1}, {2}}, Direction::kStore, "chunk id 6");
  expect_invalid({{0}, {1}}, {0, 0}, {{16}, {2}}, Direction::kStore, "block id 16");
  expect_invalid({{0}, {1}}, {0, 0}, {{3, 3}, {2}}, Direction::kLoad, "duplicate GPU block id");
  expect_invalid({{}, {}}, {0, 0}, {{}, {}}, Direction::kStore, "no host chunks");
  expect_invalid({{0}}, {0}, {{1}}, Direction::kStore, "1 chunk lists and 1 block lists for 2");
  // Shared sections: one chunk list for two groups would copy both into the same bytes.
  std::vector<std::uint64_t> chunks{0};
  std::vector<std::uint64_t> b0{1};
  std::vector<std::uint64_t> b1{2};
  std::span<const std::uint64_t> both[] = {b0, b1};
  try {
    engine.submit(JobId{1}, Direction::kStore, TransferSpec{chunks, 0, both});
    ADD_FAILURE() << "two groups sharing sections were mapped onto one chunk";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("share slot sections"), std::string::npos) << e.what();
  }
  std::span<const std::uint64_t> one[] = {b0, {}};
  engine.submit(JobId{1}, Direction::kStore, TransferSpec{chunks, 0, one});  // one group: fine
  EXPECT_TRUE(engine.wait_all().at(0).success);

  auto expect_bad_layout = [](const KvLayout& layout, const std::string& needle) {
    try {
      layout.validate();
      ADD_FAILURE() << "accepted a bad layout (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  KvLayout bad = cache.layout;
  bad.groups[0].tensors[1].host_offset = 200;  // into tensor 0's section [0, 224)
  expect_bad_layout(bad, "group 0 tensor 1 section overlaps the section of group 0 tensor 0");
  bad = cache.layout;
  bad.groups[0].tensors[1].host_offset = SharedSections::kSlot - 64;  // its 2nd position spills
  expect_bad_layout(bad, "does not fit the host slot");
  bad = cache.layout;
  bad.groups[1].tensors[0].host_offset = DeviceTensor::kPacked;
  expect_bad_layout(bad, "give every tensor a host_offset or none");
  bad = cache.layout;
  bad.groups[1].tensors[0].host_page_stride = 100;  // < its 112-byte page
  expect_bad_layout(bad, "host_page_stride 100 < page_bytes 112");
}

}  // namespace
}  // namespace kvoffload
