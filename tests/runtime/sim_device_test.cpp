// (Over ~500 lines: each case is one rule of the real device, checked against the same fixture.)
// The simulated device as strict as a GPU (Note [Simulated device]), and the GPU runtime's fixes
// that only such a device can show (issue 16): one context per device and rank, the device guard
// on every call, host functions after a sticky error, stream-ordered frees of stream-ordered
// memory, submits that would join a caller's graph capture, HIP's signal-memory flags, driver
// codes of driver calls, retired ring slots at destruction, registration pieces with their own
// device offsets, a device whose architecture the build lacks, and the driver floor. Each test
// names the behaviour it holds; the mutation that breaks it is in the note.
#include "runtime/sim/sim_device.hpp"

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "gpu_test_util.hpp"
#include "runtime/backend_factories.hpp"
#include "runtime/gpu/gpu_runtime.hpp"

namespace kvoffload {
namespace {

using namespace gpu_test;  // NOLINT(google-build-using-namespace): the suite's helpers
using gpu::sim::SimDevice;
using gpu::sim::SimOptions;
using ::testing::HasSubstr;

// CUDA's codes, which the simulator uses.
constexpr int kIllegalAddress = 700;
constexpr int kMisalignedAddress = 716;
constexpr int kInvalidHandle = 400;
constexpr int kCaptureUnsupported = 900;
constexpr int kCaptureInvalidated = 901;
constexpr int kCaptureUnjoined = 904;

// Runs fn on a thread of its own, one that never chose a device (an engine's or Python's worker).
void on_fresh_thread(const std::function<void()>& fn) {
  std::exception_ptr error;
  std::thread([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
}

class SimDeviceTest : public ::testing::Test {
 public:
  void make(const RuntimeOptions& options = {}, SimOptions sim = {}) {
    runtime_.reset();
    device_ = std::make_shared<SimDevice>(std::move(sim));
    runtime_ = detail::make_sim_runtime(options, device_);
  }
  // A runtime on device 1 of a two-device simulator (rank 1 of a two-GPU machine).
  void make_rank1(SimOptions sim = {}) {
    sim.device_count = 2;
    RuntimeOptions ro;
    ro.device = 1;
    make(ro, std::move(sim));
  }
  DeviceRuntime& rt() { return *runtime_; }
  SimDevice& sim() { return *device_; }
  const gpu::VendorApi& api() { return device_->api(); }
  void* ctx() { return device_->api().ctx; }

  std::shared_ptr<SimDevice> device_;
  std::unique_ptr<DeviceRuntime> runtime_;
};

// ---- the simulator's own strictness ----

// Contexts are per device: set_device creates one, the first call on a thread without one binds
// device 0's; a kernel into another device's stream and an event recorded on another device's
// stream are refused; a copy into another device's stream is allowed (CUDA's multi-device rules).
TEST_F(SimDeviceTest, ContextsArePerDeviceWithCudasMultiDeviceRules) {
  SimOptions o;
  o.device_count = 2;
  make({}, o);  // the runtime is on device 0
  on_fresh_thread([&] {
    int current = 7;
    ASSERT_EQ(api().current_device(ctx(), &current), 0);
    EXPECT_EQ(current, -1) << "a fresh thread has no context";
    ASSERT_EQ(api().get_device(ctx(), &current), 0);
    EXPECT_EQ(current, 0) << "cudaGetDevice reports 0 for it all the same";
  });
  EXPECT_FALSE(sim().context_created(1));
  void* s1 = nullptr;
  void* e1 = nullptr;
  on_fresh_thread([&] {
    ASSERT_EQ(api().set_device(ctx(), 1), 0);
    ASSERT_EQ(api().stream_create(ctx(), &s1), 0);
    ASSERT_EQ(api().event_create(ctx(), &e1, 0), 0);
  });
  EXPECT_TRUE(sim().context_created(1));
  on_fresh_thread([&] {  // device 0's context, bound implicitly
    void* e0 = nullptr;
    ASSERT_EQ(api().event_create(ctx(), &e0, 0), 0);
    EXPECT_EQ(api().event_record(ctx(), e0, s1), kInvalidHandle) << "event and stream differ";
    gpu::VendorCopyDesc d{nullptr, nullptr, 0};
    EXPECT_EQ(api().kernel_launch(ctx(), &d, 1, 1, s1), kInvalidHandle)
        << "a kernel into another device's stream";
    (void)api().get_last_error(ctx());
    HostMem a(64);
    HostMem b(64);
    EXPECT_EQ(api().memcpy_async(ctx(), b.data(), a.data(), 64, gpu::kMemcpyHostToHost, s1), 0);
    EXPECT_EQ(api().event_query(ctx(), e1), 0) << "querying another device's event is allowed";
    EXPECT_EQ(api().event_destroy(ctx(), e0), 0);
  });
  EXPECT_EQ(api().event_destroy(ctx(), e1), 0);
  EXPECT_EQ(api().stream_destroy(ctx(), s1), 0);
}

// Issue 25 (8): a host wait on the runtime's events sleeps (cudaEventBlockingSync) instead of
// spinning a core: the engine's waits, synchronize_event and a full descriptor ring.
TEST_F(SimDeviceTest, HostWaitsOnTheRuntimesEventsDoNotSpin) {
  make();
  Stream st = rt().create_stream();
  Event e = rt().create_event(/*timing=*/true);
  {
    FlagGate gate(rt());
    gate.hold(st.view());
    rt().record_event(e.view(), st.view());
    std::thread waiter([&] { rt().synchronize_event(e.view()); });
    const bool waiting = eventually([&] { return sim().counters().host_waits.load() >= 1; });
    gate.open();
    waiter.join();
    ASSERT_TRUE(waiting);
  }
  EXPECT_EQ(sim().counters().spinning_waits.load(), 0u);
  KvRig s(rt(), 8, 4096, 4);
  sim().faults().op_delay_us = 2000;  // the jobs are still running when the engine waits
  {
    TransferEngine ek(rt(), s.layout, kernel_only());
    TransferEngine ed(rt(), s.layout, dma_only());
    submit_load(ek, 1, {0, 1}, {2, 3});
    submit_load(ed, 2, {2, 3}, {4, 5});
    ASSERT_TRUE(ek.wait_all().at(0).success);
    ASSERT_TRUE(ed.wait_all().at(0).success);
  }
  sim().faults().op_delay_us = 0;
  EXPECT_EQ(sim().counters().spinning_waits.load(), 0u);
}

// Issue 25 (9): cudaStreamDestroy returns at once, while work queued on the stream still runs
// (it completes, then the stream's resources go); device synchronization waits for that work.
TEST_F(SimDeviceTest, DestroyingAStreamReturnsBeforeItsWorkEnds) {
  make();
  void* s = nullptr;
  std::uint32_t* flag = nullptr;
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &s), 0);
  ASSERT_EQ(api().flag_alloc(ctx(), &flag), 0);
  ASSERT_EQ(api().host_alloc_mapped(ctx(), &src, 4096), 0);
  ASSERT_EQ(api().host_alloc_mapped(ctx(), &dst, 4096), 0);
  *flag = 0;
  std::memset(src, 9, 4096);
  std::memset(dst, 0, 4096);
  ASSERT_EQ(api().stream_wait_value32(ctx(), s, flag, 1), 0);  // holds the stream
  ASSERT_EQ(api().memcpy_async(ctx(), dst, src, 4096, gpu::kMemcpyHostToHost, s), 0);
  auto destroyed = std::async(std::launch::async, [&] { return api().stream_destroy(ctx(), s); });
  const bool returned = eventually(
      [&] { return destroyed.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
  std::atomic_ref<std::uint32_t>(*flag).store(1);  // opens the stream either way
  ASSERT_TRUE(returned) << "stream_destroy waited for the stream's work";
  EXPECT_EQ(destroyed.get(), 0);
  ASSERT_EQ(api().device_synchronize(ctx()), 0);
  EXPECT_EQ(static_cast<int>(static_cast<std::byte*>(dst)[4095]), 9) << "the queued copy ran";
  EXPECT_EQ(api().host_free(ctx(), src), 0);
  EXPECT_EQ(api().host_free(ctx(), dst), 0);
  EXPECT_EQ(api().flag_free(ctx(), flag), 0);
}

// Issue 25 (9): a pinned free (cudaFreeHost) synchronizes the device first: work queued before it
// has finished when it returns, and it counts as a device-wide synchronization.
TEST_F(SimDeviceTest, APinnedFreeSynchronizesTheDevice) {
  make();
  void* s = nullptr;
  void* pinned = nullptr;
  void* out = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &s), 0);
  ASSERT_EQ(api().host_alloc_mapped(ctx(), &pinned, 4096), 0);
  ASSERT_EQ(api().host_alloc_mapped(ctx(), &out, 4096), 0);
  std::memset(pinned, 7, 4096);
  std::memset(out, 0, 4096);
  const std::uint64_t syncs = sim().counters().device_syncs.load();
  sim().faults().op_delay_us = 20000;
  ASSERT_EQ(api().memcpy_async(ctx(), out, pinned, 4096, gpu::kMemcpyHostToHost, s), 0);
  EXPECT_EQ(api().host_free(ctx(), pinned), 0);
  sim().faults().op_delay_us = 0;
  EXPECT_EQ(sim().counters().device_syncs.load(), syncs + 1);
  EXPECT_EQ(static_cast<int>(static_cast<std::byte*>(out)[4095]), 7) << "the copy had finished";
  EXPECT_EQ(api().host_free(ctx(), out), 0);
  EXPECT_EQ(api().stream_destroy(ctx(), s), 0);
}

// Issue 25 (9): a batched copy (a driver call, in the current context) into another device's
// stream is refused, as a kernel launch there is; the same batch on the current device's stream
// runs.
TEST_F(SimDeviceTest, ABatchedCopyIntoAnotherDevicesStreamIsRefused) {
  SimOptions o;
  o.device_count = 2;
  make({}, o);
  void* s1 = nullptr;
  on_fresh_thread([&] {
    ASSERT_EQ(api().set_device(ctx(), 1), 0);
    ASSERT_EQ(api().stream_create(ctx(), &s1), 0);
  });
  on_fresh_thread([&] {
    ASSERT_EQ(api().set_device(ctx(), 0), 0);
    HostMem a(64);
    HostMem b(64);
    std::memset(a.data(), 5, 64);
    std::memset(b.data(), 0, 64);
    void* dsts[] = {b.data()};
    const void* srcs[] = {a.data()};
    std::size_t sizes[] = {64};
    std::size_t fail = 0;
    EXPECT_EQ(api().memcpy_batch_async(ctx(), dsts, srcs, sizes, 1, 1, s1, &fail), kInvalidHandle);
    void* s0 = nullptr;
    ASSERT_EQ(api().stream_create(ctx(), &s0), 0);
    EXPECT_EQ(api().memcpy_batch_async(ctx(), dsts, srcs, sizes, 1, 1, s0, &fail), 0);
    EXPECT_EQ(api().stream_synchronize(ctx(), s0), 0);
    EXPECT_EQ(static_cast<int>(b.data()[63]), 5);
    EXPECT_EQ(api().stream_destroy(ctx(), s0), 0);
  });
  EXPECT_EQ(api().stream_destroy(ctx(), s1), 0);
}

// Issue 25 (9): an event last recorded in a capture that has ended belongs to that graph: a wait
// on it, a query, a synchronize and an elapsed time fail with cudaErrorCapturedEvent (907) until
// it is recorded again outside a capture.
TEST_F(SimDeviceTest, AnEventLastRecordedInAnEndedCaptureCannotBeWaitedOn) {
  constexpr int kCapturedEvent = 907;
  make();
  void* origin = nullptr;
  void* other = nullptr;
  void* e = nullptr;
  void* t = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &origin), 0);
  ASSERT_EQ(api().stream_create(ctx(), &other), 0);
  ASSERT_EQ(api().event_create(ctx(), &e, 1), 0);
  ASSERT_EQ(api().event_create(ctx(), &t, 1), 0);
  ASSERT_EQ(api().event_record(ctx(), t, origin), 0);
  ASSERT_EQ(sim().begin_capture(origin, gpu::kCaptureModeGlobal), 0);
  ASSERT_EQ(api().event_record(ctx(), e, origin), 0);
  ASSERT_EQ(sim().end_capture(origin), 0);
  EXPECT_EQ(api().stream_wait_event(ctx(), other, e), kCapturedEvent);
  EXPECT_EQ(api().event_query(ctx(), e), kCapturedEvent);
  EXPECT_EQ(api().event_synchronize(ctx(), e), kCapturedEvent);
  float ms = 0;
  EXPECT_EQ(api().event_elapsed_ms(ctx(), &ms, t, e), kCapturedEvent);
  (void)api().get_last_error(ctx());
  ASSERT_EQ(api().event_record(ctx(), e, origin), 0);  // outside a capture: an event again
  EXPECT_EQ(api().stream_wait_event(ctx(), other, e), 0);
  EXPECT_EQ(api().event_synchronize(ctx(), e), 0);
  EXPECT_EQ(api().event_query(ctx(), e), 0);
  for (void* ev : {e, t}) EXPECT_EQ(api().event_destroy(ctx(), ev), 0);
  for (void* st : {origin, other}) EXPECT_EQ(api().stream_destroy(ctx(), st), 0);
}

