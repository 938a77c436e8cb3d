// The transfer suite (transfer_test.cpp), continued: a job's life. Bad specs are refused clearly
// and consume nothing, ids are unique until collected, poll and wait hand out each result once, a
// store waits for the compute stream's pending write, stores and loads do not wait for each other,
// and shutdown drains what is in flight.
#include <gtest/gtest.h>

#include "transfer_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

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

}  // namespace
}  // namespace kvoffload
