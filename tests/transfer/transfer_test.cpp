// Transfer engine suites, parameterised over the backend name. Built twice: with
// KVOFFLOAD_TEST_BACKENDS="host,sim" (label cpu: the GPU runtime runs on the simulated device) and
// "cuda,hip" (label gpu; a backend that is not built or has no device skips). Device caches are
// allocated through the runtime, so the same checks run on real device memory on GPUs.
#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "skip.hpp"
#include "runtime/fault_runtime.hpp"
#include "transfer/planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#ifndef KVOFFLOAD_TEST_BACKENDS
#define KVOFFLOAD_TEST_BACKENDS "host,sim"
#endif

namespace kvoffload {
namespace {

std::vector<std::string> backends() {
  std::vector<std::string> out;
  std::string s = KVOFFLOAD_TEST_BACKENDS;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Host memory the tests own (page aligned: registration works on any alignment, but row strides
// of a region are page-aligned and tests should look like that).
struct HostBuffer {
  explicit HostBuffer(std::size_t n)
      : bytes(n), ptr(static_cast<std::byte*>(std::aligned_alloc(4096, round(n)))) {}
  static std::size_t round(std::size_t n) { return (n + 4095) / 4096 * 4096; }
  std::span<std::byte> span() const { return {ptr.get(), bytes}; }
  std::size_t bytes;
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> ptr;
};

void fill_random(std::span<std::byte> s, std::mt19937_64& rng) {
  for (auto& b : s) b = static_cast<std::byte>(rng() & 0xff);
}

struct TensorShape {
  std::uint64_t num_blocks;
  std::uint64_t page_bytes;
  std::uint64_t block_stride;  // 0 = page
};

// A KV cache made of device tensors (allocated through the runtime) and host slots in a plain
// buffer, with a reference model of where each byte must go.
class Cache {
 public:
  Cache(DeviceRuntime& rt, std::vector<std::vector<TensorShape>> shapes, std::uint32_t bpc,
        std::uint64_t chunks, std::uint32_t copies, std::uint32_t copy_index,
        std::uint64_t extra_slot_bytes = 0)
      : rt_(rt), shapes_(std::move(shapes)) {
    layout.blocks_per_chunk = bpc;
    std::uint64_t page_sum = 0;
    for (const auto& group : shapes_) {
      KvGroup g;
      for (const TensorShape& t : group) {
        const std::uint64_t stride = t.block_stride == 0 ? t.page_bytes : t.block_stride;
        device_.push_back(rt.allocate_device(t.num_blocks * stride));
        g.tensors.push_back(DeviceTensor{reinterpret_cast<std::uintptr_t>(device_.back().data()),
                                         t.num_blocks, t.page_bytes, t.block_stride});
        page_sum += t.page_bytes;
      }
      layout.groups.push_back(std::move(g));
    }
    slot_bytes = page_sum * bpc + extra_slot_bytes;
    row_stride = (slot_bytes * copies + 4095) / 4096 * 4096;
    host = std::make_unique<HostBuffer>(row_stride * chunks);
    layout.host = HostSlots::from_buffer(host->span(), slot_bytes, row_stride, copy_index);
  }

  // Random bytes everywhere (device tensors and the whole host buffer), mirrored in images.
  void randomize(std::mt19937_64& rng) {
    dev_image.clear();
    for (DeviceBuffer& d : device_) {
      std::vector<std::byte> img(d.bytes());
      fill_random(img, rng);
      rt_.memcpy_sync(d.data(), img.data(), img.size());
      dev_image.push_back(std::move(img));
    }
    fill_random(host->span(), rng);
    host_image.assign(host->span().begin(), host->span().end());
  }

  // Applies a job to the images with the simplest possible loops (the reference model).
  void model(Direction dir, const std::vector<std::uint64_t>& chunks, std::uint32_t skip,
             const std::vector<std::vector<std::uint64_t>>& blocks) {
    const std::uint64_t bpc = layout.blocks_per_chunk;
    std::size_t tensor_index = 0;
    std::uint64_t section = 0;
    for (std::size_t g = 0; g < shapes_.size(); ++g) {
      for (const TensorShape& t : shapes_[g]) {
        const std::uint64_t stride = t.block_stride == 0 ? t.page_bytes : t.block_stride;
        for (std::size_t i = 0; i < blocks[g].size(); ++i) {
          const std::uint64_t pos = skip + i;
          const std::uint64_t host_off = chunks[pos / bpc] * row_stride + layout.host.slot_offset +
                                         section + (pos % bpc) * t.page_bytes;
          const std::uint64_t dev_off = blocks[g][i] * stride;
          auto& dimg = dev_image[tensor_index];
          if (dir == Direction::kStore) {
            std::memcpy(host_image.data() + host_off, dimg.data() + dev_off, t.page_bytes);
          } else {
            std::memcpy(dimg.data() + dev_off, host_image.data() + host_off, t.page_bytes);
          }
        }
        section += t.page_bytes * bpc;
        ++tensor_index;
      }
    }
  }

  // Every byte of every device tensor and of the whole host buffer equals the model.
  void expect_matches_model() {
    for (std::size_t i = 0; i < device_.size(); ++i) {
      std::vector<std::byte> got(device_[i].bytes());
      rt_.memcpy_sync(got.data(), device_[i].data(), got.size());
      ASSERT_TRUE(got == dev_image[i]) << "device tensor " << i << " differs from the model";
    }
    ASSERT_TRUE(std::equal(host_image.begin(), host_image.end(), host->span().begin()))
        << "host buffer differs from the model";
  }

  DeviceBuffer& device(std::size_t i) { return device_[i]; }

  KvLayout layout;
  std::uint64_t slot_bytes = 0;
  std::uint64_t row_stride = 0;
  std::unique_ptr<HostBuffer> host;
  std::vector<std::vector<std::byte>> dev_image;
  std::vector<std::byte> host_image;

 private:
  DeviceRuntime& rt_;
  std::vector<std::vector<TensorShape>> shapes_;
  std::vector<DeviceBuffer> device_;
};

// Owns the spans a TransferSpec points at.
struct Job {
  std::vector<std::uint64_t> chunks;
  std::uint32_t skip = 0;
  std::vector<std::vector<std::uint64_t>> blocks;
  std::vector<std::span<const std::uint64_t>> views;
  TransferSpec spec() {
    views.assign(blocks.begin(), blocks.end());
    return TransferSpec{chunks, skip, views};
  }
};

std::vector<std::uint64_t> pick_distinct(std::uint64_t range, std::size_t n, std::mt19937_64& rng) {
  std::vector<std::uint64_t> all(range);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

// A job of `nblocks` blocks per group (group g may get fewer: min with its size) at random ids.
Job random_job(const Cache& cache, std::uint64_t num_chunks, std::uint64_t nblocks,
               std::uint32_t skip, std::mt19937_64& rng, std::uint64_t group_blocks_limit) {
  Job job;
  job.skip = skip;
  const std::uint64_t bpc = cache.layout.blocks_per_chunk;
  const std::uint64_t nchunks = (skip + nblocks + bpc - 1) / bpc;
  job.chunks = pick_distinct(num_chunks, nchunks, rng);
  for (std::size_t g = 0; g < cache.layout.groups.size(); ++g) {
    job.blocks.push_back(pick_distinct(group_blocks_limit, nblocks, rng));
  }
  return job;
}

class TransferTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      runtime_ = make_runtime(GetParam());
    } catch (const Error& e) {
      // Only a GPU backend may be missing: host and sim are always built, so there it fails.
      if (e.code() == ErrorCode::kNotAvailable && GetParam() != "host" && GetParam() != "sim")
        KVO_SKIP("no-gpu") << e.what();
      throw;
    }
  }
  DeviceRuntime& rt() { return *runtime_; }
  std::unique_ptr<DeviceRuntime> runtime_;
};

// Shapes: several tensors with different page sizes, some not multiples of 16, one strided.
std::vector<std::vector<TensorShape>> mixed_shapes(std::uint64_t blocks) {
  return {{{blocks, 4096, 0}, {blocks, 1000, 0}, {blocks, 24, 40}}, {{blocks, 528, 0}}};
}

void round_trip(DeviceRuntime& rt, std::uint32_t bpc, std::uint32_t copies,
                std::uint32_t copy_index, bool force_kernel, std::uint64_t seed) {
  constexpr std::uint64_t kBlocks = 64;
  constexpr std::uint64_t kChunks = 24;
  std::mt19937_64 rng(seed);
  Cache cache(rt, mixed_shapes(kBlocks), bpc, kChunks, copies, copy_index, /*extra_slot_bytes=*/8);
  EngineOptions opts;
  if (force_kernel) {
    opts.store_policy = opts.load_policy = PathPolicy{~0ULL, 1};
  }
  TransferEngine engine(rt, cache.layout, opts);
  cache.randomize(rng);
  std::uint64_t id = 0;
  for (int round = 0; round < 4; ++round) {
    const std::uint32_t skip = static_cast<std::uint32_t>(rng() % bpc);
    const std::uint64_t n = 1 + rng() % 13;
    Job store = random_job(cache, kChunks, n, skip, rng, kBlocks);
    engine.submit(JobId{++id}, Direction::kStore, store.spec());
    cache.model(Direction::kStore, store.chunks, store.skip, store.blocks);
    auto r = engine.wait_all();
    ASSERT_EQ(r.size(), 1u);
    ASSERT_TRUE(r[0].success) << r[0].error;
    cache.expect_matches_model();

    // Load the same chunks back into other random blocks.
    Job load = store;
    for (auto& b : load.blocks) b = pick_distinct(kBlocks, b.size(), rng);
    engine.submit(JobId{++id}, Direction::kLoad, load.spec());
    cache.model(Direction::kLoad, load.chunks, load.skip, load.blocks);
    r = engine.wait_all();
    ASSERT_EQ(r.size(), 1u);
    ASSERT_TRUE(r[0].success) << r[0].error;
    EXPECT_GT(r[0].bytes, 0u);
    cache.expect_matches_model();
  }
  if (force_kernel && rt.supports_kernel_path()) {
    EXPECT_GT(engine.stats().kernel_batches, 0u);
  }
}

TEST_P(TransferTest, RoundTripOneBlockPerChunk) {
  round_trip(rt(), 1, 1, 0, false, 1);
}
TEST_P(TransferTest, RoundTripThreeBlocksPerChunkMidChunkStart) {
  round_trip(rt(), 3, 1, 0, false, 2);
}
TEST_P(TransferTest, RoundTripRankedSlots) {
  round_trip(rt(), 3, 4, 2, false, 3);
}
TEST_P(TransferTest, RoundTripReplicatedSlot) {
  round_trip(rt(), 2, 1, 0, false, 4);
}
TEST_P(TransferTest, RoundTripKernelPath) {
  round_trip(rt(), 3, 2, 1, true, 5);
}

TEST_P(TransferTest, GroupsOfDifferentLengthsAndEmptyGroup) {
  std::mt19937_64 rng(7);
  Cache cache(rt(), mixed_shapes(32), 3, 8, 1, 0);
  TransferEngine engine(rt(), cache.layout);
  cache.randomize(rng);
  Job job;
  job.chunks = {5, 2};
  job.skip = 1;
  job.blocks = {{3, 9, 1, 30, 7}, {}};  // group 1 contributes nothing
  engine.submit(JobId{1}, Direction::kStore, job.spec());
  cache.model(Direction::kStore, job.chunks, job.skip, job.blocks);
  auto r = engine.wait_all();
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  cache.expect_matches_model();
  job.blocks = {{2}, {11, 12, 13}};
  job.chunks = {4, 6};
  engine.submit(JobId{2}, Direction::kLoad, job.spec());
  cache.model(Direction::kLoad, job.chunks, job.skip, job.blocks);
  r = engine.wait_all();
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  cache.expect_matches_model();
}

TEST_P(TransferTest, CoalescesRunsContiguousOnBothSides) {
  std::mt19937_64 rng(8);
  // One tensor, stride == page, slots == rows: consecutive blocks into consecutive chunks form one
  // contiguous run on both sides.
  Cache cache(rt(), {{{32, 4096, 0}}}, 3, 8, 1, 0);
  ASSERT_EQ(cache.row_stride, cache.slot_bytes);
  FaultInjectingRuntime counting(rt());
  TransferEngine engine(counting, cache.layout);
  cache.randomize(rng);
  Job job;
  job.chunks = {2, 3};
  job.blocks = {{10, 11, 12, 13, 14, 15}};
  engine.submit(JobId{1}, Direction::kStore, job.spec());
  cache.model(Direction::kStore, job.chunks, 0, job.blocks);
  ASSERT_TRUE(engine.wait_all().at(0).success);
  EXPECT_EQ(engine.stats().last_descriptors, 1u);
  EXPECT_EQ(engine.stats().fragments, 6u);
  EXPECT_EQ(counting.last_batch_descriptors(), 1u);

  job.chunks = {3, 2};  // chunk order breaks host contiguity between the chunks
  engine.submit(JobId{2}, Direction::kStore, job.spec());
  cache.model(Direction::kStore, job.chunks, 0, job.blocks);
  ASSERT_TRUE(engine.wait_all().at(0).success);
  EXPECT_EQ(engine.stats().last_descriptors, 2u);

  job.chunks = {2, 3};
  job.blocks = {{10, 12, 11, 13, 14, 20}};  // runs: 10 | 12 | 11 | 13,14 | 20
  engine.submit(JobId{3}, Direction::kLoad, job.spec());
  cache.model(Direction::kLoad, job.chunks, 0, job.blocks);
  ASSERT_TRUE(engine.wait_all().at(0).success);
  EXPECT_EQ(engine.stats().last_descriptors, 5u);
  cache.expect_matches_model();
}

#if !defined(KVOFFLOAD_TEST_GPU)  // backend-independent tests run once, in the cpu executable
TEST(TransferPlanner, CoalescesAcrossTensorsWhenBlocksAreCrossLayer) {
  // Cross-layer device layout: block b of layer l at base + b*stride + l*page, so with one block
  // per chunk a block's pages are contiguous on both sides and collapse into one copy.
  constexpr std::uint64_t kPage = 1000;
  constexpr std::uint64_t kLayers = 4;
  std::vector<std::byte> device(16 * kLayers * kPage);
  std::vector<std::byte> host(8 * kLayers * kPage);
  KvLayout layout;
  layout.blocks_per_chunk = 1;
  KvGroup g;
  for (std::uint64_t l = 0; l < kLayers; ++l) {
    g.tensors.push_back(
        {reinterpret_cast<std::uintptr_t>(device.data()) + l * kPage, 16, kPage, kLayers * kPage});
  }
  layout.groups.push_back(g);
  layout.host = HostSlots::from_buffer(host, kLayers * kPage);
  layout.validate();
  detail::Planner planner(layout);
  std::vector<std::uint64_t> chunks{0, 1, 5};
  std::vector<std::uint64_t> blocks{3, 4, 9};
  std::span<const std::uint64_t> groups[] = {blocks};
  const detail::Plan plan = planner.plan(Direction::kStore, TransferSpec{chunks, 0, groups});
  EXPECT_EQ(plan.fragments, 12u);
  EXPECT_EQ(plan.copies.size(), 2u);  // blocks 3,4 -> chunks 0,1 contiguous; 9 -> 5 alone
  EXPECT_EQ(plan.bytes, 12 * kPage);
  EXPECT_EQ(plan.copies[0].bytes, 2 * kLayers * kPage);
}

TEST(TransferPlanner, PathChoice) {
  detail::Plan plan;
  std::vector<CopyDescriptor> d(20, CopyDescriptor{nullptr, nullptr, 4096});
  plan.copies = d;
  plan.bytes = 20 * 4096;
  const PathPolicy policy{32 * 1024, 16};
  EXPECT_EQ(detail::choose_path(policy, plan, true), CopyPath::kKernel);
  EXPECT_EQ(detail::choose_path(policy, plan, false),
            CopyPath::kDma);  // never without registration
  plan.copies = std::span(d).first(8);
  plan.bytes = 8 * 4096;
  EXPECT_EQ(detail::choose_path(policy, plan, true), CopyPath::kDma);  // too few pieces
  plan.copies = d;
  plan.bytes = 20 * 65536;
  EXPECT_EQ(detail::choose_path(policy, plan, true), CopyPath::kDma);  // large pieces
}

#endif  // !KVOFFLOAD_TEST_GPU

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

TEST_P(TransferTest, ValidationErrorsAreClearAndConsumeNothing) {
  Cache cache(rt(), {{{8, 256, 0}}}, 2, 4, 1, 0);
  TransferEngine engine(rt(), cache.layout);
  auto expect_invalid = [&](Job job, Direction d, const std::string& needle) {
    try {
      engine.submit(JobId{1}, d, job.spec());
      ADD_FAILURE() << "accepted a bad spec (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid(Job{{0}, 0, {{8}}, {}}, Direction::kStore, "block id 8");
  expect_invalid(Job{{4}, 0, {{1}}, {}}, Direction::kStore, "chunk id 4");
  expect_invalid(Job{{0}, 2, {{1}}, {}}, Direction::kStore, "skip 2");
  expect_invalid(Job{{0}, 1, {{1, 2}}, {}}, Direction::kStore, "hold 1");
  expect_invalid(Job{{0, 0}, 0, {{1, 2, 3}}, {}}, Direction::kStore, "duplicate host chunk id 0");
  expect_invalid(Job{{0, 1}, 0, {{1, 1, 3}}, {}}, Direction::kLoad,
                 "duplicate GPU block id (load destination) 1");
  expect_invalid(Job{{0, 1, 2}, 0, {{1, 2}}, {}}, Direction::kStore, "fill only 1");
  expect_invalid(Job{{}, 0, {{}}, {}}, Direction::kStore, "no host chunks");
  // The id was never consumed: a good job with it works.
  engine.submit(JobId{1}, Direction::kStore, Job{{0}, 0, {{1, 2}}, {}}.spec());
  EXPECT_TRUE(engine.wait_all().at(0).success);

  KvLayout small = cache.layout;
  small.host.slot_bytes = 511;
  try {
    small.validate();
    ADD_FAILURE() << "slot too small accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos) << e.what();
  }
}

TEST_P(TransferTest, DuplicateIdsRefusedUntilCollected) {
  std::mt19937_64 rng(9);
  Cache cache(rt(), {{{8, 4096, 0}}}, 1, 4, 1, 0);
  TransferEngine engine(rt(), cache.layout);
  cache.randomize(rng);
  engine.submit(JobId{5}, Direction::kStore, Job{{0}, 0, {{1}}, {}}.spec());
  EXPECT_THROW(engine.submit(JobId{5}, Direction::kLoad, Job{{1}, 0, {{2}}, {}}.spec()), Error);
  const JobId five[] = {JobId{5}};
  auto r = engine.wait(five);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].success);
  engine.submit(JobId{5}, Direction::kLoad, Job{{0}, 0, {{2}}, {}}.spec());  // reusable now
  EXPECT_TRUE(engine.wait(five).at(0).success);
}

TEST_P(TransferTest, PollAndWaitSemantics) {
  std::mt19937_64 rng(10);
  Cache cache(rt(), {{{16, 4096, 0}}}, 1, 16, 1, 0);
  TransferEngine engine(rt(), cache.layout);
  cache.randomize(rng);
  EXPECT_TRUE(engine.poll().empty());
  const JobId unknown[] = {JobId{99}};
  EXPECT_THROW(engine.wait(unknown), Error);
  for (std::uint64_t i = 0; i < 6; ++i) {
    engine.submit(JobId{i}, i % 2 == 0 ? Direction::kStore : Direction::kLoad,
                  Job{{i}, 0, {{i}}, {}}.spec());
  }
  const JobId some[] = {JobId{4}, JobId{1}};
  auto r = engine.wait(some);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].job_id, JobId{4});
  EXPECT_EQ(r[1].job_id, JobId{1});
  EXPECT_EQ(r[0].direction, Direction::kStore);
  EXPECT_EQ(r[1].direction, Direction::kLoad);
  EXPECT_EQ(r[0].bytes, 4096u);
  EXPECT_GE(r[0].seconds, 0.0);
  // Store jobs complete in order: waiting for 4 finished 0 and 2 as well.
  std::vector<JobResult> rest;
  for (int tries = 0; tries < 2000 && rest.size() < 4; ++tries) {
    for (auto& x : engine.poll()) rest.push_back(std::move(x));
    if (rest.size() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(rest.size(), 4u);
  std::vector<std::uint64_t> stores;
  for (const auto& x : rest) {
    EXPECT_TRUE(x.success);
    EXPECT_NE(x.job_id, JobId{4});
    EXPECT_NE(x.job_id, JobId{1});
    if (x.direction == Direction::kStore) stores.push_back(static_cast<std::uint64_t>(x.job_id));
  }
  EXPECT_EQ(stores, (std::vector<std::uint64_t>{0, 2}));
  EXPECT_THROW(engine.wait(some), Error);  // already collected
  EXPECT_TRUE(engine.poll().empty());
}

// Holds streams until opened: each held stream waits for a 32-bit flag of the runtime's own
// (DeviceRuntime::wait_host_flag on a HostFlag: cuStreamWaitValue32, hipStreamWaitValue32 on
// signal memory). Never a host function that blocks: CUDA forbids host functions that wait for
// other GPU work, and one may deadlock on ROCm. One use.
class FlagGate {
 public:
  explicit FlagGate(DeviceRuntime& rt) : flag_(rt.create_host_flag()), rt_(rt) {}
  ~FlagGate() { open(); }  // never leave a stream held
  FlagGate(const FlagGate&) = delete;
  FlagGate& operator=(const FlagGate&) = delete;
  void hold(StreamView s) { rt_.wait_host_flag(s, flag_.data(), 1); }
  void open() { flag_.set(1); }
  // Opens after `ms` from another thread (for calls that block until the stream is free).
  std::thread open_later(int ms) {
    return std::thread([this, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      open();
    });
  }

 private:
  HostFlag flag_;
  DeviceRuntime& rt_;
};

TEST_P(TransferTest, WaitsForPendingWriteOnComputeStream) {
  std::mt19937_64 rng(11);
  Cache cache(rt(), {{{8, 8192, 0}}}, 1, 4, 1, 0);
  TransferEngine engine(rt(), cache.layout);
  cache.randomize(rng);
  Stream compute = rt().create_stream();
  // Host memory the compute stream copies from must stay alive until it ran.
  std::vector<std::byte> fresh(8192);
  fill_random(fresh, rng);
  // Pinned like a real staging buffer: GPU runtimes may refuse async copies from pageable memory.
  HostRegistration fresh_pin = rt().register_host(fresh.data(), fresh.size());
  auto* block3 = static_cast<std::byte*>(cache.device(0).data()) + 3 * 8192;

  // Store: compute writes block 3 only once the gate opens, after the submit; the store must see
  // the written bytes.
  FlagGate gate(rt());
  gate.hold(compute.view());
  const CopyDescriptor write{fresh.data(), block3, fresh.size()};
  rt().enqueue_copies(compute.view(), std::span(&write, 1), CopyKind::kHostToDevice,
                      CopyPath::kDma);
  std::memcpy(cache.dev_image[0].data() + 3 * 8192, fresh.data(), fresh.size());
  engine.submit(JobId{1}, Direction::kStore, Job{{2}, 0, {{3}}, {}}.spec(),
                WaitOn::stream(compute.view()));
  cache.model(Direction::kStore, {2}, 0, {{3}});
  gate.open();
  ASSERT_TRUE(engine.wait_all().at(0).success);
  cache.expect_matches_model();

  // Load: compute writes garbage into block 5 late; the load must land after it (event form).
  std::vector<std::byte> garbage(8192, std::byte{0xEE});
  HostRegistration garbage_pin = rt().register_host(garbage.data(), garbage.size());
  Event ready = rt().create_event();
  FlagGate gate2(rt());
  gate2.hold(compute.view());
  const CopyDescriptor scribble{garbage.data(),
                                static_cast<std::byte*>(cache.device(0).data()) + 5 * 8192, 8192};
  rt().enqueue_copies(compute.view(), std::span(&scribble, 1), CopyKind::kHostToDevice,
                      CopyPath::kDma);
  rt().record_event(ready.view(), compute.view());
  engine.submit(JobId{2}, Direction::kLoad, Job{{1}, 0, {{5}}, {}}.spec(),
                WaitOn::event(ready.view()));
  cache.model(Direction::kLoad, {1}, 0, {{5}});
  gate2.open();
  ASSERT_TRUE(engine.wait_all().at(0).success);
  rt().synchronize_stream(compute.view());
  cache.expect_matches_model();
}

TEST_P(TransferTest, StoresAndLoadsRunIndependently) {
  std::mt19937_64 rng(12);
  Cache cache(rt(), {{{8, 4096, 0}}}, 1, 4, 1, 0);
  TransferEngine engine(rt(), cache.layout);
  cache.randomize(rng);
  Stream compute = rt().create_stream();
  FlagGate gate(rt());  // closed: the store cannot start until we open it
  gate.hold(compute.view());
  engine.submit(JobId{1}, Direction::kStore, Job{{0}, 0, {{1}}, {}}.spec(),
                WaitOn::stream(compute.view()));
  engine.submit(JobId{2}, Direction::kLoad, Job{{1}, 0, {{2}}, {}}.spec());
  const JobId load[] = {JobId{2}};
  auto r = engine.wait(load);  // returns although the store is still blocked
  EXPECT_TRUE(r.at(0).success);
  EXPECT_TRUE(engine.poll().empty());
  gate.open();
  const JobId store[] = {JobId{1}};
  EXPECT_TRUE(engine.wait(store).at(0).success);
  rt().synchronize_stream(compute.view());
}

TEST_P(TransferTest, RegistrationFailureFallsBackToDmaAndStaysCorrect) {
  FaultInjectingRuntime faulty(rt(), FaultPlan{.fail_registrations = -1});
  std::mt19937_64 rng(13);
  Cache cache(faulty, mixed_shapes(32), 3, 8, 1, 0);
  EngineOptions opts;
  opts.store_policy = opts.load_policy = PathPolicy{~0ULL, 1};  // would always pick the kernel
  TransferEngine engine(faulty, cache.layout, opts);
  EXPECT_FALSE(engine.host_registered());
  EXPECT_EQ(faulty.injected_registration_failures(), 1u);
  cache.randomize(rng);
  Job job = random_job(cache, 8, 10, 2, rng, 32);
  engine.submit(JobId{1}, Direction::kStore, job.spec());
  cache.model(Direction::kStore, job.chunks, job.skip, job.blocks);
  EXPECT_TRUE(engine.wait_all().at(0).success);  // the load below reads what the store wrote
  for (auto& b : job.blocks) b = pick_distinct(32, b.size(), rng);
  engine.submit(JobId{2}, Direction::kLoad, job.spec());
  cache.model(Direction::kLoad, job.chunks, job.skip, job.blocks);
  EXPECT_TRUE(engine.wait_all().at(0).success);
  cache.expect_matches_model();
  EXPECT_EQ(faulty.kernel_batches(), 0u);
  EXPECT_EQ(faulty.dma_batches(), 2u);
  EXPECT_FALSE(engine.calibrate().ran);
}

void copy_failure(DeviceRuntime& rt, bool async) {
  FaultInjectingRuntime faulty(rt);
  std::mt19937_64 rng(14);
  Cache cache(faulty, {{{8, 4096, 0}}}, 1, 8, 1, 0);
  TransferEngine engine(faulty, cache.layout);
  cache.randomize(rng);
  // Fail the next batch (job 1), then a chosen job by the memory it touches (job 3: block 6).
  FaultPlan plan;
  plan.fail_batch = static_cast<std::int64_t>(faulty.batches());
  plan.async = async;
  faulty.set_plan(plan);
  engine.submit(JobId{1}, Direction::kStore, Job{{0}, 0, {{1}}, {}}.spec());
  engine.submit(JobId{2}, Direction::kStore, Job{{1}, 0, {{2}}, {}}.spec());
  cache.model(Direction::kStore, {1}, 0, {{2}});
  auto r = engine.wait_all();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].job_id, JobId{1});
  EXPECT_FALSE(r[0].success);
  EXPECT_NE(r[0].error.find("injected fault"), std::string::npos) << r[0].error;
  EXPECT_EQ(r[1].job_id, JobId{2});
  EXPECT_TRUE(r[1].success) << r[1].error;