// cudaLaunchHostFunc: "the function will not be called in the event of an error in the CUDA
// context". HIP's callbacks still run (a knob).
void set_flag(void* p) {
  static_cast<std::atomic<int>*>(p)->store(1);
}
int host_func_after_fault(SimDeviceTest& t) {
  DeviceRuntime& rt = t.rt();
  DeviceBuffer dev = rt.allocate_device(4096);
  std::vector<std::byte> unregistered(4096);
  Stream st = rt.create_stream();
  std::atomic<int> ran{0};
  {
    FlagGate gate(rt);
    gate.hold(st.view());
    const CopyDescriptor d{unregistered.data(), dev.data(), 4096};  // faults: not registered
    rt.enqueue_copies(st.view(), std::span(&d, 1), CopyKind::kHostToDevice, CopyPath::kKernel);
    rt.launch_host_func(st.view(), &set_flag, &ran);
  }  // opens the gate
  EXPECT_THROW(rt.synchronize_stream(st.view()), Error);
  EXPECT_EQ(t.sim().sticky_error(), kIllegalAddress);
  return ran.load();
}
TEST_F(SimDeviceTest, HostFunctionsAreSkippedAfterAStickyError) {
  make();
  EXPECT_EQ(host_func_after_fault(*this), 0) << "CUDA never runs a host function after a fault";
  EXPECT_EQ(sim().counters().host_funcs_skipped.load(), 1u);
}
TEST_F(SimDeviceTest, HipCallbacksStillRunAfterAStickyError) {
  make({}, SimOptions::hip_semantics());
  EXPECT_EQ(host_func_after_fault(*this), 1);
}

