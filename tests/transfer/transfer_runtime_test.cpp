// The transfer suite (transfer_test.cpp), continued: what the engine stands on. Calibration sets
// the path thresholds, the runtime's streams and events behave, and (cpu executable only) the
// backend factory lists and refuses backends and an engine built on a Region is shut down by the
// region's teardown hook before the memory goes.
#include <gtest/gtest.h>

#include "runtime/fault_runtime.hpp"
#include "transfer_test_util.hpp"

namespace kvoffload {
namespace {

using namespace kvoffload::test;

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

#if !defined(KVOFFLOAD_TEST_GPU)
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