  plan = FaultPlan{};
  plan.async = async;
  auto* block6 = static_cast<std::byte*>(cache.device(0).data()) + 6 * 4096;
  plan.fail_range_begin = reinterpret_cast<std::uintptr_t>(block6);
  plan.fail_range_end = plan.fail_range_begin + 4096;
  faulty.set_plan(plan);
  engine.submit(JobId{3}, Direction::kLoad, Job{{1}, 0, {{6}}, {}}.spec());
  engine.submit(JobId{4}, Direction::kLoad, Job{{1}, 0, {{7}}, {}}.spec());
  cache.model(Direction::kLoad, {1}, 0, {{7}});
  const JobId ids[] = {JobId{3}, JobId{4}};
  r = engine.wait(ids);
  EXPECT_FALSE(r.at(0).success);
  EXPECT_TRUE(r.at(1).success) << r[1].error;
  // Job 1's and 3's targets were not written: the model (without them) still matches.
  cache.expect_matches_model();
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.jobs_failed, 2u);
  EXPECT_EQ(s.jobs_succeeded, 2u);
}

TEST_P(TransferTest, CopyFailureAtLaunchFailsOnlyThatJob) {
  copy_failure(rt(), false);
}
TEST_P(TransferTest, AsynchronousCopyFailureFailsOnlyThatJob) {
  copy_failure(rt(), true);
}