// A copy from pageable memory synchronizes: the call returns after the stream's earlier work and
// the copy itself (here: only after the gate in front of it opened).
TEST_F(SimDeviceTest, PageableCopiesSynchronizeTheirStream) {
  make();
  DeviceBuffer dev = rt().allocate_device(4096);
  std::vector<std::byte> pageable(4096, std::byte{0x42});
  Stream st = rt().create_stream();
  FlagGate gate(rt());
  gate.hold(st.view());
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    (void)eventually([&] { return sim().counters().pageable_copies.load() == 1; });
    opened = true;
    gate.open();
  });
  const CopyDescriptor d{pageable.data(), dev.data(), 4096};
  rt().enqueue_copies(st.view(), std::span(&d, 1), CopyKind::kHostToDevice, CopyPath::kDma);
  EXPECT_TRUE(opened.load()) << "the pageable copy returned while its stream was still held";
  opener.join();
  std::vector<std::byte> back(4096);
  rt().memcpy_sync(back.data(), dev.data(), 4096);  // another stream: the copy must be done
  EXPECT_EQ(back, pageable);
}

// A 16-byte vector access at an address that is not 16-byte aligned faults with a misaligned
// address, sticky, and stops the kernel; every later call reports it.
struct MisalignedArgs {
  std::byte* buffer;
  std::atomic<int> after_fault{0};
};
void misaligned_body(void* p) {
  auto* a = static_cast<MisalignedArgs*>(p);
  gpu::sim::vector_copy16(a->buffer, a->buffer + 64);       // aligned: fine
  gpu::sim::vector_copy16(a->buffer + 128, a->buffer + 8);  // misaligned source: faults
  a->after_fault.fetch_add(1);                              // never reached by any thread
}
TEST_F(SimDeviceTest, MisalignedVectorAccessFaultsStickily) {
  make();
  alignas(16) std::byte buffer[256] = {};
  MisalignedArgs args{buffer};
  void* s = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &s), 0);
  ASSERT_EQ(sim().launch_body(s, &misaligned_body, &args, 2), 0);
  EXPECT_EQ(api().stream_synchronize(ctx(), s), kMisalignedAddress);
  EXPECT_EQ(sim().sticky_error(), kMisalignedAddress);
  EXPECT_THAT(sim().sticky_reason(), HasSubstr("not 16-byte aligned"));
  EXPECT_EQ(args.after_fault.load(), 0) << "the kernel ran on after its fault";
  void* e = nullptr;
  EXPECT_EQ(api().event_create(ctx(), &e, 0), kMisalignedAddress) << "the error is sticky";
  (void)api().get_last_error(ctx());
  EXPECT_EQ(api().stream_destroy(ctx(), s), 0);
}

// Issue 25 (9): 8-, 4- and 2-byte word accesses fault too when their address is not a multiple of
// their size (the kernel's narrow path), aligned ones do not.
struct WordArgs {
  std::byte* buffer;
  std::size_t width;
  std::atomic<int> after_fault{0};
};
void misaligned_word_body(void* p) {
  auto* a = static_cast<WordArgs*>(p);
  gpu::sim::word_copy(a->buffer, a->buffer + 64, a->width);                  // aligned: fine
  gpu::sim::word_copy(a->buffer + 128, a->buffer + a->width / 2, a->width);  // faults
  a->after_fault.fetch_add(1);
}
TEST_F(SimDeviceTest, MisalignedWordAccessesFault) {
  for (const std::size_t width : {8, 4, 2}) {
    SCOPED_TRACE(width);
    make();
    alignas(16) std::byte buffer[256] = {};
    WordArgs args{buffer, width};
    void* s = nullptr;
    ASSERT_EQ(api().stream_create(ctx(), &s), 0);
    ASSERT_EQ(sim().launch_body(s, &misaligned_word_body, &args, 1), 0);
    EXPECT_EQ(api().stream_synchronize(ctx(), s), kMisalignedAddress);
    EXPECT_THAT(sim().sticky_reason(), HasSubstr("not " + std::to_string(width) + "-byte aligned"));
    EXPECT_EQ(args.after_fault.load(), 0);
    (void)api().get_last_error(ctx());
    EXPECT_EQ(api().stream_destroy(ctx(), s), 0);
  }
}

// The copy kernel's own alignment logic under the strict simulator: pieces at every alignment
// copy exactly and never fault (its vector path runs only where both sides are aligned).
TEST_F(SimDeviceTest, TheCopyKernelNeverMakesAMisalignedVectorAccess) {
  make();
  HostMem host(64 * 1024);
  fill(host.data(), host.bytes, 5);
  HostRegistration reg = rt().register_host(host.data(), host.bytes);
  DeviceBuffer dev = rt().allocate_device(64 * 1024);
  std::vector<CopyDescriptor> descs;
  for (std::size_t i = 0; i < 32; ++i) {  // sources and destinations at offsets 0..31 mod 16
    descs.push_back({reg.device_pointer(host.data() + i * 2048 + i),
                     static_cast<std::byte*>(dev.data()) + i * 2048 + (i * 7) % 16, 1000 + i});
  }
  Stream st = rt().create_stream();
  rt().enqueue_copies(st.view(), descs, CopyKind::kHostToDevice, CopyPath::kKernel);
  rt().synchronize_stream(st.view());
  EXPECT_EQ(sim().sticky_error(), 0) << sim().sticky_reason();
  std::vector<std::byte> got(64 * 1024);
  rt().memcpy_sync(got.data(), dev.data(), got.size());
  for (std::size_t i = 0; i < descs.size(); ++i) {
    EXPECT_EQ(
        std::memcmp(got.data() + i * 2048 + (i * 7) % 16, host.data() + i * 2048 + i, 1000 + i), 0)
        << i;
  }
}

// event_query reports a sticky error at once, even while the event's own work is still queued.
TEST_F(SimDeviceTest, EventQueryReportsAStickyErrorAtOnce) {
  make();
  Stream held = rt().create_stream();
  Event e = rt().create_event();
  FlagGate gate(rt());
  gate.hold(held.view());
  rt().record_event(e.view(), held.view());  // stays pending behind the gate
  EXPECT_FALSE(rt().query_event(e.view()));
  // Another stream faults the device.
  DeviceBuffer dev = rt().allocate_device(4096);
  std::vector<std::byte> unregistered(4096);
  Stream other = rt().create_stream();
  const CopyDescriptor d{unregistered.data(), dev.data(), 4096};
  try {
    rt().enqueue_copies(other.view(), std::span(&d, 1), CopyKind::kHostToDevice, CopyPath::kKernel);
    rt().synchronize_stream(other.view());
  } catch (const Error&) {
  }
  ASSERT_EQ(sim().sticky_error(), kIllegalAddress);
  try {
    (void)rt().query_event(e.view());
    ADD_FAILURE() << "a faulted device answered 'not ready'";
  } catch (const Error& err) {
    EXPECT_THAT(err.what(), HasSubstr("IllegalAddress"));
  }
}

