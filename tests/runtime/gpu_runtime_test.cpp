// (Over ~500 lines: one suite built twice, for sim and for real GPUs, from one source file.)
// The GPU runtime (core/src/runtime/gpu): which path ran, the descriptor rings, registration in
// pieces, big kernel batches, and the fixes of the review, each against the simulated device's
// fault knobs. Built twice: "sim" (label cpu; CI runs it, also under ASan and TSan) and "cuda,hip"
// (label gpu, where a GPU exists). Tests that need a knob run on sim only and say so elsewhere.
#include "runtime/gpu/gpu_runtime.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "gpu_skip.hpp"
#include "gpu_test_util.hpp"
#include "runtime/backend_factories.hpp"
#include "runtime/sim/sim_device.hpp"
#include "skip.hpp"

#ifndef KVOFFLOAD_TEST_BACKENDS
#define KVOFFLOAD_TEST_BACKENDS "sim"
#endif

namespace kvoffload {
namespace {

using gpu::sim::SimDevice;
using gpu::sim::SimOptions;

std::vector<std::string> backends() {
  std::vector<std::string> out;
  std::string s = KVOFFLOAD_TEST_BACKENDS;
  for (std::size_t pos = 0; pos <= s.size();) {
    const std::size_t comma = s.find(',', pos);
    out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

using namespace gpu_test;  // NOLINT(google-build-using-namespace): the suite's helpers

class GpuRuntimeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { make({}); }
  // (Re)creates the runtime; on sim over a device of our own with `sim` options.
  void make(const RuntimeOptions& options, const SimOptions& sim = {}) {
    runtime_.reset();
    device_.reset();
    try {
      if (GetParam() == "sim") {
        device_ = std::make_shared<SimDevice>(sim);
        runtime_ = detail::make_sim_runtime(options, device_);
      } else {
        runtime_ = make_runtime(GetParam(), options);
      }
    } catch (const Error& e) {
      // Only a GPU backend may be missing: sim is always built, so there it fails.
      if (e.code() == ErrorCode::kNotAvailable && GetParam() != "sim")
        KVO_SKIP_OR_FAIL_GPU(GetParam(), e.what());
      throw;
    }
  }
  // The simulated device's knobs, or a skip that says why.
  SimDevice* sim() {
    if (!device_) return nullptr;
    return device_.get();
  }
  DeviceRuntime& rt() { return *runtime_; }

  std::shared_ptr<SimDevice> device_;
  std::unique_ptr<DeviceRuntime> runtime_;
};

#define NEED_SIM()                                                                      \
  do {                                                                                  \
    if (sim() == nullptr)                                                               \
      KVO_SKIP("gpu-feature") << "needs the simulated device's fault knobs (sim only)"; \
  } while (0)

// ---- which path ran ----

TEST_P(GpuRuntimeTest, BatchedDmaLoopAndKernelPathsAreCountedAndCopyExactly) {
  KvRig s(rt(), 16, 4096, 8);
  {
    TransferEngine e(rt(), s.layout, dma_only());
    submit_load(e, 1, {0, 2, 4}, {1, 5, 9});  // three pieces: one batch
    ASSERT_TRUE(e.wait_all().at(0).success);
  }
  const RuntimeCounters c = rt().counters();
  if (c.batched_dma_enabled) {
    EXPECT_EQ(c.dma_batched_calls, 1u);
    EXPECT_EQ(c.dma_loop_copies, 0u);
  } else {
    EXPECT_EQ(c.dma_loop_copies, 3u);
  }
  EXPECT_EQ(c.kernel_launches, 0u);
  EXPECT_TRUE(s.device_block_equals_slot(5, 2));
  {
    TransferEngine e(rt(), s.layout, kernel_only());
    submit_store(e, 2, {1, 3}, {0, 7});
    ASSERT_TRUE(e.wait_all().at(0).success);
  }
  EXPECT_EQ(rt().counters().kernel_launches, 1u);
  EXPECT_EQ(rt().counters().kernel_descriptors, 2u);
  const auto d = s.device_bytes();
  EXPECT_EQ(std::memcmp(s.host.data() + 3 * 4096, d.data() + 7 * 4096, 4096), 0);
}

TEST_P(GpuRuntimeTest, WithoutBatchedDmaThePerCopyLoopRuns) {
  NEED_SIM();
  SimOptions o;
  o.batch_memcpy = false;
  make({}, o);
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, dma_only());
  submit_load(e, 1, {0, 1, 3}, {2, 4, 6});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_EQ(rt().counters().dma_loop_copies, 3u);
  EXPECT_EQ(rt().counters().dma_batched_calls, 0u);
  EXPECT_TRUE(s.device_block_equals_slot(6, 3));
}

// ---- review fixes ----

// b: a launch is judged by its own status. An unrelated error left in the thread's last-error slot
// must not fail a good launch (whose ring slot would then be reused while the kernel reads it).
TEST_P(GpuRuntimeTest, LaunchIsJudgedByItsOwnStatusNotTheThreadsLastError) {
  NEED_SIM();
  sim()->faults().stale_error_before_launch = 2;  // "out of memory", from the engine's other code
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, kernel_only());
  submit_load(e, 1, {1, 2}, {3, 6});
  const auto r = e.wait_all();
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  EXPECT_EQ(rt().counters().kernel_launches, 1u);
  EXPECT_TRUE(s.device_block_equals_slot(3, 1));
  EXPECT_TRUE(s.device_block_equals_slot(6, 2));
}

TEST_P(GpuRuntimeTest, AFailedLaunchFailsOnlyItsJob) {
  NEED_SIM();
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, kernel_only());
  sim()->faults().fail_launches = 1;
  submit_load(e, 1, {0, 1}, {0, 1});
  submit_load(e, 2, {2, 3}, {4, 5});
  const auto r = e.wait_all();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_FALSE(r[0].success);
  EXPECT_NE(r[0].error.find("kernel_launch"), std::string::npos) << r[0].error;
  EXPECT_TRUE(r[1].success) << r[1].error;
  EXPECT_TRUE(s.device_block_equals_slot(4, 2));
  const auto d = s.device_bytes();
  EXPECT_EQ(std::memcmp(d.data(), s.device_image.data(), 4096), 0)
      << "the failed job wrote block 0";
}

