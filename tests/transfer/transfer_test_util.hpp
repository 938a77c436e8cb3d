#pragma once
// The transfer suites' kit: the backends under test, a KV cache of device tensors and host slots
// with a reference model of where each byte must go (Cache), jobs (Job, random_job), the
// parameterised fixture (TransferTest) and a stream gate (FlagGate). Built twice, like the suites:
// KVOFFLOAD_TEST_BACKENDS="host,sim" (label cpu) and "cuda,hip" (label gpu).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "gpu_skip.hpp"
#include "skip.hpp"

#ifndef KVOFFLOAD_TEST_BACKENDS
#define KVOFFLOAD_TEST_BACKENDS "host,sim"
#endif

namespace kvoffload::test {

inline std::vector<std::string> backends() {
  std::vector<std::string> out;
  std::string s = KVOFFLOAD_TEST_BACKENDS;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Host memory the tests own (page aligned: registration works on any alignment, but row strides
// of a region are page-aligned and tests should look like that).
struct HostBuffer {
  explicit HostBuffer(std::size_t n)
      : bytes(n), ptr(static_cast<std::byte*>(std::aligned_alloc(4096, round(n)))) {}
  static std::size_t round(std::size_t n) { return (n + 4095) / 4096 * 4096; }
  std::span<std::byte> span() const { return {ptr.get(), bytes}; }
  std::size_t bytes;
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> ptr;
};

inline void fill_random(std::span<std::byte> s, std::mt19937_64& rng) {
  for (auto& b : s) b = static_cast<std::byte>(rng() & 0xff);
}

struct TensorShape {
  std::uint64_t num_blocks;
  std::uint64_t page_bytes;
  std::uint64_t block_stride;  // 0 = page
};

// A KV cache made of device tensors (allocated through the runtime) and host slots in a plain
// buffer, with a reference model of where each byte must go.
class Cache {
 public:
  Cache(DeviceRuntime& rt, std::vector<std::vector<TensorShape>> shapes, std::uint32_t bpc,
        std::uint64_t chunks, std::uint32_t copies, std::uint32_t copy_index,
        std::uint64_t extra_slot_bytes = 0)
      : rt_(rt), shapes_(std::move(shapes)) {
    layout.blocks_per_chunk = bpc;
    std::uint64_t page_sum = 0;
    for (const auto& group : shapes_) {
      KvGroup g;
      for (const TensorShape& t : group) {
        const std::uint64_t stride = t.block_stride == 0 ? t.page_bytes : t.block_stride;
        device_.push_back(rt.allocate_device(t.num_blocks * stride));
        g.tensors.push_back(DeviceTensor{reinterpret_cast<std::uintptr_t>(device_.back().data()),
                                         t.num_blocks, t.page_bytes, t.block_stride});
        page_sum += t.page_bytes;
      }
      layout.groups.push_back(std::move(g));
    }
    slot_bytes = page_sum * bpc + extra_slot_bytes;
    row_stride = (slot_bytes * copies + 4095) / 4096 * 4096;
    host = std::make_unique<HostBuffer>(row_stride * chunks);
    layout.host = HostSlots::from_buffer(host->span(), slot_bytes, row_stride, copy_index);
  }

  // Random bytes everywhere (device tensors and the whole host buffer), mirrored in images.
  void randomize(std::mt19937_64& rng) {
    dev_image.clear();
    for (DeviceBuffer& d : device_) {
      std::vector<std::byte> img(d.bytes());
      fill_random(img, rng);
      rt_.memcpy_sync(d.data(), img.data(), img.size());
      dev_image.push_back(std::move(img));
    }
    fill_random(host->span(), rng);
    host_image.assign(host->span().begin(), host->span().end());
  }

  // Applies a job to the images with the simplest possible loops (the reference model).
  void model(Direction dir, const std::vector<std::uint64_t>& chunks, std::uint32_t skip,
             const std::vector<std::vector<std::uint64_t>>& blocks) {
    const std::uint64_t bpc = layout.blocks_per_chunk;
    std::size_t tensor_index = 0;
    std::uint64_t section = 0;
    for (std::size_t g = 0; g < shapes_.size(); ++g) {
      for (const TensorShape& t : shapes_[g]) {
        const std::uint64_t stride = t.block_stride == 0 ? t.page_bytes : t.block_stride;
        for (std::size_t i = 0; i < blocks[g].size(); ++i) {
          const std::uint64_t pos = skip + i;
          const std::uint64_t host_off = chunks[pos / bpc] * row_stride + layout.host.slot_offset +
                                         section + (pos % bpc) * t.page_bytes;
          const std::uint64_t dev_off = blocks[g][i] * stride;
          auto& dimg = dev_image[tensor_index];
          if (dir == Direction::kStore) {
            std::memcpy(host_image.data() + host_off, dimg.data() + dev_off, t.page_bytes);
          } else {
            std::memcpy(dimg.data() + dev_off, host_image.data() + host_off, t.page_bytes);
          }
        }
        section += t.page_bytes * bpc;
        ++tensor_index;
      }
    }
  }

  // Every byte of every device tensor and of the whole host buffer equals the model.
  void expect_matches_model() {
    for (std::size_t i = 0; i < device_.size(); ++i) {
      std::vector<std::byte> got(device_[i].bytes());
      rt_.memcpy_sync(got.data(), device_[i].data(), got.size());
      ASSERT_TRUE(got == dev_image[i]) << "device tensor " << i << " differs from the model";
    }
    ASSERT_TRUE(std::equal(host_image.begin(), host_image.end(), host->span().begin()))
        << "host buffer differs from the model";
  }

  DeviceBuffer& device(std::size_t i) { return device_[i]; }

  KvLayout layout;
  std::uint64_t slot_bytes = 0;
  std::uint64_t row_stride = 0;
  std::unique_ptr<HostBuffer> host;
  std::vector<std::vector<std::byte>> dev_image;
  std::vector<std::byte> host_image;

 private:
  DeviceRuntime& rt_;
  std::vector<std::vector<TensorShape>> shapes_;
  std::vector<DeviceBuffer> device_;
};

// Owns the spans a TransferSpec points at.
struct Job {
  std::vector<std::uint64_t> chunks;
  std::uint32_t skip = 0;
  std::vector<std::vector<std::uint64_t>> blocks;
  std::vector<std::span<const std::uint64_t>> views;
  TransferSpec spec() {
    views.assign(blocks.begin(), blocks.end());
    return TransferSpec{chunks, skip, views};
  }
};

inline std::vector<std::uint64_t> pick_distinct(std::uint64_t range, std::size_t n,
                                                std::mt19937_64& rng) {
  std::vector<std::uint64_t> all(range);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

// A job of `nblocks` blocks per group (group g may get fewer: min with its size) at random ids.
inline Job random_job(const Cache& cache, std::uint64_t num_chunks, std::uint64_t nblocks,
                      std::uint32_t skip, std::mt19937_64& rng, std::uint64_t group_blocks_limit) {
  Job job;
  job.skip = skip;
  const std::uint64_t bpc = cache.layout.blocks_per_chunk;
  const std::uint64_t nchunks = (skip + nblocks + bpc - 1) / bpc;
  job.chunks = pick_distinct(num_chunks, nchunks, rng);
  for (std::size_t g = 0; g < cache.layout.groups.size(); ++g) {
    job.blocks.push_back(pick_distinct(group_blocks_limit, nblocks, rng));
  }
  return job;
}

class TransferTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      runtime_ = make_runtime(GetParam());
    } catch (const Error& e) {
      // Only a GPU backend may be missing: host and sim are always built, so there it fails.
      if (e.code() == ErrorCode::kNotAvailable && GetParam() != "host" && GetParam() != "sim")
        KVO_SKIP_OR_FAIL_GPU(GetParam(), e.what());
      throw;
    }
  }
  DeviceRuntime& rt() { return *runtime_; }
  std::unique_ptr<DeviceRuntime> runtime_;
};

// Shapes: several tensors with different page sizes, some not multiples of 16, one strided.
inline std::vector<std::vector<TensorShape>> mixed_shapes(std::uint64_t blocks) {
  return {{{blocks, 4096, 0}, {blocks, 1000, 0}, {blocks, 24, 40}}, {{blocks, 528, 0}}};
}

// Holds streams until opened: each held stream waits for a 32-bit flag of the runtime's own
// (DeviceRuntime::wait_host_flag on a HostFlag: cuStreamWaitValue32, hipStreamWaitValue32 on
// signal memory). Never a host function that blocks: CUDA forbids host functions that wait for
// other GPU work, and one may deadlock on ROCm. One use.
class FlagGate {
 public:
  explicit FlagGate(DeviceRuntime& rt) : flag_(rt.create_host_flag()), rt_(rt) {}
  ~FlagGate() { open(); }  // never leave a stream held
  FlagGate(const FlagGate&) = delete;
  FlagGate& operator=(const FlagGate&) = delete;
  void hold(StreamView s) { rt_.wait_host_flag(s, flag_.data(), 1); }
  void open() { flag_.set(1); }
  // Opens after `ms` from another thread (for calls that block until the stream is free).
  std::thread open_later(int ms) {
    return std::thread([this, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      open();
    });
  }

 private:
  HostFlag flag_;
  DeviceRuntime& rt_;
};

}  // namespace kvoffload::test
