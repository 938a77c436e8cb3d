#pragma once
// The CUDA DeviceRuntime (DESIGN.md §3): streams and events, host registration of the region,
// batched DMA (cuMemcpyBatchAsync or a per-copy loop) and the SM copy kernel from kernels/.
// Host C++ linked to cudart; hip/src/hip_device_runtime.hpp is its twin.
#include "cuda_batch_memcpy.hpp"

#include <kvoffload/device_runtime.hpp>
#include <kvoffload_kernels/copy_kernels.hpp>

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvoffload::cuda {

// Default upper bound of one cudaHostRegister call. One call of >= 512 GiB fails on r580+
// drivers and leaves a sticky error (REFERENCE.md); 64 GiB pieces register at the same rate.
inline constexpr std::uint64_t kDefaultRegisterChunkBytes = 64ull << 30;

// [offset, offset + bytes) pieces of a registration of `bytes` bytes at address `base`: each at
// most `limit` bytes, a whole number of `align` units (the region's row stride) when one unit fits
// into the limit, and always a whole number of pages (two registrations must never share a page).
// Throws kInvalidArgument when more than one piece is needed and `base` is not page-aligned.
std::vector<std::pair<std::size_t, std::size_t>> plan_registration(std::uintptr_t base,
                                                                  std::size_t bytes,
                                                                  std::size_t align,
                                                                  std::size_t limit,
                                                                  std::size_t page);

class CudaRuntime final : public DeviceRuntime {
 public:
  // Selects options.device (must exist: make_cuda_runtime checks). Throws kDevice on failure.
  explicit CudaRuntime(const RuntimeOptions& options);
  ~CudaRuntime() override;

  [[nodiscard]] std::string_view name() const noexcept override { return "cuda"; }
  [[nodiscard]] BackendInfo info() const override;
  [[nodiscard]] bool supports_kernel_path() const noexcept override { return kernel_ok_; }

 protected:
  RegistrationRecord do_register_host(void* ptr, std::size_t bytes, std::size_t align) override;
  bool do_unregister_host(std::uintptr_t handle) noexcept override;
  std::uintptr_t do_create_stream() override;
  void do_destroy_stream(std::uintptr_t stream) noexcept override;
  std::uintptr_t do_create_event(bool timing) override;
  void do_destroy_event(std::uintptr_t event) noexcept override;
  void* do_allocate_device(std::size_t bytes) override;
  void do_free_device(void* ptr) noexcept override;
  void do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                         CopyKind kind, CopyPath path) override;
  void do_record_event(std::uintptr_t event, std::uintptr_t stream) override;
  void do_wait_event(std::uintptr_t stream, std::uintptr_t event) override;
  bool do_query_event(std::uintptr_t event) override;
  void do_synchronize_event(std::uintptr_t event) override;
  void do_synchronize_stream(std::uintptr_t stream) override;
  double do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) override;
  void do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) override;
  void do_memcpy_sync(void* dst, const void* src, std::size_t bytes) override;
  void do_memset_sync(void* dst, int value, std::size_t bytes) override;

 private:
  struct Piece {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };
  struct Registration {
    void* base = nullptr;
    std::size_t bytes = 0;
    std::vector<Piece> pieces;  // registered, in address order
  };

  // A pinned, device-mapped buffer of kernel descriptors and the event recorded after the kernel
  // that reads it: the slot is reused only once that event has completed.
  struct DescSlot {
    kernels::CopyDesc* host = nullptr;
    const kernels::CopyDesc* device = nullptr;
    cudaEvent_t done = nullptr;
    bool recorded = false;  // `done` was recorded after a launch that reads this slot
    bool retired = false;   // a launch read it but no event could be recorded: never reuse
  };
  static constexpr std::size_t kSlotDescs = 4096;  // 96 KiB per slot
  static constexpr std::size_t kMaxSlots = 64;

  // Registers the planned pieces; on failure unregisters what it did and throws the original error.
  void register_pieces(Registration& reg,
                       const std::vector<std::pair<std::size_t, std::size_t>>& plan);
  // Unregisters every piece in reverse order, finishing every step; false if any failed (logged).
  static bool unregister_pieces(Registration& reg) noexcept;

  void enqueue_dma(cudaStream_t stream, std::span<const CopyDescriptor> batch, CopyKind kind);
  void enqueue_dma_loop(cudaStream_t stream, std::span<const CopyDescriptor> batch,
                        CopyKind kind);
  void enqueue_kernel(cudaStream_t stream, std::span<const CopyDescriptor> batch);
  DescSlot& acquire_slot();  // ring_mu_ held

  RuntimeOptions options_;
  int device_ = 0;
  std::string device_name_;
  std::string arch_;  // "sm_90" / "gfx90a:sramecc+:xnack-"
  int driver_version_ = 0;
  int runtime_version_ = 0;
  std::size_t register_chunk_bytes_ = kDefaultRegisterChunkBytes;
  int kernel_max_ctas_ = kernels::kDefaultBatchCopyCtas;

  BatchMemcpy batch_;
  std::atomic<bool> batch_enabled_{false};
  bool kernel_ok_ = false;
  std::string kernel_detail_;

  cudaStream_t sync_stream_ = nullptr;  // memcpy_sync / memset_sync

  std::mutex reg_mu_;
  std::unordered_map<std::uintptr_t, std::unique_ptr<Registration>> registrations_;

  std::mutex ring_mu_;
  std::vector<DescSlot> slots_;
  std::size_t next_slot_ = 0;
};

}  // namespace kvoffload::cuda