// c: a job whose submit failed part-way finishes only after the copies already enqueued for it.
TEST_P(GpuRuntimeTest, AJobThatFailedPartWayFinishesOnlyAfterItsEnqueuedCopies) {
  NEED_SIM();
  SimOptions o;
  o.batch_memcpy = false;  // copy by copy, so the third copy's enqueue can fail
  make({}, o);
  KvRig s(rt(), 8, 4096, 8);
  TransferEngine e(rt(), s.layout, dma_only());
  Stream compute = rt().create_stream();
  FlagGate gate(rt());
  gate.hold(compute.view());
  sim()->faults().fail_memcpy_at = 3;
  submit_load(e, 1, {0, 2, 4, 6}, {1, 3, 5, 7}, WaitOn::stream(compute.view()));
  // Copies 1 and 2 are queued behind the gate: the failed job must not be reported yet.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(e.poll().empty()) << "a failed job was reported while its copies were still queued";
  gate.open();
  const auto r = e.wait_all();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].success);
  // Once reported, nothing of it runs any more: its first two copies have landed.
  EXPECT_TRUE(s.device_block_equals_slot(1, 0));
  EXPECT_TRUE(s.device_block_equals_slot(3, 2));
}

// d: a load's source (the host slot) may be written by work its stream waited for; batched DMA
// must read it in stream order (ANY may read it at the call).
TEST_P(GpuRuntimeTest, BatchedLoadsReadTheirSourceInStreamOrder) {
  KvRig s(rt(), 8, 4096, 4);
  if (!rt().counters().batched_dma_enabled) {
    ASSERT_NE(GetParam(), "sim") << "the simulated device has batched DMA";
    KVO_SKIP("gpu-feature") << "this runtime has no batched DMA";
  }
  TransferEngine e(rt(), s.layout, dma_only());
  Stream compute = rt().create_stream();
  FlagGate gate(rt());
  // Fresh bytes for slots 1 and 3, written by `compute` only after the gate opens.
  HostMem fresh(2 * 4096);
  fill(fresh.data(), fresh.bytes, 77);
  HostRegistration pin = rt().register_host(fresh.data(), fresh.bytes);
  gate.hold(compute.view());
  const CopyDescriptor writes[] = {{fresh.data(), s.host.data() + 1 * 4096, 4096},
                                   {fresh.data() + 4096, s.host.data() + 3 * 4096, 4096}};
  rt().enqueue_copies(compute.view(), writes, CopyKind::kHostToHost, CopyPath::kDma);
  submit_load(e, 1, {1, 3}, {2, 6}, WaitOn::stream(compute.view()));
  gate.open();
  ASSERT_TRUE(e.wait_all().at(0).success);
  const auto d = s.device_bytes();
  EXPECT_EQ(std::memcmp(d.data() + 2 * 4096, fresh.data(), 4096), 0)
      << "the load read its source too early";
  EXPECT_EQ(std::memcmp(d.data() + 6 * 4096, fresh.data() + 4096, 4096), 0);
  EXPECT_EQ(rt().counters().dma_batched_calls, 2u);  // the compute write and the load
}

