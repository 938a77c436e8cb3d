// The GPU runtime's kernel path: the per-stream rings of descriptor buffers and the launch of
// the batch copy kernel over them.
//
// Note [Descriptor rings]
// The copy kernel reads its descriptors from a pinned buffer (or, when staging, from a device
// copy of it made by one DMA right before the launch, so that every CTA reads them from device
// memory and not over PCIe). A slot is free again only when the event recorded after the work
// that reads it has completed. A launch is judged by its own status, never by the thread's last
// error (which may hold an earlier, unrelated error of the engine's other CUDA code): a good
// launch that looked failed would free a slot the running kernel still reads. Each stream has its
// own ring and lock, so a store lane waiting for a slot (its stream held by the model's compute)
// never blocks a load lane. A pinned free synchronizes the whole device (cudaFreeHost), so the
// pinned buffers of a ring whose stream goes (an engine's lane, calibration's stream) are kept
// for later rings of this runtime and freed only with it: nothing that can run while another
// engine serves waits for the device.
//
// Note [No kernel path in a capture]
// A stream that is capturing a graph is refused the kernel path before its ring is touched
// (kState; the DMA path may be captured). Everything the ring does is wrong inside a capture: a
// slot grown there by cudaMallocAsync is an allocation node of the graph, owned by it and invalid
// outside it (after a failed capture, forever: the simulated device faults with an illegal
// address on its reuse); the slot's closing event recorded there is a node too, and querying it
// afterwards answers cudaErrorCapturedEvent (907) until it is recorded again; and a captured
// kernel reads its descriptors from the slot at each replay, long after the ring has reused it
// for other copies. The question costs one cudaStreamIsCapturing per batch. A capture that a lane
// joins later (an event recorded in a capture) is the transfer engine's to refuse (Note
// [Capturing streams] in transfer_engine.cpp).
//
// Note [Retired slots]
// A descriptor slot whose closing event could not be recorded is retired: work that reads it may
// still run and nothing tells when it ends, except its stream. Destroying a stream synchronizes
// that stream first. The runtime's destructor cannot: a ring may belong to a caller's stream
// that is gone by then (its work may still run), and the legacy stream does not wait for the
// non-blocking streams the rings live on. So it synchronizes the device before it frees a retired
// slot.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <kvoffload/error.hpp>

#include "runtime/gpu/gpu_runtime_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu {

namespace {

static_assert(sizeof(CopyDescriptor) == sizeof(VendorCopyDesc));
static_assert(offsetof(CopyDescriptor, src) == offsetof(VendorCopyDesc, src));
static_assert(offsetof(CopyDescriptor, dst) == offsetof(VendorCopyDesc, dst));
static_assert(offsetof(CopyDescriptor, bytes) == offsetof(VendorCopyDesc, bytes));

}  // namespace

GpuRuntime::DescSlot GpuRuntime::make_slot(void* stream) {
  RelaxedCapture relaxed(api_);
  DescSlot slot;
  const std::size_t bytes = slot_descs_ * sizeof(VendorCopyDesc);
  void* host = nullptr;
  {
    std::lock_guard lock(spare_mu_);
    if (!spare_host_.empty()) {
      host = spare_host_.back();
      spare_host_.pop_back();
    }
  }
  if (host == nullptr) {
    check_vendor(api_, api_.host_alloc_mapped(ctx_, &host, bytes), "host_alloc_mapped",
                 "kernel descriptor buffer");
  }
  slot.host = static_cast<VendorCopyDesc*>(host);
  void* view = nullptr;
  int err = api_.host_device_pointer(ctx_, &view, host);
  const char* call = "host_device_pointer";
  if (err == 0 && options_.kernel_stage_descriptors) {
    // Used on this stream only, and freed on it in stream order: so allocated on it in stream
    // order too (Note [Freeing] in gpu_device_memory.cpp).
    void* staged = nullptr;
    if (async_alloc_) {
      err = api_.device_malloc_async(ctx_, &staged, bytes, stream);
      call = "device_malloc_async";
      slot.staged_async = err == 0;
    } else {
      err = api_.device_malloc(ctx_, &staged, bytes);
      call = "device_malloc";
    }
    slot.staged = static_cast<VendorCopyDesc*>(staged);
  }
  if (err == 0) {
    err = api_.event_create(ctx_, &slot.done, kEventBlockingSync);  // a full ring waits on it
    call = "event_create";
  }
  if (err != 0) {
    (void)api_.get_last_error(ctx_);
    free_slot(slot, stream, /*stream_alive=*/true);
    throw_vendor(api_, err, call, "kernel descriptor buffer");
  }
  slot.host_device_view = static_cast<const VendorCopyDesc*>(view);
  return slot;
}

