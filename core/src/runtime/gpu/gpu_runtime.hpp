#pragma once
// GpuRuntime: the one DeviceRuntime for every GPU backend (cuda, hip, sim), written against the
// vendor table of vendor_api.hpp (see Note [One GPU runtime over a vendor table]).
// Implemented by idea: gpu_runtime.cpp (construction, device guard, kernel architectures),
// gpu_registration.cpp, gpu_streams.cpp, gpu_device_memory.cpp, gpu_dma.cpp, gpu_kernel_path.cpp;
// gpu_runtime_internal.hpp holds what they share.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <kvoffload/device_runtime.hpp>

#include "runtime/gpu/vendor_api.hpp"

namespace kvoffload::gpu {

// Default upper bound of one host-register call. One call of >= 512 GiB fails on r580+ drivers
// and leaves a sticky error (docs/DESIGN.md §4.4); 64 GiB pieces register at the same rate.
inline constexpr std::uint64_t kDefaultRegisterChunkBytes = 64ull << 30;

// [offset, offset + bytes) pieces of a registration of `bytes` bytes at address `base`: each at
// most `limit` bytes, a whole number of `align` units (the region's row stride) when one unit fits
// into the limit, and always a whole number of pages (two registrations must never share a page).
// Throws kInvalidArgument when more than one piece is needed and `base` is not page-aligned.
std::vector<std::pair<std::size_t, std::size_t>> plan_registration(
    std::uintptr_t base, std::size_t bytes, std::size_t align, std::size_t limit, std::size_t page);

// "<call> <context>: <ErrName>: <text> (<api> error N)" as a kDevice Error. Clears the thread's
// last error first, so a handled failure does not resurface from a later, unrelated call.
[[noreturn]] void throw_vendor(const VendorApi& api, int err, std::string_view call,
                               std::string_view context = {});
inline void check_vendor(const VendorApi& api, int err, std::string_view call,
                         std::string_view context = {}) {
  if (err != 0) throw_vendor(api, err, call, context);
}

class GpuRuntime final : public DeviceRuntime {
 public:
  // `api` must outlive the runtime (modules stay loaded; a sim device is kept by `keep`).
  // Selects options.device, which must exist. Throws kDevice on failure.
  GpuRuntime(const VendorApi& api, const RuntimeOptions& options, std::shared_ptr<void> keep = {});
  ~GpuRuntime() override;

  [[nodiscard]] std::string_view name() const noexcept override { return api_.name; }
  [[nodiscard]] BackendInfo info() const override;
  [[nodiscard]] bool supports_kernel_path() const noexcept override { return kernel_ok_; }
  [[nodiscard]] RuntimeCounters counters() const noexcept override;

 protected:
  RegistrationRecord do_register_host(void* ptr, std::size_t bytes, std::size_t align) override;
  bool do_unregister_host(std::uintptr_t handle) noexcept override;
  std::uintptr_t do_create_stream() override;
  void do_destroy_stream(std::uintptr_t stream) noexcept override;
  std::uintptr_t do_create_event(bool timing) override;
  void do_destroy_event(std::uintptr_t event) noexcept override;
  void* do_allocate_device(std::size_t bytes) override;
  void do_free_device(void* ptr) noexcept override;
  void do_free_device_async(void* ptr, std::uintptr_t stream) noexcept override;
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
  void do_wait_host_flag(std::uintptr_t stream, const std::uint32_t* flag,
                         std::uint32_t value) override;
  std::uint32_t* do_create_host_flag() override;
  void do_destroy_host_flag(std::uint32_t* flag) noexcept override;
  bool do_stream_capturing(std::uintptr_t stream) override;