// e: one refused batch does not switch batched DMA off for the process; "not supported" does.
TEST_P(GpuRuntimeTest, BatchedDmaRefusalsAreDecidedPerCause) {
  NEED_SIM();
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, dma_only());
  sim()->faults().refuse_batches = 1;
  sim()->faults().refuse_batch_code = 1;  // invalid value: this batch only
  submit_load(e, 1, {0, 2}, {2, 5});      // not contiguous: two copies
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_EQ(rt().counters().dma_batch_refusals, 1u);
  EXPECT_EQ(rt().counters().dma_loop_copies, 2u);
  EXPECT_TRUE(rt().counters().batched_dma_enabled);
  submit_load(e, 2, {1, 3}, {4, 7});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_EQ(rt().counters().dma_batched_calls, 1u);
  sim()->faults().refuse_batches = 1;
  sim()->faults().refuse_batch_code = 801;  // not supported: never again
  submit_load(e, 3, {0, 3}, {6, 1});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_FALSE(rt().counters().batched_dma_enabled);
  submit_load(e, 4, {1, 2}, {0, 3});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_EQ(rt().counters().dma_batched_calls, 1u);
  EXPECT_EQ(rt().counters().dma_loop_copies, 6u);
  EXPECT_TRUE(s.device_block_equals_slot(1, 3));
  EXPECT_TRUE(s.device_block_equals_slot(3, 2));
}

// e: a thread that never set a device reports device 0 but has no context; the runtime must bind
// it anyway, or the driver-level batch call is refused.
TEST_P(GpuRuntimeTest, AFreshThreadSubmittingGetsAContext) {
  KvRig s(rt(), 8, 4096, 4);
  if (!rt().counters().batched_dma_enabled) {
    ASSERT_NE(GetParam(), "sim") << "the simulated device has batched DMA";
    KVO_SKIP("gpu-feature") << "this runtime has no batched DMA";
  }
  TransferEngine e(rt(), s.layout, dma_only());
  std::thread([&] { submit_load(e, 1, {0, 2}, {2, 5}); }).join();
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_EQ(rt().counters().dma_batched_calls, 1u);
  EXPECT_EQ(rt().counters().dma_batch_refusals, 0u);
}

// ROCm-like addressing: registered host memory has another device address, so kernels must use
// the registration's device pointer (the simulator faults on the host address).
TEST_P(GpuRuntimeTest, KernelsUseTheDevicePointerOfRegisteredMemory) {
  NEED_SIM();
  SimOptions o;
  o.unified_addressing = false;
  make({}, o);
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, kernel_only());
  ASSERT_TRUE(e.host_registered());
  submit_store(e, 1, {1, 2}, {5, 6});
  auto r = e.wait_all();  // the load below reads what the store wrote (another lane: no order)
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  submit_load(e, 2, {1}, {0});
  r = e.wait_all();
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  EXPECT_EQ(sim()->sticky_error(), 0) << sim()->sticky_reason();
  EXPECT_EQ(std::memcmp(s.host.data() + 4096, s.device_image.data() + 5 * 4096, 4096), 0);
  EXPECT_TRUE(s.device_block_equals_slot(0, 1));
}