void GpuRuntime::free_slot(DescSlot& slot, void* stream, bool stream_alive,
                           bool keep_host) noexcept {
  if (slot.done != nullptr) (void)api_.event_destroy(ctx_, slot.done);
  if (slot.staged != nullptr) {
    // Stream-ordered memory in stream order (a plain free of it needs no device-wide wait once
    // its readers are known to be done); cudaMalloc memory with a plain free, which waits for
    // the device. Note [Freeing] in gpu_device_memory.cpp.
    const bool in_order =
        slot.staged_async && stream_alive && api_.device_free_async(ctx_, slot.staged, stream) == 0;
    if (!in_order) (void)api_.device_free(ctx_, slot.staged);
  }
  if (slot.host != nullptr) {
    if (keep_host) {
      // Nothing reads it any more (its event completed): kept, since freeing it would
      // synchronize the device (Note [Descriptor rings]).
      std::lock_guard lock(spare_mu_);
      spare_host_.push_back(slot.host);
    } else {
      (void)api_.host_free(ctx_, slot.host);
    }
  }
  (void)api_.get_last_error(ctx_);
  slot = DescSlot{};
}

void GpuRuntime::destroy_ring(Ring& ring, void* stream, bool stream_alive) noexcept {
  std::lock_guard lock(ring.mu);
  bool retired = false;
  for (DescSlot& slot : ring.slots) {
    if (slot.retired) retired = true;
    if (slot.recorded) (void)api_.event_synchronize(ctx_, slot.done);
  }
  // No event tells when the work reading a retired slot ended; only its stream knows, and when
  // the stream may be gone, only the device does (Note [Retired slots]).
  if (retired) {
    if (stream_alive) {
      (void)api_.stream_synchronize(ctx_, stream);
    } else {
      (void)api_.device_synchronize(ctx_);
    }
  }
  // A stream that goes while the runtime lives: its slots' pinned buffers are kept for reuse.
  for (DescSlot& slot : ring.slots) free_slot(slot, stream, stream_alive, stream_alive);
  ring.slots.clear();
}

GpuRuntime::Ring& GpuRuntime::ring_of(void* stream) {
  std::lock_guard lock(rings_mu_);
  auto& ring = rings_[stream];
  if (!ring) ring = std::make_unique<Ring>();
  return *ring;
}

GpuRuntime::DescSlot& GpuRuntime::acquire_slot(Ring& ring, void* stream) {
  const std::size_t n = ring.slots.size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = (ring.next + i) % n;
    DescSlot& slot = ring.slots[idx];
    if (slot.retired) continue;
    bool free = !slot.recorded;
    if (!free) {
      const int err = api_.event_query(ctx_, slot.done);
      if (err == 0) {
        free = true;
      } else if (err == api_.err_not_ready) {
        (void)api_.get_last_error(ctx_);
      } else {
        throw_vendor(api_, err, "event_query", "(an earlier kernel copy failed)");
      }
    }
    if (free) {
      ring.next = idx + 1;
      slot.recorded = false;
      return slot;
    }
  }
  if (n < ring_slots_) {
    ring.slots.push_back(make_slot(stream));
    ring.next = ring.slots.size();
    return ring.slots.back();
  }
  // Every slot is in flight: wait for the oldest (the next in ring order). Only this stream's
  // lane waits here.
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = (ring.next + i) % n;
    DescSlot& slot = ring.slots[idx];
    if (slot.retired) continue;
    ring_waits_.fetch_add(1, std::memory_order_relaxed);
    check_vendor(api_, api_.event_synchronize(ctx_, slot.done), "event_synchronize",
                 "(waiting for a kernel descriptor buffer)");
    ring.next = idx + 1;
    slot.recorded = false;
    return slot;
  }
  throw Error(ErrorCode::kInternal,
              std::string(api_.name) + ": every kernel descriptor buffer is retired");
}