// Stream capture with CUDA's cross-stream rule: a stream that waits on an event recorded in a
// capture joins it (its work becomes nodes, never run), and ending the capture without joining
// it back fails (unjoined); synchronizing a capturing stream is refused and breaks the capture;
// joined back, the capture ends cleanly.
TEST_F(SimDeviceTest, CaptureCrossStreamRule) {
  make();
  void* origin = nullptr;
  void* other = nullptr;
  void* forked = nullptr;
  void* joined = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &origin), 0);
  ASSERT_EQ(api().stream_create(ctx(), &other), 0);
  ASSERT_EQ(api().event_create(ctx(), &forked, 0), 0);
  ASSERT_EQ(api().event_create(ctx(), &joined, 0), 0);
  HostMem src(4096);
  HostMem dst(4096);
  std::memset(src.data(), 1, 4096);
  std::memset(dst.data(), 0, 4096);
  ASSERT_EQ(api().host_register(ctx(), src.data(), 4096), 0);
  ASSERT_EQ(api().host_register(ctx(), dst.data(), 4096), 0);
  auto fork_and_copy = [&] {
    ASSERT_EQ(sim().begin_capture(origin, gpu::kCaptureModeGlobal), 0);
    ASSERT_EQ(api().event_record(ctx(), forked, origin), 0);
    ASSERT_EQ(api().stream_wait_event(ctx(), other, forked), 0);
    int capturing = 0;
    ASSERT_EQ(api().stream_capturing(ctx(), other, &capturing), 0);
    EXPECT_EQ(capturing, 1) << "waiting on a captured event joins the capture";
    ASSERT_EQ(
        api().memcpy_async(ctx(), dst.data(), src.data(), 4096, gpu::kMemcpyHostToHost, other), 0);
  };
  auto capturing = [&](void* s) {
    int c = -1;
    EXPECT_EQ(api().stream_capturing(ctx(), s, &c), 0);
    return c;
  };
  fork_and_copy();
  EXPECT_EQ(sim().end_capture(origin), kCaptureUnjoined);
  EXPECT_EQ(capturing(other), 0) << "the capture ended for every stream in it";

  fork_and_copy();
  EXPECT_EQ(api().stream_synchronize(ctx(), other), kCaptureUnsupported);
  (void)api().get_last_error(ctx());
  EXPECT_EQ(sim().end_capture(origin), kCaptureInvalidated);

  fork_and_copy();
  ASSERT_EQ(api().event_record(ctx(), joined, other), 0);
  ASSERT_EQ(api().stream_wait_event(ctx(), origin, joined), 0);
  EXPECT_EQ(sim().end_capture(origin), 0);
  EXPECT_EQ(capturing(other), 0);
  ASSERT_EQ(api().stream_synchronize(ctx(), other), 0);
  EXPECT_EQ(static_cast<int>(dst.data()[0]), 0) << "a captured copy ran";

  EXPECT_EQ(api().host_unregister(ctx(), src.data()), 0);
  EXPECT_EQ(api().host_unregister(ctx(), dst.data()), 0);
  for (void* e : {forked, joined}) EXPECT_EQ(api().event_destroy(ctx(), e), 0);
  for (void* s : {origin, other}) EXPECT_EQ(api().stream_destroy(ctx(), s), 0);
}

// A potentially unsafe call (registration) from a thread in the default (global) capture mode
// breaks another thread's global capture; the runtime registers in relaxed mode, so the engine's
// registration leaves the model's capture alone (Note [Registration during capture]).
TEST_F(SimDeviceTest, RegistrationLeavesAnotherThreadsCaptureValid) {
  make();
  void* s = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &s), 0);
  for (const bool raw : {false, true}) {
    SCOPED_TRACE(raw ? "an unsafe call in global mode" : "the runtime's registration");
    std::promise<void> begun;
    std::promise<void> registered;
    std::future<int> ended = std::async(std::launch::async, [&] {
      if (sim().begin_capture(s, gpu::kCaptureModeGlobal) != 0) return -1;
      begun.set_value();
      registered.get_future().wait();
      return sim().end_capture(s);  // by the thread that began it
    });
    begun.get_future().wait();
    HostMem mem(4096);
    if (raw) {
      EXPECT_EQ(api().host_register(ctx(), mem.data(), 4096), kCaptureUnsupported);
      (void)api().get_last_error(ctx());
    } else {
      EXPECT_NO_THROW((void)rt().register_host(mem.data(), 4096));  // relaxed: allowed
    }
    registered.set_value();
    EXPECT_EQ(ended.get(), raw ? kCaptureInvalidated : 0);
  }
  EXPECT_EQ(sim().counters().captures_invalidated.load(), 1u);
  EXPECT_EQ(api().stream_destroy(ctx(), s), 0);
}

// ---- the runtime's fixes (issue 16) ----

// N2: a thread that never chose a device keeps the runtime's device after a call; "restoring"
// device 0 there created GPU 0's context in every rank. Rank 1 never touches device 0.
TEST_F(SimDeviceTest, Rank1NeverTouchesDevice0FromAnyThread) {
  make_rank1();
  {
    KvRig s(rt(), 8, 4096, 4);
    TransferEngine e(rt(), s.layout, kernel_only());
    on_fresh_thread([&] {
      submit_load(e, 1, {0, 2}, {1, 5});
      int current = -1;
      ASSERT_EQ(api().current_device(ctx(), &current), 0);
      EXPECT_EQ(current, 1) << "the submitting thread keeps the runtime's device";
    });
    on_fresh_thread([&] { ASSERT_TRUE(e.wait_all().at(0).success); });
    EXPECT_TRUE(s.device_block_equals_slot(5, 2));
  }
  EXPECT_TRUE(sim().context_created(1));
  EXPECT_FALSE(sim().context_created(0)) << "rank 1 created a context on device 0";
  EXPECT_EQ(sim().device_calls(0), 0u);
}

// N2: a thread that chose a device gets it back after the runtime's call.
TEST_F(SimDeviceTest, AThreadsOwnDeviceIsRestored) {
  make_rank1();
  Stream st = rt().create_stream();
  on_fresh_thread([&] {
    ASSERT_EQ(api().set_device(ctx(), 0), 0);  // the engine's own device for this thread
    rt().synchronize_stream(st.view());
    int current = -1;
    ASSERT_EQ(api().current_device(ctx(), &current), 0);
    EXPECT_EQ(current, 0);
  });
}

// Issue 25 (6): a thread whose current context is a non-primary one (another library's
// cuCtxCreate) gets the primary context bound for the runtime's calls, even when that context is
// the runtime's own device's, and its own context back afterwards. The sim refuses every call
// made in such a context, as a GPU refuses the primary context's streams and events there.
TEST_F(SimDeviceTest, AThreadInANonPrimaryContextGetsThePrimaryOneBound) {
  make_rank1();
  Stream st = rt().create_stream();
  for (const int device : {1, 0}) {
    on_fresh_thread([&] {
      ASSERT_EQ(sim().make_foreign_context(device), 0);
      EXPECT_EQ(api().stream_synchronize(ctx(), reinterpret_cast<void*>(st.native())),
                kInvalidHandle)
          << "the sim models calls in a non-primary context";
      (void)api().get_last_error(ctx());
      EXPECT_NO_THROW(rt().synchronize_stream(st.view())) << "context device " << device;
      DeviceBuffer buf = rt().allocate_device(4096);
      EXPECT_NE(buf.data(), nullptr);
      EXPECT_TRUE(sim().foreign_context_current()) << "the thread's own context is given back";
      int current = -1;
      ASSERT_EQ(api().current_device(ctx(), &current), 0);
      EXPECT_EQ(current, device);
    });
  }
}