// A kernel reading unregistered host memory faults, with a sticky error, as a GPU would.
TEST_P(GpuRuntimeTest, AKernelOnUnregisteredHostMemoryIsAnIllegalAccess) {
  NEED_SIM();
  DeviceBuffer dev = rt().allocate_device(4096);
  std::vector<std::byte> host(4096);
  Stream st = rt().create_stream();
  const CopyDescriptor d{host.data(), dev.data(), 4096};
  // The fault is sticky and asynchronous: the first runtime call after the kernel ran reports
  // it, which is the synchronize, or already the event record closing the enqueue when the
  // kernel was that quick (as on a GPU).
  try {
    rt().enqueue_copies(st.view(), std::span(&d, 1), CopyKind::kHostToDevice, CopyPath::kKernel);
    rt().synchronize_stream(st.view());
    ADD_FAILURE() << "no fault";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kDevice);
    EXPECT_NE(std::string(err.what()).find("IllegalAddress"), std::string::npos) << err.what();
  }
  EXPECT_EQ(sim()->sticky_error(), 700);
  EXPECT_NE(sim()->sticky_reason().find("registered host memory"), std::string::npos)
      << sim()->sticky_reason();
}

// Device memory is not host memory: a host read of a device pointer crashes, as on a GPU.
TEST_P(GpuRuntimeTest, HostCodeCannotDereferenceDeviceMemory) {
  NEED_SIM();
  DeviceBuffer dev = rt().allocate_device(4096);
  EXPECT_TRUE(sim()->is_device_address(dev.data()));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH({ std::memset(dev.data(), 1, 16); }, "");
}

// Registration in pieces: row-aligned, each a register call; a failure at piece N unregisters
// pieces 1..N-1, and a failure after all pieces (the device-pointer query) leaks nothing either.
TEST_P(GpuRuntimeTest, RegistrationInPiecesAndNothingLeaksOnFailure) {
  NEED_SIM();
  RuntimeOptions ro;
  ro.register_chunk_bytes = 3 * 4096;
  make(ro);
  HostMem mem(10 * 4096);
  {
    HostRegistration reg = rt().register_host(mem.data(), mem.bytes, 2 * 4096);  // rows of 2 pages
    EXPECT_EQ(sim()->counters().host_register_calls.load(), 5u);  // 2 + 2 + 2 + 2 + 2 pages
    EXPECT_EQ(sim()->counters().live_registrations.load(), 5);
    EXPECT_EQ(reg.device_pointer(mem.data() + 12345), mem.data() + 12345);
  }
  EXPECT_EQ(sim()->counters().live_registrations.load(), 0);
  sim()->faults().fail_register_at = 3;
  EXPECT_THROW((void)rt().register_host(mem.data(), mem.bytes, 2 * 4096), Error);
  EXPECT_EQ(sim()->counters().live_registrations.load(), 0);
  sim()->faults().fail_device_pointer = 1;
  EXPECT_THROW((void)rt().register_host(mem.data(), mem.bytes, 2 * 4096), Error);
  EXPECT_EQ(sim()->counters().live_registrations.load(), 0)
      << "a registration leaked after a later failure";
  HostRegistration again = rt().register_host(mem.data(), mem.bytes, 2 * 4096);
  EXPECT_EQ(sim()->counters().live_registrations.load(), 5);
}

// Progressive bring-up: the caller registers the host buffer piece by piece; the kernel path opens
// only once the pieces cover it (before that, DMA), and then copies through their device pointers.
TEST_P(GpuRuntimeTest, KernelPathOpensWhenRegisteredPiecesCoverTheBuffer) {
  KvRig s(rt(), 8, 4096, 4);
  EngineOptions o = kernel_only();
  o.register_host = false;
  TransferEngine e(rt(), s.layout, o);
  HostRegistration first = rt().register_host(s.host.data(), 2 * 4096);
  e.note_host_registration(first);
  submit_load(e, 1, {0, 2}, {1, 5});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_EQ(rt().counters().kernel_launches, 0u)
      << "the kernel ran before the buffer was registered";
  EXPECT_FALSE(e.host_registered());
  HostRegistration second = rt().register_host(s.host.data() + 2 * 4096, 2 * 4096);
  e.note_host_registration(second);
  EXPECT_THROW(e.note_host_registration(second), Error);
  EXPECT_TRUE(e.host_registered());
  submit_load(e, 2, {1, 3}, {2, 6});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_EQ(rt().counters().kernel_launches, 1u);
  EXPECT_TRUE(s.device_block_equals_slot(5, 2));
  EXPECT_TRUE(s.device_block_equals_slot(6, 3));
  e.shutdown();  // before the pieces go
}