void GpuRuntime::enqueue_kernel(void* stream, std::span<const CopyDescriptor> batch) {
  if (!kernel_ok_)
    throw Error(ErrorCode::kNotAvailable,
                std::string(api_.name) + ": the kernel copy path is " + kernel_detail_);
  // Slot queries and waits below: Note [Thread-local capture mode] in gpu_runtime_internal.hpp.
  ThreadLocalCapture capture_mode(api_);
  int capturing = 0;
  if (const int err = api_.stream_capturing(ctx_, stream, &capturing); err != 0) {
    (void)api_.get_last_error(ctx_);
    // The legacy stream while a blocking stream of the device captures: it belongs to that
    // capture as much as a member does.
    if (err != api_.err_capture_implicit) throw_vendor(api_, err, "stream_capturing");
    capturing = 1;
  }
  if (capturing != 0) {
    throw Error(ErrorCode::kState,
                std::string(api_.name) +
                    ": the kernel copy path is refused on a stream that is capturing a graph: its "
                    "descriptor buffers are reused after the launch, so a captured kernel would "
                    "read other copies at replay, and a buffer allocated in the capture belongs to "
                    "the graph (Note [No kernel path in a capture]); enqueue these copies after "
                    "the capture, or on the DMA path",
                0, "stream_capturing");
  }
  Ring& ring = ring_of(stream);
  std::lock_guard lock(ring.mu);
  for (std::size_t first = 0; first < batch.size(); first += slot_descs_) {
    const std::size_t count = std::min(slot_descs_, batch.size() - first);
    DescSlot& slot = acquire_slot(ring, stream);
    std::memcpy(slot.host, batch.data() + first, count * sizeof(VendorCopyDesc));
    std::uint64_t total = 0;
    for (std::size_t i = first; i < first + count; ++i) total += batch[i].bytes;
    const std::uint64_t group =
        16ull * static_cast<std::uint64_t>(api_.kernel_threads) * 4;  // chunk x loads in flight
    const int ctas = static_cast<int>(std::clamp<std::uint64_t>(
        (total + group - 1) / group, 1, static_cast<std::uint64_t>(kernel_max_ctas_)));
    const VendorCopyDesc* descs = slot.host_device_view;
    int rc = 0;
    const char* call = "kernel_launch";
    if (slot.staged != nullptr) {
      rc = api_.memcpy_async(ctx_, slot.staged, slot.host, count * sizeof(VendorCopyDesc),
                             kMemcpyHostToDevice, stream);
      call = "memcpy_async";
      descs = slot.staged;
    }
    if (rc == 0) {
      rc = api_.kernel_launch(ctx_, descs, count, ctas, stream);  // the launch's own status
      call = "kernel_launch";
    }
    // Whatever was enqueued may read the slot: it is released only through the event.
    const int rec = api_.event_record(ctx_, slot.done, stream);
    if (rec == 0) {
      slot.recorded = true;
    } else {
      slot.retired = true;
      (void)api_.get_last_error(ctx_);
    }
    if (rc != 0) {
      throw_vendor(api_, rc, call,
                   fmt::format("({} copies, {} bytes, {} CTAs)", count, total, ctas));
    }
    if (rec != 0) throw_vendor(api_, rec, "event_record", "(after the batch copy kernel)");
    kernel_launches_.fetch_add(1, std::memory_order_relaxed);
    kernel_descriptors_.fetch_add(count, std::memory_order_relaxed);
  }
}

}  // namespace kvoffload::gpu
