// The simulated device's memory: address translation (device memory through its alias, host
// memory mapped for the device), and the vendor-table entries that register, allocate and free
// (Note [Simulated device] in sim_device.hpp).
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iterator>
#include <string>
#include <thread>

#include "runtime/sim/sim_device_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu::sim {

std::pair<SimDevice::Impl::Side, void*> SimDevice::Impl::translate_dma(const void* p,
                                                                       std::size_t n) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu);
  if (device_range.contains(addr)) {
    const auto [off, size] = device_range.find(addr, n);
    if (off == SIZE_MAX) return {Side::kInvalid, nullptr};
    void* host = static_cast<std::byte*>(alias) + (addr - device_range.base());
    if (auto it = allocations.find(off); it != allocations.end() && it->second.graph_owned) {
      return {Side::kGraphMemory, host};
    }
    return {Side::kDevice, host};
  }
  if (window_reservation != nullptr && window_range.contains(addr)) {
    for (auto& [host, m] : host_maps) {
      if (addr >= m.device && addr + n <= m.device + m.bytes) {
        return {Side::kHost, reinterpret_cast<void*>(host + (addr - m.device))};
      }
    }
    return {Side::kInvalid, nullptr};
  }
  return {Side::kHost, const_cast<void*>(p)};  // host memory, registered or pageable
}

bool SimDevice::Impl::host_mapped(const void* p, std::size_t n) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu);
  auto it = host_maps.upper_bound(addr);
  if (it == host_maps.begin()) return false;
  --it;
  return addr + n <= it->first + it->second.bytes;
}

void* SimDevice::Impl::translate_kernel(const void* p, std::size_t n, int device) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu);
  if (device_range.contains(addr)) {
    const auto [off, size] = device_range.find(addr, n);
    if (off == SIZE_MAX) return nullptr;
    // Another device's memory is not reachable from a kernel (no peer access here), nor is
    // memory a graph capture owns outside that graph (never launched here).
    if (auto it = allocations.find(off);
        it == allocations.end() || it->second.device != device || it->second.graph_owned) {
      return nullptr;
    }
    return static_cast<std::byte*>(alias) + (addr - device_range.base());
  }
  for (auto& [host, m] : host_maps) {
    if (addr >= m.device && addr + n <= m.device + m.bytes) {
      return reinterpret_cast<void*>(host + (addr - m.device));
    }
  }
  return nullptr;
}

namespace {

// Maps [ptr, ptr + bytes) for the device; the device address is the host address with unified
// addressing, else a fresh address in the window.
int map_host(SimDevice::Impl& d, void* ptr, std::size_t bytes, HostMapping::Kind kind) {
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(d.mu);
  auto it = d.host_maps.lower_bound(begin);
  if (it != d.host_maps.end() && it->first < begin + bytes) return d.fail(kAlreadyRegistered);
  if (it != d.host_maps.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.bytes > begin) return d.fail(kAlreadyRegistered);
  }
  HostMapping m{bytes, begin, kind};
  if (d.window_reservation != nullptr) {
    // A page more than asked: mappings never abut, as ROCm gives no contiguity guarantee either.
    const std::size_t off = d.window_range.allocate(bytes + 4096);
    if (off == SIZE_MAX) return d.fail(kOutOfMemory);
    m.device = d.window_range.base() + off;
  }
  d.host_maps.emplace(begin, m);
  return kSuccess;
}

int unmap_host(SimDevice::Impl& d, void* ptr, HostMapping::Kind kind) {
  std::lock_guard lock(d.mu);
  auto it = d.host_maps.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == d.host_maps.end() || it->second.kind != kind) return d.fail(kNotRegistered);
  if (d.window_reservation != nullptr)
    (void)d.window_range.release(it->second.device - d.window_range.base());
  d.host_maps.erase(it);
  return kSuccess;
}