// N3: every call binds the runtime's device — queries, synchronizes, destroys and frees
// included, and the destructor — each made from a thread that never chose a device.
TEST_F(SimDeviceTest, EveryCallBindsTheRuntimesDevice) {
  make_rank1();
  Stream st = rt().create_stream();
  Event a = rt().create_event(true);
  Event b = rt().create_event(true);
  DeviceBuffer dev = rt().allocate_device(4096);
  DeviceBuffer dev2 = rt().allocate_device(4096);
  HostMem mem(4096);
  HostRegistration reg = rt().register_host(mem.data(), 4096);
  rt().record_event(a.view(), st.view());
  rt().record_event(b.view(), st.view());
  rt().synchronize_stream(st.view());
  const std::pair<const char*, std::function<void()>> calls[] = {
      {"query_event", [&] { (void)rt().query_event(a.view()); }},
      {"synchronize_event", [&] { rt().synchronize_event(a.view()); }},
      {"synchronize_stream", [&] { rt().synchronize_stream(st.view()); }},
      {"elapsed_seconds", [&] { (void)rt().elapsed_seconds(a.view(), b.view()); }},
      {"stream_capturing", [&] { (void)rt().stream_capturing(st.view()); }},
      {"destroy_event", [&] { b.reset(); }},
      {"free_device", [&] { dev.reset(); }},
      {"free_device_async", [&] { dev2.release_async(st.view()); }},
      {"unregister_host", [&] { (void)reg.reset(); }},
      {"destroy_stream", [&] { st.reset(); }},
      {"destroy_event (last)", [&] { a.reset(); }},
      {"~GpuRuntime", [&] { runtime_.reset(); }},
  };
  for (const auto& [name, call] : calls) {
    on_fresh_thread(call);
    EXPECT_FALSE(sim().context_created(0)) << name << " created a context on device 0";
    EXPECT_EQ(sim().device_calls(0), 0u) << name << " ran on device 0";
  }
}

// N6: the staged descriptor buffers are stream-ordered memory of their lane, freed in stream
// order when the lane goes: no free of cudaMalloc memory with cudaFreeAsync, no device-wide wait.
TEST_F(SimDeviceTest, StagedDescriptorsAreFreedInStreamOrderTheWayTheyWereAllocated) {
  make();
  const std::int64_t live = sim().counters().live_device_allocations.load();
  {
    KvRig s(rt(), 8, 4096, 4);
    // Pinned frees synchronize (cudaFreeHost), the ring's host buffers included: only the
    // device-memory frees must not.
    const auto device_memory_syncs = [&] {
      return sim().counters().device_syncs.load() - sim().counters().pinned_free_syncs.load();
    };
    const std::uint64_t syncs = device_memory_syncs();
    {
      TransferEngine e(rt(), s.layout, kernel_only());
      submit_load(e, 1, {0, 3}, {2, 6});
      ASSERT_TRUE(e.wait_all().at(0).success);
      EXPECT_EQ(rt().counters().kernel_launches, 1u);
    }  // the engine's lanes go: their rings are freed
    EXPECT_EQ(sim().counters().mismatched_frees.load(), 0u)
        << "cudaFreeAsync of memory that cudaMallocAsync did not allocate";
    EXPECT_EQ(device_memory_syncs(), syncs) << "a device-wide free of device memory";
    DeviceBuffer scratch = rt().allocate_device(4096);
    Stream st = rt().create_stream();
    scratch.release_async(st.view());
    rt().synchronize_stream(st.view());
    EXPECT_EQ(sim().counters().mismatched_frees.load(), 0u);
  }
  EXPECT_EQ(sim().counters().live_device_allocations.load(), live);
}

// Issue 25 (6): a device without memory pools (cudaDevAttrMemoryPoolsSupported 0, some vGPUs)
// has the stream-ordered calls, but they answer "not supported": device buffers and staged kernel
// descriptors fall back to plain allocation, and jobs still copy exactly.
TEST_F(SimDeviceTest, ADeviceWithoutMemoryPoolsAllocatesPlainly) {
  SimOptions no_pools;
  no_pools.memory_pools = false;
  RuntimeOptions ro;
  ro.kernel_stage_descriptors = true;
  make(ro, no_pools);
  void* p = nullptr;
  EXPECT_EQ(api().device_malloc_async(ctx(), &p, 4096, nullptr), 801) << "the device's refusal";
  (void)api().get_last_error(ctx());
  const std::int64_t live = sim().counters().live_device_allocations.load();
  {
    KvRig s(rt(), 8, 4096, 4);
    {
      TransferEngine e(rt(), s.layout, kernel_only());
      submit_load(e, 1, {0, 3}, {2, 6});
      ASSERT_TRUE(e.wait_all().at(0).success);
    }
    EXPECT_EQ(rt().counters().kernel_launches, 1u);
    EXPECT_TRUE(s.device_block_equals_slot(2, 0));
    EXPECT_TRUE(s.device_block_equals_slot(6, 3));
    DeviceBuffer scratch = rt().allocate_device(4096);
    Stream st = rt().create_stream();
    scratch.release_async(st.view());
    rt().synchronize_stream(st.view());
  }
  EXPECT_EQ(sim().counters().live_device_allocations.load(), live);
  EXPECT_EQ(sim().sticky_error(), 0);
}

// N7: a submit that waits on a capturing stream is refused before anything is enqueued, and the
// caller's capture survives; after the capture the same submit runs.
TEST_F(SimDeviceTest, ASubmitWaitingOnACapturingStreamIsRefused) {
  make();
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, dma_only());
  Stream compute = rt().create_stream();
  ASSERT_EQ(sim().begin_capture(reinterpret_cast<void*>(compute.native()), gpu::kCaptureModeGlobal),
            0);
  try {
    submit_load(e, 1, {0, 2}, {1, 5}, WaitOn::stream(compute.view()));
    ADD_FAILURE() << "a submit joined the caller's capture";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kState);
    EXPECT_THAT(err.what(), HasSubstr("capturing"));
  }
  EXPECT_EQ(sim().end_capture(reinterpret_cast<void*>(compute.native())), 0)
      << "the caller's capture was broken";
  EXPECT_TRUE(e.poll().empty());
  submit_load(e, 1, {0, 2}, {1, 5}, WaitOn::stream(compute.view()));  // the id is free again
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_TRUE(s.device_block_equals_slot(5, 2));
}

// N7: an event recorded during a capture is found out after the lane's wait: the job fails, and
// once the capture has ended the lane serves the next job.
TEST_F(SimDeviceTest, AJobWaitingOnAnEventRecordedInACaptureFails) {
  make();
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, dma_only());
  Stream compute = rt().create_stream();
  Event captured = rt().create_event();
  ASSERT_EQ(sim().begin_capture(reinterpret_cast<void*>(compute.native()), gpu::kCaptureModeGlobal),
            0);
  rt().record_event(captured.view(), compute.view());
  submit_load(e, 1, {0, 2}, {1, 5}, WaitOn::event(captured.view()));
  EXPECT_EQ(sim().end_capture(reinterpret_cast<void*>(compute.native())), kCaptureUnjoined);
  const auto r = e.wait_all();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].success);
  EXPECT_THAT(r[0].error, HasSubstr("graph capture"));
  submit_load(e, 2, {1}, {3});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_TRUE(s.device_block_equals_slot(3, 1));
}

