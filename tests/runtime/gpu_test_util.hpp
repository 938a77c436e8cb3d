#pragma once
// Helpers of the GPU runtime's suites (runtime_tests, runtime_gpu_tests): host buffers, a flag
// gate that holds streams, a one-tensor KV rig, and job submission shorthands.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/transfer_engine.hpp>

namespace kvoffload::gpu_test {

// Page-aligned host memory the test owns.
struct HostMem {
  explicit HostMem(std::size_t n)
      : bytes(n),
        ptr(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  std::byte* data() const { return ptr.get(); }
  std::size_t bytes;
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> ptr;
};

inline void fill(std::byte* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(rng() & 0xff);
}

// Holds streams until opened (cuStreamWaitValue32 / hipStreamWaitValue32 on a HostFlag; never a
// blocking host function). One use.
class FlagGate {
 public:
  explicit FlagGate(DeviceRuntime& rt) : flag_(rt.create_host_flag()), rt_(rt) {}
  ~FlagGate() { open(); }
  FlagGate(const FlagGate&) = delete;
  FlagGate& operator=(const FlagGate&) = delete;
  void hold(StreamView s) { rt_.wait_host_flag(s, flag_.data(), 1); }
  void open() { flag_.set(1); }

 private:
  HostFlag flag_;
  DeviceRuntime& rt_;
};

// Waits (bounded, never asserting a duration) until pred() holds; false if it never did.
template <typename Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 20000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// One tensor of `blocks` blocks of `page` bytes on the device, and a host buffer of `chunks`
// slots of one block each (the simplest layout), registered by the engine.
struct KvRig {
  KvRig(DeviceRuntime& rt, std::uint64_t blocks, std::uint64_t page, std::uint64_t chunks)
      : device(rt.allocate_device(blocks * page)),
        host(chunks * page),
        page_bytes(page),
        runtime(rt) {
    layout.blocks_per_chunk = 1;
    KvGroup g;
    g.tensors.push_back(
        DeviceTensor{reinterpret_cast<std::uintptr_t>(device.data()), blocks, page, 0});
    layout.groups.push_back(g);
    layout.host = HostSlots::from_buffer({host.data(), chunks * page}, page, page, 0);
    device_image.resize(blocks * page);
    fill(device_image.data(), device_image.size(), 1);
    rt.memcpy_sync(device.data(), device_image.data(), device_image.size());
    fill(host.data(), chunks * page, 2);
  }
  // Device bytes now.
  std::vector<std::byte> device_bytes() {
    std::vector<std::byte> out(device.bytes());
    runtime.memcpy_sync(out.data(), device.data(), out.size());
    return out;
  }
  bool device_block_equals_slot(std::uint64_t block, std::uint64_t chunk) {
    const auto d = device_bytes();
    return std::memcmp(d.data() + block * page_bytes, host.data() + chunk * page_bytes,
                       page_bytes) == 0;
  }

  DeviceBuffer device;
  HostMem host;
  std::uint64_t page_bytes;
  DeviceRuntime& runtime;
  KvLayout layout;
  std::vector<std::byte> device_image;
};

// Loads chunks[i] into blocks[i].
inline void submit_load(TransferEngine& e, std::uint64_t id, std::vector<std::uint64_t> chunks,
                        std::vector<std::uint64_t> blocks, WaitOn wait = {}) {
  std::span<const std::uint64_t> views[] = {blocks};
  e.submit(JobId{id}, Direction::kLoad, TransferSpec{chunks, 0, views}, wait);
}
inline void submit_store(TransferEngine& e, std::uint64_t id, std::vector<std::uint64_t> chunks,
                         std::vector<std::uint64_t> blocks, WaitOn wait = {}) {
  std::span<const std::uint64_t> views[] = {blocks};
  e.submit(JobId{id}, Direction::kStore, TransferSpec{chunks, 0, views}, wait);
}

inline EngineOptions kernel_only() {
  EngineOptions o;
  o.store_policy = o.load_policy = PathPolicy{~0ULL, 1};
  return o;
}
inline EngineOptions dma_only() {
  EngineOptions o;
  o.allow_kernel = false;
  return o;
}

}  // namespace kvoffload::gpu_test
