// The simulated device's stream executor: what a stream's worker does with each operation (copies,
// kernels run CTA by CTA after the MMU step, events, waits, host functions, frees), how
// operations are enqueued or captured, and stream capture (Note [Simulated device] in
// sim_device.hpp).
#include <sys/mman.h>

#include <cstring>

#include "runtime/sim/sim_device_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu::sim {

void SimStream::execute(Op& op) {
  const bool poisoned = dev_.sticky() != 0;  // a faulted device runs no more copies
  switch (op.kind) {
    case Op::Kind::kCopy:
      if (!poisoned && op.graph_memory != nullptr) {
        dev_.poison(kIllegalAddress,
                    fmt::format("a copy touched {}, memory allocated on a stream while it was "
                                "capturing a graph: that graph owns it, and outside the graph "
                                "it is not memory (a GPU faults here)",
                                op.graph_memory));
      } else if (!poisoned) {
        for (const CopyPiece& p : op.pieces) std::memmove(p.dst, p.src, p.bytes);
      }
      break;
    case Op::Kind::kMemset:
      if (!poisoned) std::memset(op.dst, op.value, op.bytes);
      break;
    case Op::Kind::kKernel:
      if (!poisoned) run_kernel(op);
      break;
    case Op::Kind::kBody:
      if (!poisoned) run_body(op);
      break;
    case Op::Kind::kRecord:
      // After a fault the device completes nothing: the event never becomes complete (its
      // waiters are released; they see the sticky error).
      if (poisoned) {
        op.marker->abandon();
      } else {
        op.marker->complete();
      }
      break;
    case Op::Kind::kWaitEvent:
      op.marker->wait();
      break;
    case Op::Kind::kWaitValue: {
      std::atomic_ref<std::uint32_t> word(*op.flag);
      while (word.load(std::memory_order_acquire) != op.flag_value && dev_.sticky() == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      break;
    }
    case Op::Kind::kHostFunc:
      // CUDA never calls a host function after a context error (cudaLaunchHostFunc: "the
      // function will not be called in the event of an error in the CUDA context"); HIP's
      // hipStreamAddCallback still does, passing the error.
      if (poisoned && !dev_.options.host_funcs_after_error) {
        dev_.counters.host_funcs_skipped.fetch_add(1);
      } else {
        dev_.counters.host_funcs_run.fetch_add(1);
        op.fn(op.arg);
      }
      break;
    case Op::Kind::kFree: {
      std::lock_guard lock(dev_.mu);
      const std::size_t off = reinterpret_cast<std::uintptr_t>(op.dst) - dev_.device_range.base();
      if (const std::size_t n = dev_.device_range.release(off); n != 0) {
        dev_.allocations.erase(off);
        (void)::madvise(static_cast<std::byte*>(dev_.alias) + off, n, MADV_DONTNEED);
        dev_.counters.live_device_allocations.fetch_sub(1);
      }
      break;
    }
  }
}

void SimStream::report_fault(const char* what) {
  const CtaExecutor::Fault& f = executor_->fault();
  if (f.code == 0) return;
  dev_.poison(f.code, fmt::format("{}: thread {} of block {} made a {}-byte access at {}, which "
                                  "is not {}-byte aligned (a GPU faults here)",
                                  what, f.thread, f.block, f.width, f.address, f.width));
}

// The MMU step: read the descriptors where the device would (translating their address), rewrite
// every range to host addresses, and only then run the kernel body on them.
void SimStream::run_kernel(const Op& op) {
  const std::size_t table_bytes = op.count * sizeof(kernels::CopyDesc);
  const void* table = dev_.translate_kernel(op.descs, table_bytes, device);
  if (table == nullptr) {
    dev_.poison(kIllegalAddress,
                fmt::format("kernel read its descriptors at {} (+{} bytes), which is neither "
                            "device memory of device {} nor mapped host memory",
                            op.descs, table_bytes, device));
    return;
  }
  rewritten_.resize(op.count);
  std::memcpy(rewritten_.data(), table, table_bytes);
  for (std::size_t i = 0; i < op.count; ++i) {
    kernels::CopyDesc& d = rewritten_[i];
    if (d.bytes == 0) continue;
    void* src = dev_.translate_kernel(d.src, d.bytes, device);
    void* dst = dev_.translate_kernel(d.dst, d.bytes, device);
    if (src == nullptr || dst == nullptr) {
      dev_.poison(
          kIllegalAddress,
          fmt::format("copy kernel descriptor {} of {}: {} {} (+{} bytes) is neither "
                      "device memory of device {} nor registered host memory (a GPU "
                      "faults here)",
                      i, op.count, src == nullptr ? "source" : "destination",
                      src == nullptr ? d.src : static_cast<const void*>(d.dst), d.bytes, device));
      return;
    }
    d.src = src;
    d.dst = dst;
  }
  if (!executor_)
    executor_ = std::make_unique<CtaExecutor>(static_cast<unsigned>(kernels::kBatchCopyThreads));
  dev_.counters.kernel_ctas.fetch_add(op.ctas);
  executor_->run(rewritten_.data(), op.count, op.ctas);
  const CtaExecutor::GroupBytes g = executor_->take_group_bytes();
  dev_.counters.kernel_group_bytes.fetch_add(g.moved);
  dev_.counters.kernel_group_capacity.fetch_add(g.capacity);
  report_fault("copy kernel");
}

void SimStream::run_body(const Op& op) {
  if (!executor_)
    executor_ = std::make_unique<CtaExecutor>(static_cast<unsigned>(kernels::kBatchCopyThreads));
  dev_.counters.kernel_ctas.fetch_add(op.ctas);
  executor_->run_body(op.fn, op.arg, op.ctas);
  report_fault("kernel");
}

SimStream* SimDevice::Impl::stream_of(void* handle, int device) {
  if (handle != nullptr) return static_cast<SimStream*>(handle);
  std::lock_guard lock(mu);
  auto& s = legacy[static_cast<std::size_t>(device)];
  if (!s) s = std::make_unique<SimStream>(*this, device, /*blocking=*/true);
  return s.get();
}

int SimDevice::Impl::enqueue(SimStream* s, Op op) {
  {
    std::lock_guard lock(mu);
    if (s->capture) {
      if (s->capture->invalidated) return kCaptureInvalidated;
      ++s->capture_seq;  // a node of the graph: recorded, never run
      ++s->capture->nodes;
      return kSuccess;
    }
    if (s == legacy[static_cast<std::size_t>(s->device)].get()) {
      // The legacy stream synchronizes with every blocking stream: one that captures would
      // make it depend on the capture.
      bool implicit = false;
      for (const auto& c : captures) {
        for (SimStream* m : c->members) {
          if (m->blocking && m->device == s->device) {
            invalidate(*c);
            implicit = true;
          }
        }
      }
      if (implicit) return kCaptureImplicit;
    }
  }
  s->push(std::move(op));
  return kSuccess;
}

bool SimDevice::Impl::unsafe_prohibited(const ThreadState& t) {
  if (t.capture_mode == kCaptureModeRelaxed) return false;
  const std::thread::id me = std::this_thread::get_id();
  bool prohibited = false;
  for (const auto& c : captures) {
    // cudaStreamCaptureModeGlobal (the thread's mode): its own non-relaxed captures and other
    // threads' global captures prohibit; ThreadLocal: its own non-relaxed captures only.
    const bool own = c->thread == me && c->mode != kCaptureModeRelaxed;
    const bool other =
        c->thread != me && c->mode == kCaptureModeGlobal && t.capture_mode == kCaptureModeGlobal;
    if (own || other) {
      invalidate(*c);
      prohibited = true;
    }
  }
  return prohibited;
}

void SimDevice::Impl::synchronize_all() {
  std::vector<SimStream*> all;
  {
    std::lock_guard lock(mu);
    all.assign(streams.begin(), streams.end());
    for (auto& s : legacy) {
      if (s) all.push_back(s.get());
    }
  }
  for (SimStream* s : all) s->synchronize();
  wait_retired();
}

void SimDevice::Impl::retire(SimStream* s) {
  {
    std::lock_guard lock(mu);
    ++retiring;
  }
  std::thread([this, s] {
    delete s;  // drains the stream's queue, then joins its worker
    std::lock_guard lock(mu);
    if (--retiring == 0) retired_cv.notify_all();
  }).detach();
}

void SimDevice::Impl::wait_retired() {
  std::unique_lock lock(mu);
  retired_cv.wait(lock, [this] { return retiring == 0; });
}

int SimDevice::begin_capture(void* stream, int mode) {
  Impl& d = *impl_;
  int cur = 0;
  if (const int err = d.context(cur); err != kSuccess) return err;
  SimStream* s = d.stream_of(stream, cur);
  std::lock_guard lock(d.mu);
  if (stream == nullptr || s->capture) return kInvalidValue;  // the legacy stream cannot capture
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->members.insert(s);
  s->capture = c;
  s->capture_seq = 0;
  d.captures.insert(c);
  return kSuccess;
}

int SimDevice::end_capture(void* stream) {
  Impl& d = *impl_;
  int cur = 0;
  if (const int err = d.context(cur); err != kSuccess) return err;
  SimStream* s = d.stream_of(stream, cur);
  std::lock_guard lock(d.mu);
  if (!s->capture) return kInvalidValue;
  std::shared_ptr<Capture> c = s->capture;
  if (c->origin != s) return kCaptureUnmatched;
  if (c->mode != kCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return kCaptureWrongThread;
  int result = c->invalidated ? kCaptureInvalidated : kSuccess;
  if (result == kSuccess) {
    for (SimStream* m : c->members) {
      if (m == s) continue;
      auto it = c->rejoined.find(m);
      if (it == c->rejoined.end() || it->second < m->capture_seq) {
        d.invalidate(*c);
        result = kCaptureUnjoined;  // a stream that joined the capture was not joined back
        break;
      }
    }
  }
  for (SimStream* m : c->members) {
    m->capture.reset();
    m->capture_seq = 0;
  }
  d.captures.erase(c);
  return result;
}

void* SimDevice::create_blocking_stream() {
  Impl& d = *impl_;
  int cur = 0;
  if (d.context(cur) != kSuccess) return nullptr;
  auto s = std::make_unique<SimStream>(d, cur, /*blocking=*/true);
  std::lock_guard lock(d.mu);
  d.streams.insert(s.get());
  return s.release();
}

int SimDevice::launch_body(void* stream, void (*body)(void*), void* arg, unsigned ctas) {
  Impl& d = *impl_;
  int cur = 0;
  if (const int err = d.context(cur); err != kSuccess) return err;
  if (const int s = d.sticky(); s != 0) return s;
  SimStream* st = d.stream_of(stream, cur);
  if (st->device != cur) return kInvalidHandle;
  d.counters.kernel_launches.fetch_add(1);
  Op op;
  op.kind = Op::Kind::kBody;
  op.fn = body;
  op.arg = arg;
  op.ctas = ctas;
  return d.enqueue(st, std::move(op));
}

}  // namespace kvoffload::gpu::sim
