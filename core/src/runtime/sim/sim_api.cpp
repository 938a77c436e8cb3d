// The simulated device's vendor-table entries for errors, devices and versions, streams and
// events (Note [Simulated device] in sim_device.hpp): each checks its arguments and the device's
// state as the CUDA runtime does and enqueues on the stream executor (sim_stream.cpp).
#include <algorithm>
#include <cstdio>

#include "runtime/sim/sim_device_internal.hpp"

namespace kvoffload::gpu::sim {

namespace {

struct ErrorText {
  int code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {kSuccess, "simSuccess", "no error"},
    {kInvalidValue, "simErrorInvalidValue", "invalid argument"},
    {kOutOfMemory, "simErrorMemoryAllocation", "out of memory"},
    {kInsufficientDriver, "simErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {kDevicesUnavailable, "simErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {kInvalidDevice, "simErrorInvalidDevice", "invalid device ordinal"},
    {kInvalidContext, "simErrorInvalidContext",
     "invalid device context (no device set on this thread)"},
    {kNoKernelImage, "simErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {kInvalidHandle, "simErrorInvalidResourceHandle", "invalid resource handle"},
    {kNotReady, "simErrorNotReady", "device not ready"},
    {kIllegalAddress, "simErrorIllegalAddress", "an illegal memory access was encountered"},
    {kLaunchOutOfResources, "simErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {kAlreadyRegistered, "simErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {kNotRegistered, "simErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {kMisalignedAddress, "simErrorMisalignedAddress", "misaligned address"},
    {kNotPermitted, "simErrorNotPermitted", "operation not permitted"},
    {kNotSupported, "simErrorNotSupported", "operation not supported"},
    {kCaptureUnsupported, "simErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {kCaptureInvalidated, "simErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {kCaptureMerge, "simErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {kCaptureUnmatched, "simErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream"},
    {kCaptureUnjoined, "simErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work (a stream that joined the capture was not joined back)"},
    {kCaptureIsolation, "simErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {kCaptureImplicit, "simErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {kCapturedEvent, "simErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {kCaptureWrongThread, "simErrorStreamCaptureWrongThread",
     "capture not initiated in relaxed mode was ended by another thread"},
};

const ErrorText* find_error(int code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

const char* sim_error_name(void*, int err) {
  const ErrorText* e = find_error(driver_code(err));
  return e != nullptr ? e->name : "simErrorUnknown";
}
const char* sim_error_string(void*, int err) {
  const ErrorText* e = find_error(driver_code(err));
  return e != nullptr ? e->text : "unknown error";
}
int sim_get_last_error(void* ctx) {
  ThreadState& t = thread_state(dev(ctx).uid);
  const int err = t.last_error;
  t.last_error = 0;
  return err != 0 ? err : dev(ctx).sticky();
}
int sim_get_device_count(void* ctx, int* count) {
  auto& d = dev(ctx);
  // CUDA's minor-version compatibility: a runtime runs on any driver of its major version.
  if (d.options.driver_version < d.options.runtime_version / 1000 * 1000) {
    *count = 0;
    return d.fail(kInsufficientDriver);
  }
  *count = d.options.device_count;
  return kSuccess;
}
int sim_get_device(void* ctx, int* device) {
  const int bound = thread_state(dev(ctx).uid).bound;
  *device = bound < 0 ? 0 : bound;  // a thread without a context reports device 0, as CUDA does
  return kSuccess;
}
int sim_current_device(void* ctx, int* device) {
  *device = thread_state(dev(ctx).uid).bound;
  return kSuccess;
}
int sim_foreign_context(void* ctx, void** context) {
  *context = thread_state(dev(ctx).uid).foreign;
  return kSuccess;
}
int sim_set_context(void* ctx, void* context) {
  auto& d = dev(ctx);
  if (context != &d.foreign) return d.fail(kInvalidContext);
  ThreadState& t = thread_state(d.uid);
  t.bound = d.foreign_device;
  t.foreign = context;
  return kSuccess;
}
int sim_set_device(void* ctx, int device) {
  auto& d = dev(ctx);
  if (device < 0 || device >= d.options.device_count) return d.fail(kInvalidDevice);
  // cudaSetDevice creates the device's primary context (CUDA 12.0 and later) and binds it,
  // replacing a non-primary context current on the thread.
  if (const int err = d.create_context(device); err != kSuccess) return d.fail(err);
  thread_state(dev(ctx).uid).bound = device;
  thread_state(dev(ctx).uid).foreign = nullptr;
  d.devices[static_cast<std::size_t>(device)].calls.fetch_add(1, std::memory_order_relaxed);
  return kSuccess;
}
int sim_device_synchronize(void* ctx) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  d.counters.device_syncs.fetch_add(1);
  d.synchronize_all();
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_device_describe(void* ctx, int device, char* name, std::size_t name_len, char* arch,
                        std::size_t arch_len) {
  auto& d = dev(ctx);
  if (device < 0 || device >= d.options.device_count) return d.fail(kInvalidDevice);
  (void)std::snprintf(name, name_len, "kvoffload simulated device %d (%s addressing)", device,
                      d.options.unified_addressing ? "unified" : "separate");
  (void)std::snprintf(arch, arch_len, "%s", d.options.device_arch.c_str());
  return kSuccess;
}
int sim_driver_version(void* ctx, int* version) {
  *version = dev(ctx).options.driver_version;
  return kSuccess;
}
int sim_runtime_version(void* ctx, int* version) {
  *version = dev(ctx).options.runtime_version;
  return kSuccess;
}
void sim_version_text(void*, int version, char* out, std::size_t len) {
  (void)std::snprintf(out, len, "%d.%d", version / 1000, (version % 1000) / 10);
}
int sim_exchange_capture_mode(void* ctx, int* mode, int relaxed) {
  ThreadState& t = thread_state(dev(ctx).uid);
  const int previous = t.capture_mode;
  t.capture_mode = relaxed != 0 ? kCaptureModeRelaxed : *mode;
  *mode = previous;
  return kSuccess;
}
int sim_stream_capturing(void* ctx, void* stream, int* capturing) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  *capturing = 0;
  SimStream* s = d.stream_of(stream, cur);
  std::lock_guard lock(d.mu);
  if (stream == nullptr) {
    for (const auto& c : d.captures) {
      for (SimStream* m : c->members) {
        if (m->blocking && m->device == cur) {
          thread_state(dev(ctx).uid).last_error = kCaptureImplicit;
          return kCaptureImplicit;  // cudaStreamIsCapturing(cudaStreamLegacy)
        }
      }
    }
    return kSuccess;
  }
  *capturing = s->capture ? 1 : 0;
  return kSuccess;
}

int sim_stream_create(void* ctx, void** stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  auto s = std::make_unique<SimStream>(d, cur, /*blocking=*/false);
  std::lock_guard lock(d.mu);
  d.streams.insert(s.get());
  *stream = s.release();
  return kSuccess;
}
int sim_stream_destroy(void* ctx, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  if (stream == nullptr) return d.fail(kInvalidHandle);
  auto* s = static_cast<SimStream*>(stream);
  {
    std::lock_guard lock(d.mu);
    if (d.streams.erase(s) == 0) return d.fail(kInvalidHandle);
  }
  d.retire(s);  // returns before the stream's work ends, as cudaStreamDestroy does
  return kSuccess;
}
int sim_stream_synchronize(void* ctx, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);  // potentially unsafe (Note [Simulated device])
  SimStream* s = d.stream_of(stream, cur);
  {
    std::lock_guard lock(d.mu);
    if (s->capture) {  // synchronizing a capturing stream is refused and breaks the capture
      d.invalidate(*s->capture);
      thread_state(dev(ctx).uid).last_error = kCaptureUnsupported;
      return kCaptureUnsupported;
    }
  }
  s->synchronize();
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_stream_wait_event(void* ctx, void* stream, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  if (event == nullptr) return d.fail(kInvalidHandle);
  auto* e = static_cast<SimEvent*>(event);
  SimStream* s = d.stream_of(stream, cur);  // another device's event is fine (CUDA allows it)
  std::shared_ptr<Marker> m;
  {
    std::lock_guard lock(d.mu);
    // Last recorded in a capture that has ended: its record is a node of a graph, and nothing
    // outside that graph may wait on it until it is recorded again (cudaErrorCapturedEvent).
    if (e->capture && !d.captures.contains(e->capture)) return d.fail(kCapturedEvent);
    if (e->capture && d.captures.contains(e->capture)) {
      Capture& c = *e->capture;
      if (!s->capture) {
        // CUDA's cross-stream rule: waiting on an event recorded during a capture pulls this
        // stream into that capture; what it enqueues from now on is a node, never run.
        s->capture = e->capture;
        s->capture_seq = 0;
        c.members.insert(s);
        return kSuccess;
      }
      if (s->capture != e->capture) {
        d.invalidate(*s->capture);
        d.invalidate(c);
        return d.fail(kCaptureMerge);
      }
      if (s == c.origin && e->capture_stream != s) {
        std::uint64_t& joined = c.rejoined[e->capture_stream];
        joined = std::max(joined, e->capture_seq);  // joined back up to that record
      }
      ++s->capture_seq;
      ++c.nodes;
      return kSuccess;
    }
    if (s->capture) {
      // A captured stream may not depend on work outside its capture.
      d.invalidate(*s->capture);
      return d.fail(kCaptureIsolation);
    }
    m = e->cpu.current();
  }
  if (!m) return kSuccess;  // never recorded: nothing to wait for
  Op op;
  op.kind = Op::Kind::kWaitEvent;
  op.marker = std::move(m);
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  return kSuccess;
}
int sim_stream_wait_value32(void* ctx, void* stream, std::uint32_t* flag, std::uint32_t value) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  // A driver-level call (cuStreamWaitValue32): its failures are driver codes.
  if (const int code = d.faults.fail_wait_value.exchange(0); code != 0) {
    return d.fail(driver_result(code));
  }
  // The flag must be memory the device can see: registered or pinned host memory, and with HIP's
  // semantics signal memory only.
  auto* host = static_cast<std::uint32_t*>(d.translate_kernel(flag, sizeof *flag, cur));
  if (host == nullptr) return d.fail(driver_result(kInvalidValue));
  if (d.options.wait_value_needs_signal_memory) {
    std::lock_guard lock(d.mu);
    auto it = d.host_maps.find(reinterpret_cast<std::uintptr_t>(host));
    if (it == d.host_maps.end() || it->second.kind != HostMapping::Kind::kSignal) {
      thread_state(dev(ctx).uid).last_error = kInvalidValue;
      return kInvalidValue;  // hipStreamWaitValue32 on memory that is not signal memory
    }
  }
  Op op;
  op.kind = Op::Kind::kWaitValue;
  op.flag = host;
  op.flag_value = value;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}
int sim_launch_host_func(void* ctx, void* stream, void (*fn)(void*), void* arg) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  Op op;
  op.kind = Op::Kind::kHostFunc;
  op.fn = fn;
  op.arg = arg;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}
int sim_event_create(void* ctx, void** event, int flags) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  auto* e = new SimEvent();
  e->cpu.timing = (flags & kEventTiming) != 0;
  e->blocking_sync = (flags & kEventBlockingSync) != 0;
  e->device = cur;
  *event = e;
  return kSuccess;
}
int sim_event_destroy(void* ctx, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  delete static_cast<SimEvent*>(event);
  return kSuccess;
}
int sim_event_record(void* ctx, void* event, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  if (event == nullptr) return d.fail(kInvalidHandle);
  if (int n = d.faults.fail_event_records.load();
      n > 0 && d.faults.fail_event_records.fetch_sub(1) >= 1) {
    return d.fail(kInvalidValue);
  }
  auto* e = static_cast<SimEvent*>(event);
  SimStream* s = d.stream_of(stream, cur);
  // "cudaEventRecord() will fail if the input event and input stream are associated to
  // different devices" (CUDA programming guide, multi-device system).
  if (e->device != s->device) return d.fail(kInvalidHandle);
  if (e->cpu.timing) d.counters.timing_records.fetch_add(1);
  {
    std::lock_guard lock(d.mu);
    if (s->capture) {
      if (s->capture->invalidated) return d.fail(kCaptureInvalidated);
      e->capture = s->capture;  // a node of the capture: anyone waiting on it joins it
      e->capture_stream = s;
      e->capture_seq = s->capture_seq;
      return kSuccess;
    }
    e->capture.reset();
  }
  Op op;
  op.kind = Op::Kind::kRecord;
  op.marker = e->cpu.record();
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  return kSuccess;
}
int sim_event_query(void* ctx, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  // A sticky error is reported at once, even while earlier work is still queued: every call of
  // a faulted context returns it.
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);  // potentially unsafe (Note [Simulated device])
  auto* e = static_cast<SimEvent*>(event);
  {
    std::lock_guard lock(d.mu);
    if (e->capture && d.captures.contains(e->capture)) return d.fail(kCaptureUnsupported);
    if (e->capture) return d.fail(kCapturedEvent);  // its capture has ended (see stream_wait_event)
  }
  std::shared_ptr<Marker> m = e->cpu.current();
  if (m && !m->is_done()) return d.fail(kNotReady);
  return kSuccess;
}
int sim_event_synchronize(void* ctx, void* event) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);  // potentially unsafe (Note [Simulated device])
  auto* e = static_cast<SimEvent*>(event);
  {
    std::lock_guard lock(d.mu);
    if (e->capture && d.captures.contains(e->capture)) return d.fail(kCaptureUnsupported);
    if (e->capture) return d.fail(kCapturedEvent);  // its capture has ended (see stream_wait_event)
  }
  if (std::shared_ptr<Marker> m = e->cpu.current()) {
    // On a GPU, synchronizing on an event without cudaEventBlockingSync spins a core until it
    // completes (the default scheduling): counted, so tests can require that host waits sleep.
    if (!m->is_done()) {
      if (!e->blocking_sync) d.counters.spinning_waits.fetch_add(1);
      d.counters.host_waits.fetch_add(1);
    }
    m->wait();
  }
  KVO_SIM_STICKY(d);
  return kSuccess;
}
int sim_event_elapsed_ms(void* ctx, float* ms, void* start, void* end) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);  // potentially unsafe (Note [Simulated device])
  auto* a = static_cast<SimEvent*>(start);
  auto* b = static_cast<SimEvent*>(end);
  if (a->device != b->device) return d.fail(kInvalidHandle);
  {
    std::lock_guard lock(d.mu);
    if (a->capture || b->capture) return d.fail(kCapturedEvent);
  }
  const auto ma = a->cpu.current();
  const auto mb = b->cpu.current();
  if (!a->cpu.timing || !b->cpu.timing || !ma || !mb) return d.fail(kInvalidHandle);
  if (!ma->is_done() || !mb->is_done()) return d.fail(kNotReady);
  *ms = std::chrono::duration<float, std::milli>(mb->completed_at() - ma->completed_at()).count();
  return kSuccess;
}

const char* sim_batch_error_text(void* ctx, int code) {
  return sim_error_name(ctx, code);
}
int sim_batch_error_is_permanent(void*, int code) {
  return code == kNotSupported || code == kNotPermitted ? 1 : 0;
}

}  // namespace