// Issue 25 (4): while the caller's capture still runs, the lane it pulled in captures too: a
// later submit on that lane would become graph nodes that never run. It is refused, naming the
// capture, and nothing is enqueued; after the caller's capture ends the lane works again.
TEST_F(SimDeviceTest, ASubmitOnALaneStillInTheCallersCaptureIsRefused) {
  make();
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, dma_only());
  Stream compute = rt().create_stream();
  Event captured = rt().create_event();
  void* cs = reinterpret_cast<void*>(compute.native());
  ASSERT_EQ(sim().begin_capture(cs, gpu::kCaptureModeGlobal), 0);
  rt().record_event(captured.view(), compute.view());
  submit_load(e, 1, {0, 2}, {1, 5}, WaitOn::event(captured.view()));
  const std::uint64_t copies =
      sim().counters().memcpy_calls.load() + sim().counters().batch_calls.load();
  try {
    submit_load(e, 2, {1}, {3});
    ADD_FAILURE() << "a submit on a capturing lane was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kState);
    EXPECT_THAT(err.what(), HasSubstr("lane's stream is part of a graph capture"));
  }
  EXPECT_EQ(sim().counters().memcpy_calls.load() + sim().counters().batch_calls.load(), copies)
      << "the refused job enqueued copies";
  EXPECT_EQ(sim().end_capture(cs), kCaptureUnjoined);
  const auto r = e.wait_all();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].success);
  submit_load(e, 3, {1}, {3});
  ASSERT_TRUE(e.wait_all().at(0).success);
  EXPECT_TRUE(s.device_block_equals_slot(3, 1));
}

// Issue 25 (4): memory cudaMallocAsync hands out on a capturing stream is an allocation node of
// the capture's graph. The simulator never launches graphs, so after the capture (here one that
// failed) a copy into it faults when it runs, as on a GPU: an illegal address. The same
// allocation on a stream that does not capture is plain memory.
TEST_F(SimDeviceTest, AnAllocationMadeInACaptureBelongsToItsGraphAndFaultsOnReuse) {
  make();
  void* capturing = nullptr;
  void* other = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &capturing), 0);
  ASSERT_EQ(api().stream_create(ctx(), &other), 0);
  HostMem src(4096);
  fill(src.data(), src.bytes, 7);
  ASSERT_EQ(api().host_register(ctx(), src.data(), 4096), 0);
  void* plain = nullptr;
  ASSERT_EQ(api().device_malloc_async(ctx(), &plain, 4096, other), 0);
  ASSERT_EQ(api().memcpy_async(ctx(), plain, src.data(), 4096, gpu::kMemcpyHostToDevice, other), 0);
  ASSERT_EQ(api().stream_synchronize(ctx(), other), 0) << sim().sticky_reason();
  EXPECT_EQ(sim().counters().graph_allocations.load(), 0u);

  ASSERT_EQ(sim().begin_capture(capturing, gpu::kCaptureModeGlobal), 0);
  void* owned = nullptr;
  ASSERT_EQ(api().device_malloc_async(ctx(), &owned, 4096, capturing), 0);
  EXPECT_EQ(sim().counters().graph_allocations.load(), 1u);
  EXPECT_EQ(api().stream_synchronize(ctx(), capturing), kCaptureUnsupported);  // breaks it
  (void)api().get_last_error(ctx());
  EXPECT_EQ(sim().end_capture(capturing), kCaptureInvalidated);
  EXPECT_EQ(api().memcpy_async(ctx(), owned, src.data(), 4096, gpu::kMemcpyHostToDevice, other), 0)
      << "accepted at the call, as on a GPU";
  EXPECT_EQ(api().stream_synchronize(ctx(), other), kIllegalAddress);
  EXPECT_EQ(sim().sticky_error(), kIllegalAddress);
  EXPECT_THAT(sim().sticky_reason(), HasSubstr("capturing a graph"));
}

// Issue 25 (4): the kernel path on a stream that captures a graph is refused before its
// descriptor ring is touched (Note [No kernel path in a capture]): no buffer is allocated in the
// capture (which would die with its graph), no slot event is recorded there (907 afterwards), and
// the caller's capture is left intact. After the capture the same copies run exactly.
TEST_F(SimDeviceTest, TheKernelPathIsRefusedOnACapturingStreamAndItsRingNeverGrowsThere) {
  RuntimeOptions ro;
  ro.kernel_stage_descriptors = true;  // slots allocate device memory on the stream
  make(ro);
  HostMem host(64 * 1024);
  fill(host.data(), host.bytes, 11);
  HostRegistration reg = rt().register_host(host.data(), host.bytes);
  DeviceBuffer dev = rt().allocate_device(64 * 1024);
  std::vector<CopyDescriptor> descs;
  for (std::size_t i = 0; i < 16; ++i) {
    descs.push_back({reg.device_pointer(host.data() + i * 4096),
                     static_cast<std::byte*>(dev.data()) + i * 4096, 4096});
  }
  Stream st = rt().create_stream();
  void* cs = reinterpret_cast<void*>(st.native());
  const std::uint64_t launches = rt().counters().kernel_launches;
  ASSERT_EQ(sim().begin_capture(cs, gpu::kCaptureModeGlobal), 0);
  try {
    rt().enqueue_copies(st.view(), descs, CopyKind::kHostToDevice, CopyPath::kKernel);
    ADD_FAILURE() << "the kernel path was enqueued into a capture";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kState);
    EXPECT_THAT(err.what(), HasSubstr("capturing a graph"));
  }
  EXPECT_EQ(sim().counters().graph_allocations.load(), 0u) << "the ring grew inside the capture";
  EXPECT_EQ(sim().end_capture(cs), 0) << "the caller's capture was broken";
  EXPECT_EQ(rt().counters().kernel_launches, launches);
  rt().enqueue_copies(st.view(), descs, CopyKind::kHostToDevice, CopyPath::kKernel);
  rt().synchronize_stream(st.view());
  EXPECT_EQ(sim().sticky_error(), 0) << sim().sticky_reason();
  std::vector<std::byte> got(64 * 1024);
  rt().memcpy_sync(got.data(), dev.data(), got.size());
  EXPECT_EQ(std::memcmp(got.data(), host.data(), got.size()), 0);
}