TEST_P(TransferTest, ShutdownDrainsJobsInFlight) {
  std::mt19937_64 rng(15);
  Cache cache(rt(), {{{16, 16384, 0}}}, 1, 16, 1, 0);
  auto engine = std::make_unique<TransferEngine>(rt(), cache.layout);
  cache.randomize(rng);
  Stream compute = rt().create_stream();
  FlagGate gate(rt());
  gate.hold(compute.view());
  for (std::uint64_t i = 0; i < 8; ++i) {
    engine->submit(JobId{i}, Direction::kStore, Job{{i}, 0, {{i}}, {}}.spec(),
                   WaitOn::stream(compute.view()));
    cache.model(Direction::kStore, {i}, 0, {{i}});
  }
  std::thread opener = gate.open_later(50);  // shutdown() below waits for the jobs behind it
  engine->shutdown();
  opener.join();
  EXPECT_THROW(engine->submit(JobId{100}, Direction::kStore, Job{{9}, 0, {{9}}, {}}.spec()), Error);
  auto r = engine->poll();
  ASSERT_EQ(r.size(), 8u);
  for (const auto& x : r) EXPECT_TRUE(x.success) << x.error;
  cache.expect_matches_model();
  engine.reset();  // destructor after shutdown: nothing left to do

  // Destroying with jobs in flight (no explicit shutdown) must also drain safely.
  auto engine2 = std::make_unique<TransferEngine>(rt(), cache.layout);
  FlagGate gate2(rt());
  gate2.hold(compute.view());
  for (std::uint64_t i = 0; i < 4; ++i) {
    engine2->submit(JobId{i}, Direction::kLoad, Job{{i}, 0, {{i + 8}}, {}}.spec(),
                    WaitOn::stream(compute.view()));
    cache.model(Direction::kLoad, {i}, 0, {{i + 8}});
  }
  std::thread opener2 = gate2.open_later(50);
  engine2.reset();
  opener2.join();
  rt().synchronize_stream(compute.view());
  cache.expect_matches_model();
}

