#pragma once
// Planner: expands a job (TransferSpec) into copy descriptors for one direction, validating every
// id, coalescing copies that are contiguous on both sides, and choosing DMA or kernel for the
// batch. Buffers are members reused across plans: after warm-up, planning allocates nothing. Not
// thread-safe: the engine keeps one planner per direction, used under that direction's lock.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/transfer_engine.hpp>

namespace kvoffload::detail {

// A registered piece of the host buffer and the offset of its device addresses from its host
// addresses (0 with unified addressing; per piece on ROCm). Note [Host segments].
struct HostSegment {
  const std::byte* host = nullptr;
  std::uint64_t bytes = 0;
  std::ptrdiff_t delta = 0;
};

struct Plan {
  std::span<CopyDescriptor> copies;  // valid until the next plan()
  std::uint64_t bytes = 0;
  std::uint64_t fragments = 0;  // (block, tensor) pieces before coalescing
};

class Planner {
 public:
  // layout must already be validated.
  explicit Planner(const KvLayout& layout);

  // Throws Error(kInvalidArgument) naming the offending id/position; nothing is planned then.
  Plan plan(Direction direction, const TransferSpec& spec);

  // Rewrites the host side of `plan` by `delta` bytes (host pointer -> registered device pointer).
  static void shift_host_side(Plan& plan, Direction direction, std::ptrdiff_t delta) noexcept;
  // The same through the segment that holds each copy's host side (sorted by address, covering
  // every host address a plan can name); a copy that crosses into the next segment is split
  // there, as its two parts live at unrelated device addresses. Throws kInternal for a host
  // address outside every segment.
  void shift_host_side(Plan& plan, Direction direction, std::span<const HostSegment> segments);

 private:
  struct Tensor {
    std::uint64_t base;
    std::uint64_t page;
    std::uint64_t stride;
    std::uint64_t host_offset;  // within a slot
    std::uint64_t host_stride;  // between positions of the section
  };
  struct Group {
    std::uint32_t first_tensor;
    std::uint32_t tensor_count;
    std::uint64_t num_blocks;  // min over the group's tensors
  };

  void validate(Direction direction, const TransferSpec& spec);
  void validate_group_chunks(Direction direction, const TransferSpec& spec);
  // Refuses a duplicate among ids (< range): a bitmap member set and cleared again, so the check
  // allocates nothing after warm-up.
  void check_unique(std::span<const std::uint64_t> ids, std::uint64_t range, const char* what);
  // Emits group g's copies into the chunk at global chunk index c of a mapping whose blocks start
  // at position skip (blocks[i] at global position skip + i).
  template <class Emit>
  void emit_chunk_group(std::byte* slot, std::uint64_t c, std::uint32_t skip, std::size_t g,
                        std::span<const std::uint64_t> blocks, Emit& emit) const;

  const KvLayout& layout_;
  std::vector<Tensor> tensors_;
  std::vector<Group> groups_;
  std::vector<CopyDescriptor> copies_;
  std::vector<CopyDescriptor> split_;  // shift_host_side by segments
  std::vector<std::uint64_t> seen_;    // bitmap for duplicate detection, all-zero between plans
  bool groups_share_sections_ = false;
};

// Picks the path for one batch: the kernel only when allowed (registered host memory and a
// backend kernel), for batches of at least kernel_min_count pieces whose mean size is below
// kernel_below_bytes.
CopyPath choose_path(const PathPolicy& policy, const Plan& plan, bool kernel_allowed) noexcept;

}  // namespace kvoffload::detail