// Without unified addressing every piece has a device address of its own (ROCm): the
// registration keeps the pieces (no single call over the whole range) and translates each
// address through its own piece.
TEST_P(GpuRuntimeTest, NonContiguousPiecesKeepTheirOwnDeviceAddresses) {
  NEED_SIM();
  RuntimeOptions ro;
  ro.register_chunk_bytes = 4 * 4096;
  SimOptions o;
  o.unified_addressing = false;
  make(ro, o);
  HostMem mem(8 * 4096);
  HostRegistration reg = rt().register_host(mem.data(), mem.bytes, 4096);
  EXPECT_EQ(sim()->counters().live_registrations.load(), 2);
  ASSERT_EQ(reg.segments().size(), 2u);
  EXPECT_EQ(reg.segments()[1].offset, 4u * 4096);
  for (const std::size_t off :
       {std::size_t{0}, std::size_t{100}, std::size_t{4 * 4096}, std::size_t{5 * 4096 + 7}}) {
    void* want = nullptr;
    ASSERT_EQ(sim()->api().host_device_pointer(sim()->api().ctx, &want, mem.data() + off), 0);
    EXPECT_EQ(reg.device_pointer(mem.data() + off), want) << off;
  }
}

// m: calibration frees its device scratch in stream order, never with a device-wide free.
TEST_P(GpuRuntimeTest, CalibrationDoesNotSynchronizeTheDevice) {
  NEED_SIM();
  KvRig s(rt(), 8, 4096, 4);
  EngineOptions small;
  small.calibration_bytes = 256 << 10;
  TransferEngine e(rt(), s.layout, small);
  const std::uint64_t before = sim()->counters().device_syncs.load();
  const CalibrationReport rep = e.calibrate();
  EXPECT_TRUE(rep.ran);
  EXPECT_EQ(sim()->counters().device_syncs.load(), before);
}

// Issue 25 (4): nothing an engine does while it serves synchronizes the whole device (that would
// stall the engine's own compute streams and break a capture running on another thread): stores
// and loads on both paths, a ring kept full, pieces registered as a background bring-up adds
// them, statistics with timing events, and another engine of the process made and closed
// meanwhile (its lanes' pinned descriptor buffers are kept for reuse, since a pinned free
// synchronizes the device).
TEST_P(GpuRuntimeTest, ServingNeverSynchronizesTheDevice) {
  NEED_SIM();
  RuntimeOptions ro;
  ro.kernel_ring_slots = 2;
  make(ro);
  KvRig s(rt(), 16, 4096, 8);
  EngineOptions o;
  o.register_host = false;  // the pieces come as the bring-up registers them
  o.calibrate = false;
  o.job_timing = true;
  TransferEngine e(rt(), s.layout, o);
  const std::uint64_t before = sim()->counters().device_syncs.load();
  HostRegistration first = rt().register_host(s.host.data(), 4 * 4096);
  e.note_host_registration(first);
  HostRegistration second;
  std::uint64_t id = 1;
  for (int round = 0; round < 12; ++round) {
    SCOPED_TRACE(round);
    if (round == 4) {
      second = rt().register_host(s.host.data() + 4 * 4096, 4 * 4096);
      e.note_host_registration(second);
    }
    if (round == 6) {
      // Another engine of the same process comes and goes while this one has jobs in flight.
      submit_store(e, id++, {4, 5, 6}, {3, 4, 5});
      EngineOptions k = kernel_only();
      k.register_host = false;
      TransferEngine other(rt(), s.layout, k);
      other.note_host_registration(first);
      other.note_host_registration(second);
      submit_load(other, 1, {7}, {15});
      ASSERT_TRUE(other.wait_all().at(0).success);
      other.shutdown();
    }
    const std::uint64_t slot = (round % 2 == 0) ? 0 : 2;
    const std::vector<std::uint64_t> blocks = {static_cast<std::uint64_t>(round % 8),
                                               static_cast<std::uint64_t>(8 + (round % 8))};
    submit_store(e, id++, {slot, slot + 1}, blocks);
    for (const JobResult& r : e.wait_all()) ASSERT_TRUE(r.success) << r.error;
    submit_load(e, id++, {slot, slot + 1}, blocks);
    for (const JobResult& r : e.wait_all()) ASSERT_TRUE(r.success) << r.error;
    EXPECT_EQ(sim()->counters().device_syncs.load(), before) << "a device-wide synchronize";
  }
  (void)e.stats();
  EXPECT_EQ(sim()->counters().device_syncs.load(), before) << "a device-wide synchronize";
  e.shutdown();  // before the pieces go
}