void install_api_entries(VendorApi& a, const SimOptions& /*options*/) {
  a.error_name = sim_error_name;
  a.error_string = sim_error_string;
  a.get_last_error = sim_get_last_error;
  a.get_device_count = sim_get_device_count;
  a.get_device = sim_get_device;
  a.current_device = sim_current_device;
  a.set_device = sim_set_device;
  a.foreign_context = sim_foreign_context;
  a.set_context = sim_set_context;
  a.device_synchronize = sim_device_synchronize;
  a.device_describe = sim_device_describe;
  a.driver_version = sim_driver_version;
  a.runtime_version = sim_runtime_version;
  a.version_text = sim_version_text;
  a.exchange_capture_mode = sim_exchange_capture_mode;
  a.stream_capturing = sim_stream_capturing;
  a.stream_create = sim_stream_create;
  a.stream_destroy = sim_stream_destroy;
  a.stream_synchronize = sim_stream_synchronize;
  a.stream_wait_event = sim_stream_wait_event;
  a.stream_wait_value32 = sim_stream_wait_value32;
  a.launch_host_func = sim_launch_host_func;
  a.event_create = sim_event_create;
  a.event_destroy = sim_event_destroy;
  a.event_record = sim_event_record;
  a.event_query = sim_event_query;
  a.event_synchronize = sim_event_synchronize;
  a.event_elapsed_ms = sim_event_elapsed_ms;
  a.batch_error_text = sim_batch_error_text;
  a.batch_error_is_permanent = sim_batch_error_is_permanent;
}

}  // namespace kvoffload::gpu::sim