// Issue 25 (4): event queries and synchronizes, stream synchronizes and elapsed-time reads are
// potentially unsafe during capture. From a thread in the default global mode they break
// another thread's global capture (the raw call); the runtime makes them in thread-local mode
// (Note [Thread-local capture mode]), so an engine polling on its own thread leaves the model's
// capture alone.
TEST_F(SimDeviceTest, RuntimeQueriesAndWaitsLeaveAnotherThreadsCaptureValid) {
  make();
  Stream st = rt().create_stream();
  Event a = rt().create_event(/*timing=*/true);
  Event b = rt().create_event(/*timing=*/true);
  rt().record_event(a.view(), st.view());
  rt().record_event(b.view(), st.view());
  void* model = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &model), 0);
  for (const bool raw : {true, false}) {
    SCOPED_TRACE(raw ? "a raw event query in global mode" : "the runtime's queries and waits");
    std::promise<void> begun;
    std::promise<void> queried;
    std::future<int> ended = std::async(std::launch::async, [&] {
      if (sim().begin_capture(model, gpu::kCaptureModeGlobal) != 0) return -1;
      begun.set_value();
      queried.get_future().wait();
      return sim().end_capture(model);
    });
    begun.get_future().wait();
    if (raw) {
      EXPECT_EQ(api().event_query(ctx(), reinterpret_cast<void*>(a.native())), kCaptureUnsupported);
      (void)api().get_last_error(ctx());
    } else {
      EXPECT_NO_THROW({
        rt().synchronize_stream(st.view());
        rt().synchronize_event(b.view());
        EXPECT_TRUE(rt().query_event(a.view()));
        EXPECT_GE(rt().elapsed_seconds(a.view(), b.view()), 0.0);
      });
    }
    queried.set_value();
    EXPECT_EQ(ended.get(), raw ? kCaptureInvalidated : 0);
  }
  EXPECT_EQ(sim().counters().captures_invalidated.load(), 1u);
  EXPECT_EQ(api().stream_destroy(ctx(), model), 0);
}

// The scope keeps what CUDA's modes promise on the calling thread itself: its own global capture
// still refuses a query (thread-local mode ignores only other threads), and a thread the caller
// put in relaxed mode stays relaxed (thread-local would refuse there), its mode given back after.
TEST_F(SimDeviceTest, TheThreadLocalScopeKeepsTheCallersOwnCaptureRules) {
  make();
  Stream st = rt().create_stream();
  Event a = rt().create_event();
  rt().record_event(a.view(), st.view());
  rt().synchronize_stream(st.view());
  void* own = nullptr;
  ASSERT_EQ(api().stream_create(ctx(), &own), 0);

  ASSERT_EQ(sim().begin_capture(own, gpu::kCaptureModeGlobal), 0);
  EXPECT_THROW((void)rt().query_event(a.view()), Error) << "a query inside the caller's capture";
  EXPECT_EQ(sim().end_capture(own), kCaptureInvalidated);

  int mode = 0;
  ASSERT_EQ(api().exchange_capture_mode(ctx(), &mode, 1), 0);  // this thread: relaxed
  ASSERT_EQ(sim().begin_capture(own, gpu::kCaptureModeGlobal), 0);
  EXPECT_NO_THROW(EXPECT_TRUE(rt().query_event(a.view())));
  EXPECT_EQ(sim().end_capture(own), 0) << "relaxed mode was not kept";
  int now = mode;
  ASSERT_EQ(api().exchange_capture_mode(ctx(), &now, 0), 0);
  EXPECT_EQ(now, gpu::kCaptureModeRelaxed) << "the caller's relaxed mode was not given back";
  EXPECT_EQ(api().stream_destroy(ctx(), own), 0);
}

// Issue 25 (8): timing events only when statistics ask (Note [Job timing]). With job_timing (the
// default) each job records two timing events, its start and end, and the event it records on the
// caller's stream to wait for it is a plain one; without it a job records no timing event at all
// and its seconds are 0, while its copies are as exact.
TEST_F(SimDeviceTest, TimingEventsAreRecordedOnlyForTimedJobs) {
  make();
  KvRig s(rt(), 8, 4096, 4);
  Stream compute = rt().create_stream();
  for (const bool timing : {true, false}) {
    SCOPED_TRACE(timing ? "job_timing" : "no job_timing");
    EngineOptions o = dma_only();
    o.job_timing = timing;
    TransferEngine e(rt(), s.layout, o);
    const std::uint64_t before = sim().counters().timing_records.load();
    const std::uint64_t b = timing ? 1 : 0;  // other blocks each round: each must be copied
    submit_load(e, 1, {0, 2}, {b, b + 4}, WaitOn::stream(compute.view()));
    submit_load(e, 2, {3}, {b + 6});
    const auto r = e.wait_all();
    ASSERT_EQ(r.size(), 2u);
    for (const JobResult& j : r) {
      EXPECT_TRUE(j.success) << j.error;
      if (!timing) {
        EXPECT_EQ(j.seconds, 0.0);
      }
    }
    EXPECT_EQ(sim().counters().timing_records.load() - before, timing ? 4u : 0u);
    EXPECT_TRUE(s.device_block_equals_slot(b + 4, 2));
    EXPECT_TRUE(s.device_block_equals_slot(b + 6, 3));
  }
}

// Issue 25 (8): the copy kernel keeps its bytes in flight for pieces under 4 KiB. Each thread's
// group of loads could move kBatchCopyLoadsInFlight x 16 bytes; a batch of 1 KiB pieces used to
// fill a quarter of them (one piece per 4 KiB chunk, 64 of 256 lanes busy). Packed several to a
// chunk, every lane of every full group carries data, and 1000-byte pieces (a narrow 8-byte
// tail each) and 4080-byte ones still fill most of them. The bytes are checked too.
double group_fill(SimDeviceTest& t, std::size_t piece, std::size_t count) {
  DeviceRuntime& rt = t.rt();
  const std::size_t stride = (piece + 1023) / 1024 * 1024;
  HostMem host(count * stride);
  fill(host.data(), host.bytes, piece);
  HostRegistration reg = rt.register_host(host.data(), host.bytes);
  DeviceBuffer dev = rt.allocate_device(count * stride);
  std::vector<CopyDescriptor> descs;
  for (std::size_t i = 0; i < count; ++i) {
    descs.push_back({reg.device_pointer(host.data() + i * stride),
                     static_cast<std::byte*>(dev.data()) + i * stride, piece});
  }
  const std::uint64_t moved = t.sim().counters().kernel_group_bytes.load();
  const std::uint64_t capacity = t.sim().counters().kernel_group_capacity.load();
  Stream st = rt.create_stream();
  rt.enqueue_copies(st.view(), descs, CopyKind::kHostToDevice, CopyPath::kKernel);
  rt.synchronize_stream(st.view());
  EXPECT_EQ(t.sim().sticky_error(), 0) << t.sim().sticky_reason();
  std::vector<std::byte> got(count * stride);
  rt.memcpy_sync(got.data(), dev.data(), got.size());
  for (std::size_t i = 0; i < count; ++i) {
    EXPECT_EQ(std::memcmp(got.data() + i * stride, host.data() + i * stride, piece), 0) << i;
  }
  const std::uint64_t m = t.sim().counters().kernel_group_bytes.load() - moved;
  const std::uint64_t c = t.sim().counters().kernel_group_capacity.load() - capacity;
  EXPECT_EQ(m, piece * count) << "every byte is moved once";
  return c == 0 ? 0.0 : static_cast<double>(m) / static_cast<double>(c);
}
TEST_F(SimDeviceTest, TheCopyKernelKeepsItsLoadsBusyForPiecesUnder4KiB) {
  make();
  // 256 pieces of 1 KiB: 16 full groups of 4 x 4 KiB.
  EXPECT_DOUBLE_EQ(group_fill(*this, 1024, 256), 1.0);
  EXPECT_GT(group_fill(*this, 1000, 256), 0.9);
  EXPECT_GT(group_fill(*this, 4096 - 16, 64), 0.9);
}