// Kernel batches beyond one scan block (256) and beyond one ring slot (4096 descriptors), with
// sizes and alignments that exercise the vector path, the narrower words and the byte tail.
TEST_P(GpuRuntimeTest, KernelBatchesOverOneBlockAndOneRingSlotCopyEveryByte) {
  for (const std::size_t n : {300, 5000}) {
    SCOPED_TRACE(n);
    std::mt19937_64 rng(n);
    std::vector<std::size_t> sizes(n);
    std::size_t total = 0;
    for (auto& z : sizes) {
      z = 1 + rng() % 700;
      total += z + 16;
    }
    HostMem host(total);
    fill(host.data(), total, n);
    HostRegistration reg = rt().register_host(host.data(), host.bytes);
    DeviceBuffer dev = rt().allocate_device(total + 64);
    rt().memset_sync(dev.data(), 0, total + 64);
    std::vector<CopyDescriptor> descs;
    std::size_t off = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t skew = rng() % 17;  // misaligned starts on both sides
      descs.push_back({reg.device_pointer(host.data() + off),
                       static_cast<std::byte*>(dev.data()) + off + skew % 3, sizes[i]});
      off += sizes[i] + 16;
    }
    Stream st = rt().create_stream();
    rt().enqueue_copies(st.view(), descs, CopyKind::kHostToDevice, CopyPath::kKernel);
    rt().synchronize_stream(st.view());
    std::vector<std::byte> got(total + 64);
    rt().memcpy_sync(got.data(), dev.data(), got.size());
    off = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto* dst = got.data() + (static_cast<std::byte*>(descs[i].dst) -
                                      static_cast<std::byte*>(dev.data()));
      ASSERT_EQ(std::memcmp(dst, host.data() + off, sizes[i]), 0) << "descriptor " << i;
      off += sizes[i] + 16;
    }
  }
}

// The ring: with its slots all in flight a launch waits for the oldest (never reuses a slot a
// kernel may still read), and only its own lane waits: a load is never stuck behind a store.
TEST_P(GpuRuntimeTest, RingExhaustionWaitsOnlyInItsOwnLane) {
  RuntimeOptions ro;
  ro.kernel_ring_slots = 2;
  make(ro);
  KvRig s(rt(), 16, 4096, 16);
  TransferEngine e(rt(), s.layout, kernel_only());
  Stream compute = rt().create_stream();
  FlagGate gate(rt());
  gate.hold(compute.view());
  // Two stores fill the store lane's ring behind the held compute stream; the third must wait.
  submit_store(e, 1, {0}, {0}, WaitOn::stream(compute.view()));
  submit_store(e, 2, {1}, {1}, WaitOn::stream(compute.view()));
  auto third = std::async(std::launch::async,
                          [&] { submit_store(e, 3, {2}, {2}, WaitOn::stream(compute.view())); });
  ASSERT_TRUE(eventually([&] { return rt().counters().ring_waits == 1; }));
  // Meanwhile a load on the other lane runs to completion.
  auto load = std::async(std::launch::async, [&] {
    submit_load(e, 4, {8, 9}, {10, 11});
    const JobId id[] = {JobId{4}};
    return e.wait(id).at(0).success;
  });
  const bool load_done = load.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  EXPECT_TRUE(load_done) << "the load lane waited for the store lane's ring";
  gate.open();
  third.get();
  if (load_done) {
    EXPECT_TRUE(load.get());
  }
  const auto r = e.wait_all();
  for (const auto& x : r) EXPECT_TRUE(x.success) << x.error;
  for (std::uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(s.host.data() + i * 4096, s.device_image.data() + i * 4096, 4096), 0)
        << i;
  }
  EXPECT_TRUE(s.device_block_equals_slot(11, 9));
}