 private:
  struct Piece {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };
  struct Registration {
    void* base = nullptr;
    std::size_t bytes = 0;
    std::vector<Piece> pieces;  // registered, in address order
    bool mlocked = false;
  };
  // A pinned, device-mapped buffer of kernel descriptors (plus, when staging, a device copy of
  // it) and the event recorded after the last launch that reads it. Note [Descriptor rings] in
  // gpu_kernel_path.cpp.
  struct DescSlot {
    VendorCopyDesc* host = nullptr;
    const VendorCopyDesc* host_device_view = nullptr;  // the host buffer as the device sees it
    VendorCopyDesc* staged = nullptr;                  // device memory; null when not staging
    bool staged_async = false;  // `staged` is stream-ordered memory of the ring's stream
    void* done = nullptr;
    bool recorded = false;  // `done` was recorded after work that reads this slot
    bool retired = false;   // work may read it and no event tells when it ends: never reuse
  };
  struct Ring {
    std::mutex mu;  // one per stream: a store lane waiting for a slot never blocks a load lane
    std::vector<DescSlot> slots;
    std::size_t next = 0;
  };
  class Guard;  // makes the runtime's device current for a scope

  void register_pieces(Registration& reg,
                       const std::vector<std::pair<std::size_t, std::size_t>>& plan);
  bool unregister_pieces(Registration& reg) noexcept;
  std::vector<DeviceSegment> device_segments_of(Registration& reg);
  // Whether this device's copy kernel can run, or why not. Note [Kernel architectures] in
  // gpu_runtime.cpp.
  [[nodiscard]] std::string kernel_unavailable_reason();

  void enqueue_dma(void* stream, std::span<const CopyDescriptor> batch, CopyKind kind);
  void enqueue_dma_loop(void* stream, std::span<const CopyDescriptor> batch, CopyKind kind);
  void enqueue_kernel(void* stream, std::span<const CopyDescriptor> batch);
  Ring& ring_of(void* stream);
  DescSlot& acquire_slot(Ring& ring, void* stream);  // ring.mu held
  DescSlot make_slot(void* stream);
  // Frees the slot's buffers: the staged buffer in `stream` order when the stream still exists
  // (stream_alive), else plainly (everything that read it has finished).
  // keep_host: the pinned buffer goes to spare_host_ instead of host_free (Note [Descriptor
  // rings]); only for a slot whose readers are known to be done.
  void free_slot(DescSlot& slot, void* stream, bool stream_alive, bool keep_host = false) noexcept;
  // Waits for the work that reads the ring's slots, then frees them. `stream_alive`: false at
  // runtime destruction, where a foreign stream may be gone (Note [Retired slots] in
  // gpu_kernel_path.cpp).
  void destroy_ring(Ring& ring, void* stream, bool stream_alive) noexcept;

  const VendorApi& api_;
  void* ctx_;
  std::shared_ptr<void> keep_;
  RuntimeOptions options_;
  int device_ = 0;
  std::string device_name_;
  std::string arch_;
  std::string versions_;
  std::size_t register_chunk_bytes_ = kDefaultRegisterChunkBytes;
  int kernel_max_ctas_ = 0;
  std::size_t ring_slots_ = 64;
  std::size_t slot_descs_ = 4096;
  bool kernel_ok_ = false;
  std::string kernel_detail_;
  void* sync_stream_ = nullptr;  // memcpy_sync / memset_sync
  // Stream-ordered allocation: the table has it and the device has memory pools (Note [Freeing]
  // in gpu_device_memory.cpp).
  bool async_alloc_ = false;

  std::atomic<bool> batch_enabled_{false};
  std::atomic<std::uint64_t> dma_batched_calls_{0};
  std::atomic<std::uint64_t> dma_batch_refusals_{0};
  std::atomic<std::uint64_t> dma_loop_copies_{0};
  std::atomic<std::uint64_t> kernel_launches_{0};
  std::atomic<std::uint64_t> kernel_descriptors_{0};
  std::atomic<std::uint64_t> ring_waits_{0};

  std::mutex reg_mu_;
  std::unordered_map<std::uintptr_t, std::unique_ptr<Registration>> registrations_;

  std::mutex rings_mu_;  // the map only; each ring has its own lock
  std::unordered_map<void*, std::unique_ptr<Ring>> rings_;

  std::mutex spare_mu_;
  std::vector<void*> spare_host_;  // pinned descriptor buffers of rings gone, freed with us

  std::mutex alloc_mu_;
  // From device_malloc_async (Note [Freeing] in gpu_device_memory.cpp).
  std::unordered_set<void*> async_allocations_;
};

}  // namespace kvoffload::gpu
