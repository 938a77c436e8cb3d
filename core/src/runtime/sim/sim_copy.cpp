// The simulated device's vendor-table entries that move bytes: memcpy and memset, batched
// memcpy (source order STREAM or ANY) and the copy kernel's check and launch (Note [Simulated
// device] in sim_device.hpp).
#include <algorithm>
#include <cstring>

#include "runtime/sim/sim_device_internal.hpp"

namespace kvoffload::gpu::sim {

namespace {

// Checks a DMA's two sides against `kind` and returns the translated piece, or an error;
// `pageable` is set when a host side is neither registered nor pinned, `graph_memory` to a side
// that a graph capture owns (the copy faults when it runs).
int dma_piece(SimDevice::Impl& d, void* dst, const void* src, std::size_t bytes, int kind,
              CopyPiece& out, bool& pageable, const void*& graph_memory) {
  using Side = SimDevice::Impl::Side;
  auto [dside, dhost] = d.translate_dma(dst, bytes);
  auto [sside, shost] = d.translate_dma(src, bytes);
  if (dside == Side::kInvalid || sside == Side::kInvalid) return kInvalidValue;
  // Memory a graph capture owns is a device address like any other at the call; the copy
  // faults when it runs (an illegal address), as a GPU's does.
  if (dside == Side::kGraphMemory || sside == Side::kGraphMemory) {
    graph_memory = dside == Side::kGraphMemory ? dst : src;
    if (dside == Side::kGraphMemory) dside = Side::kDevice;
    if (sside == Side::kGraphMemory) sside = Side::kDevice;
  }
  const Side want_src =
      kind == kMemcpyHostToDevice || kind == kMemcpyHostToHost ? Side::kHost : Side::kDevice;
  const Side want_dst =
      kind == kMemcpyDeviceToHost || kind == kMemcpyHostToHost ? Side::kHost : Side::kDevice;
  if (kind != kMemcpyDefault && (sside != want_src || dside != want_dst)) return kInvalidValue;
  if ((dside == Side::kHost && !d.host_mapped(dhost, bytes)) ||
      (sside == Side::kHost && !d.host_mapped(shost, bytes))) {
    pageable = true;
  }
  out = CopyPiece{dhost, shost, bytes};
  return kSuccess;
}

// Enqueues a copy; one from or to pageable memory synchronizes (Note [Simulated device] in
// sim_device.hpp).
int enqueue_copy(SimDevice::Impl& d, SimStream* s, Op op, bool pageable) {
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  if (pageable) {
    d.counters.pageable_copies.fetch_add(1);
    bool capturing = false;
    {
      std::lock_guard lock(d.mu);
      capturing = static_cast<bool>(s->capture);
    }
    if (!capturing) s->synchronize();
  }
  return kSuccess;
}

int sim_memcpy_async(void* ctx, void* dst, const void* src, std::size_t bytes, int kind,
                     void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  d.counters.memcpy_calls.fetch_add(1);
  if (int n = d.faults.fail_memcpy_at.load(); n > 0 && d.faults.fail_memcpy_at.fetch_sub(1) == 1) {
    return d.fail(kInvalidValue);
  }
  Op op;
  op.kind = Op::Kind::kCopy;
  op.pieces.resize(1);
  bool pageable = false;
  if (const int err = dma_piece(d, dst, src, bytes, kind, op.pieces[0], pageable, op.graph_memory);
      err != kSuccess)
    return d.fail(err);
  // A copy into another device's stream is allowed (the programming guide's multi-device rules).
  return enqueue_copy(d, d.stream_of(stream, cur), std::move(op), pageable);
}
int sim_memset_async(void* ctx, void* dst, int value, std::size_t bytes, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  const auto [side, host] = d.translate_dma(dst, bytes);
  if (side == SimDevice::Impl::Side::kInvalid) return d.fail(kInvalidValue);
  Op op;
  op.kind = Op::Kind::kMemset;
  op.dst = host;
  op.value = value;
  op.bytes = bytes;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}

int sim_memcpy_batch_async(void* ctx, void** dsts, const void** srcs, std::size_t* sizes,
                           std::size_t count, int source_in_stream_order, void* stream,
                           std::size_t* fail_index) {
  auto& d = dev(ctx);
  *fail_index = SIZE_MAX;
  KVO_SIM_STICKY(d);
  d.counters.batch_calls.fetch_add(1);
  // A driver-level call: it needs a context bound on this thread, and binds none itself.
  const int cur = thread_state(dev(ctx).uid).bound;
  if (cur < 0) {
    d.counters.batch_refused.fetch_add(1);
    return kInvalidContext;
  }
  d.devices[static_cast<std::size_t>(cur)].calls.fetch_add(1, std::memory_order_relaxed);
  if (int n = d.faults.refuse_batches.load(); n > 0 && d.faults.refuse_batches.fetch_sub(1) >= 1) {
    d.counters.batch_refused.fetch_add(1);
    return d.faults.refuse_batch_code.load();
  }
  if (stream == nullptr || count == 0) return kInvalidValue;  // the legacy stream is refused
  // A driver call works in the current context: a stream of another device's context is refused
  // as an invalid handle, as a kernel launch into it is (a runtime memcpy into it is allowed).
  if (d.stream_of(stream, cur)->device != cur) {
    d.counters.batch_refused.fetch_add(1);
    return kInvalidHandle;
  }
  Op op;
  op.kind = Op::Kind::kCopy;
  op.pieces.resize(count);
  std::size_t total = 0;
  bool pageable = false;
  for (std::size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0 || dma_piece(d, dsts[i], srcs[i], sizes[i], kMemcpyDefault, op.pieces[i],
                                   pageable, op.graph_memory) != kSuccess) {
      *fail_index = i;
      d.counters.batch_refused.fetch_add(1);
      return kInvalidValue;
    }
    total += sizes[i];
  }
  if (source_in_stream_order == 0) {
    // ANY: the copy engine may read the sources now, ahead of earlier work in the stream.
    op.snapshot.resize(total);
    std::size_t off = 0;
    for (CopyPiece& p : op.pieces) {
      std::memcpy(op.snapshot.data() + off, p.src, p.bytes);
      p.src = op.snapshot.data() + off;
      off += p.bytes;
    }
  }
  const int err = enqueue_copy(d, d.stream_of(stream, cur), std::move(op), pageable);
  return err;
}

int sim_kernel_check(void* ctx) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  // As cudaFuncGetAttributes: no image for this device's architecture in the "fat binary".
  const std::string& built = d.options.kernel_archs;
  const std::string arch = d.options.device_arch.substr(0, d.options.device_arch.find(':'));
  std::size_t pos = 0;
  while (pos <= built.size()) {
    const std::size_t end = std::min(built.find_first_of(";,", pos), built.size());
    if (built.compare(pos, end - pos, arch) == 0) return kSuccess;
    pos = end + 1;
  }
  return d.fail(kNoKernelImage);
}
int sim_kernel_launch(void* ctx, const VendorCopyDesc* descs, std::size_t count, int ctas,
                      void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  // An unrelated earlier error left in this thread's slot (torch's, say); a launch API does not
  // clear it, and must not report it either.
  if (const int stale = d.faults.stale_error_before_launch.load(); stale != 0)
    thread_state(dev(ctx).uid).last_error = stale;
  KVO_SIM_STICKY(d);
  if (int n = d.faults.fail_launches.load(); n > 0 && d.faults.fail_launches.fetch_sub(1) >= 1) {
    return d.fail(kLaunchOutOfResources);
  }
  if (ctas <= 0 || ctas > 65535 || descs == nullptr) return d.fail(kInvalidValue);
  SimStream* s = d.stream_of(stream, cur);
  // "A kernel launch will fail if it is issued to a stream that is not associated to the
  // current device" (CUDA programming guide, multi-device system).
  if (s->device != cur) return d.fail(kInvalidHandle);
  d.counters.kernel_launches.fetch_add(1);
  if (count == 0) return kSuccess;
  Op op;
  op.kind = Op::Kind::kKernel;
  op.descs = descs;
  op.count = count;
  op.ctas = static_cast<unsigned>(ctas);
  if (const int err = d.enqueue(s, std::move(op)); err != kSuccess) return d.fail(err);
  return kSuccess;
}

}  // namespace

void install_copy_entries(VendorApi& a, const SimOptions& options) {
  a.memcpy_async = sim_memcpy_async;
  a.memset_async = sim_memset_async;
  a.memcpy_batch_async = options.batch_memcpy ? sim_memcpy_batch_async : nullptr;
  a.batch_detail = options.batch_memcpy
                       ? "simulated batched memcpy (source order STREAM or ANY)"
                       : "per-copy loop: this simulated device has no batched memcpy";
  a.kernel_check = sim_kernel_check;
  a.kernel_launch = sim_kernel_launch;
}

}  // namespace kvoffload::gpu::sim