TEST_P(TransferTest, CalibrationSetsThresholds) {
  Cache cache(rt(), {{{8, 4096, 0}}}, 1, 4, 1, 0);
  EngineOptions small;
  small.calibration_bytes = 1 << 20;
  TransferEngine engine(rt(), cache.layout, small);
  if (!rt().supports_kernel_path()) {
    ASSERT_NE(GetParam(), "sim") << "the simulated device has the kernel path";
    KVO_SKIP("gpu-feature") << "no kernel path";
  }
  const CalibrationReport rep = engine.calibrate();
  EXPECT_TRUE(rep.ran);
  EXPECT_EQ(rep.points.size(), 14u);
  for (const auto& p : rep.points) {
    EXPECT_GT(p.dma_gbps, 0.0);
    EXPECT_GT(p.kernel_gbps, 0.0);
  }
  EXPECT_EQ(engine.policy(Direction::kStore).kernel_below_bytes,
            rep.store_policy.kernel_below_bytes);
}

TEST_P(TransferTest, RuntimeEventsAndStreams) {
  Stream s = rt().create_stream();
  Event e = rt().create_event(true);
  Event f = rt().create_event(true);
  EXPECT_TRUE(rt().query_event(e.view()));  // never recorded: complete
  FlagGate gate(rt());
  rt().record_event(e.view(), s.view());
  gate.hold(s.view());
  rt().record_event(f.view(), s.view());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(rt().query_event(f.view()));
  gate.open();
  rt().synchronize_event(f.view());
  EXPECT_TRUE(rt().query_event(f.view()));
  EXPECT_GE(rt().elapsed_seconds(e.view(), f.view()), 0.0);
  Stream moved = std::move(s);
  EXPECT_FALSE(
      static_cast<bool>(s));  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_TRUE(static_cast<bool>(moved));
}