// Many threads submitting on both lanes at once: every byte lands, every job completes.
TEST_P(GpuRuntimeTest, ConcurrentSubmitsOnBothLanes) {
  RuntimeOptions ro;
  ro.kernel_ring_slots = 3;
  make(ro);
  KvRig s(rt(), 64, 4096, 64);
  TransferEngine e(rt(), s.layout, kernel_only());
  std::vector<std::thread> threads;
  for (std::uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < 8; ++i) {
        const std::uint64_t k =
            t * 8 + i;  // chunk k <-> block k (stores), chunk 32+k -> block 32+k (loads)
        if (t % 2 == 0) {
          submit_store(e, 1000 + k, {k}, {k});
        } else {
          submit_load(e, 2000 + k, {32 + k}, {32 + k});
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto r = e.wait_all();
  EXPECT_EQ(r.size(), 32u);
  for (const auto& x : r) EXPECT_TRUE(x.success) << x.error;
  for (std::uint64_t t = 0; t < 4; ++t) {
    for (std::uint64_t i = 0; i < 8; ++i) {
      const std::uint64_t k = t * 8 + i;
      if (t % 2 == 0) {
        EXPECT_EQ(std::memcmp(s.host.data() + k * 4096, s.device_image.data() + k * 4096, 4096), 0)
            << k;
      } else {
        EXPECT_TRUE(s.device_block_equals_slot(32 + k, 32 + k)) << k;
      }
    }
  }
}

TEST_P(GpuRuntimeTest, ADelayedStreamStillCompletesInOrder) {
  NEED_SIM();
  sim()->faults().op_delay_us = 2000;
  KvRig s(rt(), 8, 4096, 8);
  TransferEngine e(rt(), s.layout, dma_only());
  for (std::uint64_t i = 0; i < 4; ++i) submit_store(e, i, {i}, {i});
  const auto r = e.wait_all();
  ASSERT_EQ(r.size(), 4u);
  for (std::uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r[i].job_id, JobId{i});
    EXPECT_TRUE(r[i].success);
  }
}

// A blocking stream capturing makes the legacy stream capture-implicit: registration (which
// synchronizes with it) is refused before anything is registered, and the capture survives.
TEST_P(GpuRuntimeTest, RegistrationRefusedWhileABlockingStreamCaptures) {
  NEED_SIM();
  void* blocking = sim()->create_blocking_stream();
  ASSERT_NE(blocking, nullptr);
  ASSERT_EQ(sim()->begin_capture(blocking, gpu::kCaptureModeGlobal), 0);
  HostMem mem(4096);
  try {
    (void)rt().register_host(mem.data(), 4096);
    ADD_FAILURE() << "registered during a capture";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kState);
  }
  EXPECT_EQ(sim()->counters().host_register_calls.load(), 0u);
  EXPECT_EQ(sim()->end_capture(blocking), 0);
  EXPECT_EQ(sim()->api().stream_destroy(sim()->api().ctx, blocking), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuRuntimeTest, ::testing::ValuesIn(backends()),
                         [](const auto& param_info) { return param_info.param; });

#if !defined(KVOFFLOAD_TEST_GPU)
TEST(GpuRegistrationPlan, PiecesAreRowAndPageAligned) {
  const auto plan = gpu::plan_registration(0x10000, 10 * 4096 + 100, 3 * 4096, 7 * 4096, 4096);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0], (std::pair<std::size_t, std::size_t>{0, 6 * 4096}));
  EXPECT_EQ(plan[1], (std::pair<std::size_t, std::size_t>{6 * 4096, 4 * 4096 + 100}));
  EXPECT_EQ(gpu::plan_registration(0x10001, 100, 0, 4096, 4096).size(), 1u);
  EXPECT_THROW((void)gpu::plan_registration(0x10001, 3 * 4096, 0, 4096, 4096), Error);
}
#endif

}  // namespace
}  // namespace kvoffload