int sim_host_register(void* ctx, void* ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  d.counters.host_register_calls.fetch_add(1);
  const int only = d.faults.fail_register_device.load();
  if (const int delay = d.faults.register_delay_ms.load(); delay > 0 && (only < 0 || only == cur)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  if (int n = d.faults.fail_register_at.load();
      n > 0 && (only < 0 || only == cur) && d.faults.fail_register_at.fetch_sub(1) == 1) {
    return d.fail(kOutOfMemory);
  }
  if (ptr == nullptr || bytes == 0) return d.fail(kInvalidValue);
  if (d.translate_dma(ptr, 1).first == SimDevice::Impl::Side::kDevice) return d.fail(kInvalidValue);
  const int err = map_host(d, ptr, bytes, HostMapping::Kind::kRegistered);
  if (err == kSuccess) {
    d.counters.live_registrations.fetch_add(1);
    if (!d.options.register_log.empty()) {
      append_log_line(d.options.register_log, "pid " + std::to_string(::getpid()) + " device " +
                                                  std::to_string(cur) + " bytes " +
                                                  std::to_string(bytes));
    }
  }
  return err;
}
int sim_host_unregister(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  const int err = unmap_host(d, ptr, HostMapping::Kind::kRegistered);
  if (err == kSuccess) d.counters.live_registrations.fetch_sub(1);
  return err;
}
int sim_host_device_pointer(void* ctx, void** device, void* host) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  if (int n = d.faults.fail_device_pointer.load();
      n > 0 && d.faults.fail_device_pointer.fetch_sub(1) >= 1) {
    return d.fail(kInvalidValue);
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(host);
  std::lock_guard lock(d.mu);
  for (auto& [begin, m] : d.host_maps) {
    if (addr >= begin && addr < begin + m.bytes) {
      *device = reinterpret_cast<void*>(m.device + (addr - begin));
      return kSuccess;
    }
  }
  return d.fail(kInvalidValue);
}
int host_alloc(SimDevice::Impl& d, void** ptr, std::size_t bytes, HostMapping::Kind kind) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return d.fail(kOutOfMemory);
  if (const int err = map_host(d, p, bytes, kind); err != kSuccess) {
    std::free(p);
    return err;
  }
  *ptr = p;
  return kSuccess;
}
int sim_host_alloc_mapped(void* ctx, void** ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  return host_alloc(d, ptr, bytes, HostMapping::Kind::kPinned);
}
int sim_host_free(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  // cudaFreeHost synchronizes the device first, as cudaFree does for cudaMalloc memory.
  d.counters.device_syncs.fetch_add(1);
  d.counters.pinned_free_syncs.fetch_add(1);
  d.synchronize_all();
  if (const int err = unmap_host(d, ptr, HostMapping::Kind::kPinned); err != kSuccess) return err;
  // Unmapped for the device at once (a kernel reading it later faults), but the bytes stay
  // allocated until the device goes: a copy queued before the free may still read them, which
  // on a GPU is a fault or stale data and in the simulator must not be a use-after-free.
  std::lock_guard lock(d.mu);
  d.freed_pinned.push_back(ptr);
  return kSuccess;
}
// CUDA: pinned mapped memory; HIP semantics: signal memory (hipMallocSignalMemory), the only kind
// hipStreamWaitValue32 takes.
int sim_flag_alloc(void* ctx, std::uint32_t** flag) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  void* p = nullptr;
  if (const int err = host_alloc(d, &p, 8, HostMapping::Kind::kSignal); err != kSuccess) return err;
  *flag = static_cast<std::uint32_t*>(p);
  return kSuccess;
}
int sim_flag_free(void* ctx, std::uint32_t* flag) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  d.counters.device_syncs.fetch_add(1);  // a pinned free (cudaFreeHost / hipFree) synchronizes
  d.counters.pinned_free_syncs.fetch_add(1);
  d.synchronize_all();
  if (const int err = unmap_host(d, flag, HostMapping::Kind::kSignal); err != kSuccess) return err;
  std::lock_guard lock(d.mu);
  d.freed_pinned.push_back(flag);  // as host_free: a queued wait may still read it
  return kSuccess;
}
int device_alloc(SimDevice::Impl& d, void** ptr, std::size_t bytes, int device, bool async,
                 SimStream* stream = nullptr) {
  if (bytes == 0) return d.fail(kInvalidValue);
  std::lock_guard lock(d.mu);
  bool graph_owned = false;
  if (stream != nullptr && stream->capture) {
    // cudaMallocAsync on a capturing stream adds an allocation node to the graph: the memory
    // is the graph's (see Allocation::graph_owned).
    if (stream->capture->invalidated) return d.fail(kCaptureInvalidated);
    graph_owned = true;
    ++stream->capture_seq;
    ++stream->capture->nodes;
    d.counters.graph_allocations.fetch_add(1);
  }
  const std::size_t off = d.device_range.allocate(bytes);
  if (off == SIZE_MAX) return d.fail(kOutOfMemory);
  d.allocations[off] = Allocation{device, async, graph_owned};
  d.counters.live_device_allocations.fetch_add(1);
  *ptr = reinterpret_cast<void*>(d.device_range.base() + off);
  return kSuccess;
}
int sim_device_malloc(void* ctx, void** ptr, std::size_t bytes) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  KVO_SIM_CAPTURE_SAFE(d);
  return device_alloc(d, ptr, bytes, cur, /*async=*/false);
}
int sim_device_malloc_async(void* ctx, void** ptr, std::size_t bytes, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  // A device without memory pools refuses, as cudaMallocAsync does there.
  if (!d.options.memory_pools) return d.fail(kNotSupported);
  // Stream-ordered: the simulator hands the memory out at once (a valid, stricter-than-needed
  // reading; a GPU may reuse memory freed earlier in the same stream). On a capturing stream it
  // is the capture's graph's.
  return device_alloc(d, ptr, bytes, cur, /*async=*/true, d.stream_of(stream, cur));
}
int release_device(SimDevice::Impl& d, void* ptr) {
  std::lock_guard lock(d.mu);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (!d.device_range.contains(addr)) return d.fail(kInvalidValue);
  const std::size_t off = addr - d.device_range.base();
  const std::size_t n = d.device_range.release(off);
  if (n == 0) return d.fail(kInvalidValue);
  d.allocations.erase(off);
  (void)::madvise(static_cast<std::byte*>(d.alias) + off, n, MADV_DONTNEED);
  d.counters.live_device_allocations.fetch_sub(1);
  return kSuccess;
}
int sim_device_free(void* ctx, void* ptr) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_CAPTURE_SAFE(d);
  bool async = false;
  {
    std::lock_guard lock(d.mu);
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    if (d.device_range.contains(addr)) {
      auto it = d.allocations.find(addr - d.device_range.base());
      async = it != d.allocations.end() && it->second.async;
    }
  }
  // cudaFree waits for the whole device, except for stream-ordered memory, which it frees at
  // once ("will not perform any implicit synchronization"): work still using it then faults.
  if (!async) {
    d.counters.device_syncs.fetch_add(1);
    d.synchronize_all();
  }
  return release_device(d, ptr);
}
int sim_device_free_async(void* ctx, void* ptr, void* stream) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  KVO_SIM_STICKY(d);
  {
    std::lock_guard lock(d.mu);
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    if (!d.device_range.contains(addr)) {
      thread_state(dev(ctx).uid).last_error = kInvalidValue;
      return kInvalidValue;
    }
    auto it = d.allocations.find(addr - d.device_range.base());
    if (it == d.allocations.end() || !it->second.async) {
      // The stream-ordered allocator frees what it allocated (Note [Freeing] in
      // gpu_device_memory.cpp).
      d.counters.mismatched_frees.fetch_add(1);
      thread_state(dev(ctx).uid).last_error = kInvalidValue;
      return kInvalidValue;
    }
  }
  Op op;
  op.kind = Op::Kind::kFree;
  op.dst = ptr;
  if (const int err = d.enqueue(d.stream_of(stream, cur), std::move(op)); err != kSuccess)
    return d.fail(err);
  return kSuccess;
}
int sim_memory_pools_supported(void* ctx, int device, int* supported) {
  auto& d = dev(ctx);
  if (device < 0 || device >= d.options.device_count) return d.fail(kInvalidDevice);
  *supported = d.options.memory_pools ? 1 : 0;
  return kSuccess;
}
int sim_pointer_is_device(void* ctx, const void* ptr, int* is_device) {
  auto& d = dev(ctx);
  KVO_SIM_CONTEXT(d, cur);
  *is_device = d.device_range.contains(reinterpret_cast<std::uintptr_t>(ptr)) ? 1 : 0;
  return kSuccess;
}

}  // namespace

void install_memory_entries(VendorApi& a, const SimOptions& options) {
  a.flag_alloc = sim_flag_alloc;
  a.flag_free = sim_flag_free;
  a.host_register = sim_host_register;
  a.host_unregister = sim_host_unregister;
  a.host_device_pointer = sim_host_device_pointer;
  a.host_alloc_mapped = sim_host_alloc_mapped;
  a.host_free = sim_host_free;
  a.device_malloc = sim_device_malloc;
  a.device_free = sim_device_free;
  a.device_malloc_async = options.async_allocator ? sim_device_malloc_async : nullptr;
  a.device_free_async = options.async_allocator ? sim_device_free_async : nullptr;
  a.memory_pools_supported = options.async_allocator ? sim_memory_pools_supported : nullptr;
  a.pointer_is_device = sim_pointer_is_device;
}

}  // namespace kvoffload::gpu::sim