// N8: with HIP's semantics the flag a stream waits on must be signal memory; the runtime's
// flags are, so a gate works, and a word of registered memory is refused.
TEST_F(SimDeviceTest, HipFlagWaitsUseSignalMemory) {
  make({}, SimOptions::hip_semantics());
  KvRig s(rt(), 8, 4096, 4);
  TransferEngine e(rt(), s.layout, dma_only());
  Stream compute = rt().create_stream();
  {
    FlagGate gate(rt());
    gate.hold(compute.view());
    submit_load(e, 1, {0, 2}, {1, 5}, WaitOn::stream(compute.view()));
  }
  ASSERT_TRUE(e.wait_all().at(0).success);
  HostMem page(4096);
  HostRegistration reg = rt().register_host(page.data(), 4096);
  EXPECT_THROW(
      rt().wait_host_flag(compute.view(), reinterpret_cast<std::uint32_t*>(page.data()), 1), Error);
}

// N10: a failing driver-level call (cuStreamWaitValue32) reports the driver's own code.
TEST_F(SimDeviceTest, AFailedFlagWaitReportsTheDriversOwnCode) {
  make();
  Stream st = rt().create_stream();
  HostFlag flag = rt().create_host_flag();
  sim().faults().fail_wait_value = 801;  // CUDA_ERROR_NOT_SUPPORTED
  try {
    rt().wait_host_flag(st.view(), flag.data(), 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_THAT(err.what(), HasSubstr("NotSupported"));
    EXPECT_THAT(err.what(), HasSubstr("driver error 801"));
  }
}

// N11: a ring slot whose closing event could not be recorded is retired; destroying the runtime
// waits for the device before freeing it, even when the slot's stream is a caller's (which the
// runtime cannot synchronize: it may be gone) and the legacy stream would not wait for it.
TEST_F(SimDeviceTest, DestroyingTheRuntimeWaitsForAKernelOnARetiredSlot) {
  make();
  std::unique_ptr<DeviceRuntime> owner = detail::make_sim_runtime({}, device_);  // the caller's
  HostMem host(4096);
  fill(host.data(), 4096, 9);
  HostRegistration reg = owner->register_host(host.data(), 4096);
  DeviceBuffer dev = owner->allocate_device(4096);
  Stream st = owner->create_stream();
  HostFlag gate = owner->create_host_flag();
  owner->wait_host_flag(st.view(), gate.data(), 1);
  sim().faults().fail_event_records = 1;  // the record after the launch fails: slot retired
  const CopyDescriptor d{reg.device_pointer(host.data()), dev.data(), 4096};
  EXPECT_THROW(
      rt().enqueue_copies(st.view(), std::span(&d, 1), CopyKind::kHostToDevice, CopyPath::kKernel),
      Error);
  const std::uint64_t syncs = sim().counters().device_syncs.load();
  std::thread opener([&] {
    // Opens once the destructor waits for the device (or, if it never does, after a while).
    (void)eventually([&] { return sim().counters().device_syncs.load() > syncs; });
    gate.set(1);
  });
  runtime_.reset();
  opener.join();
  owner->synchronize_stream(st.view());
  EXPECT_EQ(sim().sticky_error(), 0) << sim().sticky_reason();
  std::vector<std::byte> got(4096);
  owner->memcpy_sync(got.data(), dev.data(), 4096);
  EXPECT_EQ(std::memcmp(got.data(), host.data(), 4096), 0);
}

// N13: without unified addressing (ROCm) pieces registered one by one have different device
// offsets; the kernel path still opens, each copy goes through its own piece, and a copy that
// crosses from one piece into the next is split there.
TEST_F(SimDeviceTest, KernelPathWorksWithPiecesAtDifferentDeviceOffsets) {
  SimOptions o;
  o.unified_addressing = false;
  make({}, o);
  KvRig s(rt(), 8, 4096, 4);
  EngineOptions eo = kernel_only();
  eo.register_host = false;
  TransferEngine e(rt(), s.layout, eo);
  HostRegistration first = rt().register_host(s.host.data(), 2 * 4096);
  HostRegistration second = rt().register_host(s.host.data() + 2 * 4096, 2 * 4096);
  e.note_host_registration(second);
  e.note_host_registration(first);
  ASSERT_NE(static_cast<std::byte*>(second.device_base()) - s.host.data(),
            static_cast<std::byte*>(first.device_base()) - s.host.data())
      << "the simulator gives each piece its own offset";
  ASSERT_TRUE(e.host_registered());
  // Chunks 1 and 2 are adjacent in host memory across the pieces' boundary, and blocks 3 and 4 on
  // the device: one coalesced copy that must be split.
  submit_load(e, 1, {1, 2, 0}, {3, 4, 7});
  auto r = e.wait_all();
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  submit_store(e, 2, {3}, {5});
  r = e.wait_all();
  ASSERT_TRUE(r.at(0).success) << r[0].error;
  EXPECT_EQ(rt().counters().kernel_launches, 2u) << "the kernel path stayed off";
  EXPECT_EQ(sim().sticky_error(), 0) << sim().sticky_reason();
  EXPECT_TRUE(s.device_block_equals_slot(3, 1));
  EXPECT_TRUE(s.device_block_equals_slot(4, 2));
  EXPECT_TRUE(s.device_block_equals_slot(7, 0));
  EXPECT_EQ(std::memcmp(s.host.data() + 3 * 4096, s.device_image.data() + 5 * 4096, 4096), 0);
  e.shutdown();  // before the pieces go
}

// gfx942 with Debian's ROCm 5.2: a device whose architecture the build's kernels lack is refused
// loudly, naming both, unless DMA only is asked for.
TEST_F(SimDeviceTest, ADeviceWhoseArchitectureWasNotBuiltIsRefused) {
  SimOptions o;
  o.device_arch = "gfx942:sramecc+:xnack-";
  o.kernel_archs = "gfx90a";
  auto device = std::make_shared<SimDevice>(o);
  try {
    (void)detail::make_sim_runtime({}, device);
    ADD_FAILURE() << "a device without kernels was accepted silently";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kNotAvailable);
    EXPECT_THAT(err.what(), HasSubstr("gfx942"));
    EXPECT_THAT(err.what(), HasSubstr("gfx90a"));
    EXPECT_THAT(err.what(), HasSubstr("KVOFFLOAD_ALLOW_MISSING_KERNEL"));
  }
  RuntimeOptions allow;
  allow.allow_missing_kernel = true;
  auto dma_only_runtime = detail::make_sim_runtime(allow, device);
  EXPECT_FALSE(dma_only_runtime->supports_kernel_path());
  o.kernel_archs = "gfx90a;gfx942";
  EXPECT_TRUE(detail::make_sim_runtime({}, std::make_shared<SimDevice>(o))->supports_kernel_path());
}

// The driver floor: a driver older than the module's major version is named, with the version
// needed and what to do, by probe and by the runtime's creation.
TEST_F(SimDeviceTest, ADriverOlderThanTheModuleIsNamedWithWhatToDo) {
  SimOptions o;
  o.driver_version = 12040;
  o.runtime_version = 13000;
  auto device = std::make_shared<SimDevice>(o);
  try {
    (void)detail::make_sim_runtime({}, device);
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kNotAvailable);
    EXPECT_THAT(err.what(), HasSubstr("12.4"));
    EXPECT_THAT(err.what(), HasSubstr("13.0"));
    EXPECT_THAT(err.what(), HasSubstr("rebuild kvoffload"));
  }
  o.driver_version = 13010;  // a newer driver of the same major is fine
  EXPECT_NO_THROW((void)detail::make_sim_runtime({}, std::make_shared<SimDevice>(o)));
}

}  // namespace
}  // namespace kvoffload