INSTANTIATE_TEST_SUITE_P(Backends, TransferTest, ::testing::ValuesIn(backends()),
                         [](const auto& param_info) { return param_info.param; });

#if !defined(KVOFFLOAD_TEST_GPU)
// The host backend's helper pool (threads > 1, small split threshold) on both paths: every byte
// lands exactly once however the batch is cut into parts.
TEST(TransferHostRuntime, SplitBatchesOverHelperThreads) {
  RuntimeOptions opts;
  opts.host_copy_threads = 3;
  opts.host_split_min_bytes = 3 * 4096;
  opts.kernel_max_blocks = 3;
  auto rt = make_runtime("host", opts);
  round_trip(*rt, 3, 2, 1, false, 21);
  round_trip(*rt, 2, 1, 0, true, 22);
}

// Built on a Region: rank slots come from the region, and closing the region first shuts the
// engine down (drain, unregister) before the memory is unmapped.
TEST(TransferRegion, EngineOnRegionRanksAndTeardownHook) {
  auto rt = make_runtime("host");
  FaultInjectingRuntime counting(*rt);
  char tmpl[] = "/dev/shm/kvo-xfer-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::filesystem::path dir = tmpl;
  RegionOptions ro;
  ro.engine_id = "xfer-test";
  ro.layout = RegionLayout{
      .num_chunks = 8, .slot_bytes = 2 * 3 * 1000, .world_size = 2, .replicated = false};
  ro.rank = 1;
  ro.shm_dir = dir;
  Region region = Region::create_or_join(ro);
  std::vector<std::byte> device(16 * 1000);
  std::mt19937_64 rng(23);
  fill_random(device, rng);
  std::vector<KvGroup> groups(1);
  groups[0].tensors.push_back(
      DeviceTensor{reinterpret_cast<std::uintptr_t>(device.data()), 16, 1000, 0});
  TransferEngine engine(counting, region, 1, groups, 3);
  EXPECT_TRUE(engine.host_registered());
  std::vector<std::uint64_t> blocks{4, 9, 2, 7};
  std::vector<std::uint64_t> chunks{6, 3};
  std::span<const std::uint64_t> views[] = {blocks};
  engine.submit(JobId{1}, Direction::kStore, TransferSpec{chunks, 1, views});
  ASSERT_TRUE(engine.wait_all().at(0).success);
  // Positions 1, 2 of chunk 6 and 0, 1 of chunk 3, in rank 1's slot.
  const std::byte* expect[] = {device.data() + 4000, device.data() + 9000, device.data() + 2000,
                               device.data() + 7000};
  const std::byte* got[] = {region.slot(6, 1).data() + 1000, region.slot(6, 1).data() + 2000,
                            region.slot(3, 1).data(), region.slot(3, 1).data() + 1000};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::memcmp(expect[i], got[i], 1000), 0) << i;
  EXPECT_TRUE(std::all_of(region.slot(6, 0).begin(), region.slot(6, 0).end(), [](std::byte b) {
    return b == std::byte{0};
  })) << "rank 0's slot was written";
  EXPECT_TRUE(region.close());  // runs the hook: the engine is shut down and unregistered first
  EXPECT_THROW(engine.submit(JobId{2}, Direction::kStore, TransferSpec{chunks, 1, views}), Error);
  std::filesystem::remove_all(dir);
}

