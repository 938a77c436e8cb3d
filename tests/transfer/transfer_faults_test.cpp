// The transfer suite (transfer_test.cpp), continued: failures. A host registration the runtime
// refuses falls back to DMA and stays correct; a copy that fails at launch or later fails only its
// own job (FaultInjectingRuntime).
#include <gtest/gtest.h>

#include "runtime/fault_runtime.hpp"
#include "transfer_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

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

}  // namespace
}  // namespace kvoffload
