// The GPU runtime's copy entry point and its DMA path: one batched memcpy call where the
// vendor has one, else (or when a batch is refused) a per-copy loop.
//
// Note [Batched DMA refusals]
// A refused batch is redone as a per-copy loop. Whether batched DMA stays in use depends on the
// cause: "not supported"/"not permitted" mean it never works in this process and switch it off;
// anything else (a bad descriptor, a thread without a current context) concerns that batch only.
// The driver-level batch call needs a current context on the calling thread, which the device
// guard guarantees (Note [Device guard] in gpu_runtime.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include <kvoffload/error.hpp>

#include "runtime/gpu/gpu_runtime_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu {

namespace {

int to_memcpy_kind(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return kMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return kMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return kMemcpyDeviceToDevice;
    case CopyKind::kHostToHost:
      return kMemcpyHostToHost;
  }
  return kMemcpyDefault;
}

}  // namespace

void GpuRuntime::do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                                   CopyKind kind, CopyPath path) {
  if (batch.empty()) return;
  Guard guard(api_, device_);
  if (path == CopyPath::kKernel) {
    enqueue_kernel(to_ptr(stream), batch);
  } else {
    enqueue_dma(to_ptr(stream), batch, kind);
  }
}

void GpuRuntime::enqueue_dma(void* stream, std::span<const CopyDescriptor> batch, CopyKind kind) {
  // The driver refuses the legacy default stream for batched copies; one copy gains nothing.
  const bool legacy = stream == nullptr || stream == api_.legacy_stream;
  if (legacy || batch.size() < 2 || !batch_enabled_.load(std::memory_order_relaxed)) {
    enqueue_dma_loop(stream, batch, kind);
    return;
  }
  // Per-thread scratch: no allocation per batch once warm, and the store and load threads of the
  // engine never share it.
  thread_local std::vector<void*> dsts;
  thread_local std::vector<const void*> srcs;
  thread_local std::vector<std::size_t> sizes;
  dsts.clear();
  srcs.clear();
  sizes.clear();
  for (const CopyDescriptor& d : batch) {
    if (d.bytes == 0) continue;  // the driver rejects empty copies
    dsts.push_back(d.dst);
    srcs.push_back(d.src);
    sizes.push_back(static_cast<std::size_t>(d.bytes));
  }
  if (sizes.empty()) return;
  // Source access order STREAM in both directions: ANY lets the copy engine read the source
  // before earlier work in the stream has run, which is allowed only when no such work can touch
  // it, and a load's host slot is written by whatever the stream waited for (a store, a
  // promotion) as surely as a store's device block is written by the model.
  std::size_t fail_index = SIZE_MAX;
  const int result =
      api_.memcpy_batch_async(ctx_, dsts.data(), srcs.data(), sizes.data(), sizes.size(),
                              /*source_in_stream_order=*/1, stream, &fail_index);
  if (result == 0) {
    dma_batched_calls_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Redo the refused batch copy by copy (reporting a bad descriptor with the runtime's own error).
  // Copies the batch may already have enqueued are written again with the same bytes, which is
  // harmless: copies of one batch never overlap. Note [Batched DMA refusals].
  const std::uint64_t refusals = dma_batch_refusals_.fetch_add(1, std::memory_order_relaxed) + 1;
  const bool permanent = api_.batch_error_is_permanent(ctx_, result) != 0;
  const std::string where =
      fail_index != SIZE_MAX ? fmt::format(", at copy {}", fail_index) : std::string();
  if (permanent) {
    if (batch_enabled_.exchange(false)) {
      log().warn(
          "{}: batched DMA refused a batch of {} {} copies ({}{}); it is not usable in this "
          "process, "
          "using the per-copy loop from now on",
          api_.name, sizes.size(), to_string(kind), api_.batch_error_text(ctx_, result), where);
    }
  } else if ((refusals & (refusals - 1)) == 0) {  // 1st, 2nd, 4th, 8th ...: rate-limited
    log().warn(
        "{}: batched DMA refused a batch of {} {} copies ({}{}); this batch goes copy by copy "
        "({} refusal(s) so far)",
        api_.name, sizes.size(), to_string(kind), api_.batch_error_text(ctx_, result), where,
        refusals);
  }
  enqueue_dma_loop(stream, batch, kind);
}

void GpuRuntime::enqueue_dma_loop(void* stream, std::span<const CopyDescriptor> batch,
                                  CopyKind kind) {
  const int memcpy_kind = to_memcpy_kind(kind);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const CopyDescriptor& d = batch[i];
    if (d.bytes == 0) continue;
    if (const int err = api_.memcpy_async(ctx_, d.dst, d.src, static_cast<std::size_t>(d.bytes),
                                          memcpy_kind, stream);
        err != 0) {
      throw_vendor(api_, err, "memcpy_async",
                   fmt::format("copy {} of {} ({}, {} bytes, {} -> {})", i, batch.size(),
                               to_string(kind), d.bytes, d.src, static_cast<void*>(d.dst)));
    }
    dma_loop_copies_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace kvoffload::gpu