TEST(TransferFactory, ListsBackendsAndRefusesUnknown) {
  const auto list = list_backends();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].name, "cuda");
  EXPECT_EQ(list[1].name, "hip");
  EXPECT_EQ(list[2].name, "host");
  EXPECT_TRUE(list[2].built);
  EXPECT_EQ(list[2].device_count, 1);
  EXPECT_EQ(list[3].name, "sim");
  EXPECT_TRUE(list[3].built);
  EXPECT_EQ(list[3].device_count, 1);
  try {
    (void)make_runtime("tpu");
    ADD_FAILURE() << "unknown backend accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  for (const BackendInfo& b : list) {
    // A module that is not there is "not built", never a load failure of a missing file.
    EXPECT_EQ(b.detail.find("cannot open shared object file"), std::string::npos)
        << b.name << ": " << b.detail;
    if (!b.built) {
      EXPECT_NE(b.detail.find("does not include"), std::string::npos) << b.name << ": " << b.detail;
    }
    if (b.built) continue;
    try {
      (void)make_runtime(b.name);
      ADD_FAILURE() << b.name << " not built but created";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kNotAvailable);
      EXPECT_NE(std::string(e.what()).find(b.name), std::string::npos);
    }
  }
  // auto never picks sim (no GPU here: host).
  EXPECT_NE(make_runtime("auto")->name(), "sim");
}
#endif  // !KVOFFLOAD_TEST_GPU

}  // namespace
}  // namespace kvoffload
