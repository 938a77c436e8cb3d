// Transfer engine suites, parameterised over the backend name. Built twice: with
// KVOFFLOAD_TEST_BACKENDS="host,sim" (label cpu: the GPU runtime runs on the simulated device) and
// "cuda,hip" (label gpu; a backend that is not built or has no device skips). Device caches are
// allocated through the runtime, so the same checks run on real device memory on GPUs.
//
// This file: every byte lands where the reference model says (round trips over layouts, groups,
// coalescing, the planner's path choice). The same suite goes on in transfer_sections_test.cpp
// (groups that share tensor sections), transfer_jobs_test.cpp (a job's life: validation, ids,
// poll/wait, ordering against compute streams, shutdown), transfer_faults_test.cpp (registration
// and copy failures) and transfer_runtime_test.cpp (calibration, runtime streams and events, the
// backend factory, an engine on a Region); the kit is transfer_test_util.hpp.
#include <gtest/gtest.h>

#include "runtime/fault_runtime.hpp"
#include "transfer/planner.hpp"
#include "transfer_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

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
#endif  // !KVOFFLOAD_TEST_GPU

}  // namespace
}  // namespace kvoffload
