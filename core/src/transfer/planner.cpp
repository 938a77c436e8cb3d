#include "transfer/planner.hpp"

#include <algorithm>
#include <string>

#include <kvoffload/error.hpp>

#include "util/log.hpp"

namespace kvoffload::detail {

Planner::Planner(const KvLayout& layout)
    : layout_(layout), groups_share_sections_(layout.groups_share_sections()) {
  const bool explicit_sections = layout.explicit_sections();
  std::uint64_t host_offset = 0;
  for (const KvGroup& g : layout.groups) {
    Group group{static_cast<std::uint32_t>(tensors_.size()),
                static_cast<std::uint32_t>(g.tensors.size()), ~std::uint64_t{0}};
    for (const DeviceTensor& t : g.tensors) {
      const std::uint64_t stride = t.block_stride == 0 ? t.page_bytes : t.block_stride;
      if (explicit_sections) {
        const std::uint64_t positions = t.host_page_stride == 0 ? t.page_bytes : t.host_page_stride;
        tensors_.push_back(Tensor{t.base, t.page_bytes, stride, t.host_offset, positions});
      } else {
        tensors_.push_back(Tensor{t.base, t.page_bytes, stride, host_offset, t.page_bytes});
        host_offset += t.page_bytes * layout.blocks_per_chunk;
      }
      group.num_blocks = std::min(group.num_blocks, t.num_blocks);
    }
    groups_.push_back(group);
  }
}

void Planner::check_unique(std::span<const std::uint64_t> ids, std::uint64_t range,
                           const char* what) {
  const std::size_t words = static_cast<std::size_t>((range + 63) / 64);
  if (seen_.size() < words) seen_.resize(words, 0);
  std::size_t i = 0;
  bool dup = false;
  for (; i < ids.size(); ++i) {
    const std::uint64_t bit = std::uint64_t{1} << (ids[i] % 64);
    std::uint64_t& word = seen_[ids[i] / 64];
    if ((word & bit) != 0) {
      dup = true;
      break;
    }
    word |= bit;
  }
  for (std::size_t j = 0; j < i; ++j) seen_[ids[j] / 64] = 0;
  if (dup)
    throw_invalid(std::string("transfer spec: duplicate ") + what + " " + std::to_string(ids[i]));
}

void Planner::validate_group_chunks(Direction direction, const TransferSpec& spec) {
  const std::uint64_t bpc = layout_.blocks_per_chunk;
  if (!spec.chunks.empty() || spec.skip != 0) {
    throw_invalid("transfer spec: give chunks and skip, or group_chunks, not both");
  }
  if (spec.group_chunks.size() != groups_.size() || spec.group_blocks.size() != groups_.size()) {
    throw_invalid("transfer spec: " + std::to_string(spec.group_chunks.size()) +
                  " chunk lists and " + std::to_string(spec.group_blocks.size()) +
                  " block lists for " + std::to_string(groups_.size()) + " KV groups");
  }
  std::uint64_t total_chunks = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto blocks = spec.group_blocks[g];
    const GroupChunks& gc = spec.group_chunks[g];
    const std::string group = "transfer spec: group " + std::to_string(g);
    if (gc.skip >= bpc) {
      throw_invalid(group + " skip " + std::to_string(gc.skip) + " must be < blocks_per_chunk " +
                    std::to_string(bpc));
    }
    const std::uint64_t need = blocks.empty() ? 0 : (gc.skip + blocks.size() + bpc - 1) / bpc;
    if (gc.chunks.size() != need) {
      throw_invalid(group + " has " + std::to_string(blocks.size()) + " blocks from position " +
                    std::to_string(gc.skip) + ", which fill " + std::to_string(need) +
                    " chunks, but " + std::to_string(gc.chunks.size()) + " are listed");
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] >= groups_[g].num_blocks) {
        throw_invalid(group + " block id " + std::to_string(blocks[i]) + " (index " +
                      std::to_string(i) + ") is out of range: the group's tensors have " +
                      std::to_string(groups_[g].num_blocks) + " blocks");
      }
    }
    for (std::size_t c = 0; c < gc.chunks.size(); ++c) {
      if (gc.chunks[c] >= layout_.host.num_chunks) {
        throw_invalid(group + " host chunk id " + std::to_string(gc.chunks[c]) + " (index " +
                      std::to_string(c) + ") is out of range: the host has " +
                      std::to_string(layout_.host.num_chunks) + " chunks");
      }
    }
    total_chunks += gc.chunks.size();
  }
  if (total_chunks == 0) throw_invalid("transfer spec: no host chunks");
  if (direction == Direction::kStore) {
    // Across groups too: one chunk holds one group's blocks.
    const std::size_t words = static_cast<std::size_t>((layout_.host.num_chunks + 63) / 64);
    if (seen_.size() < words) seen_.resize(words, 0);
    std::size_t g = 0;
    std::size_t c = 0;
    bool dup = false;
    for (; g < groups_.size() && !dup; ++g) {
      const auto chunks = spec.group_chunks[g].chunks;
      for (c = 0; c < chunks.size(); ++c) {
        std::uint64_t& word = seen_[chunks[c] / 64];
        const std::uint64_t bit = std::uint64_t{1} << (chunks[c] % 64);
        if ((word & bit) != 0) {
          dup = true;
          break;
        }
        word |= bit;
      }
      if (dup) break;
    }
    const std::uint64_t dup_id = dup ? spec.group_chunks[g].chunks[c] : 0;
    for (std::size_t h = 0; h < groups_.size(); ++h) {
      for (const std::uint64_t id : spec.group_chunks[h].chunks) seen_[id / 64] = 0;
    }
    if (dup) throw_invalid("transfer spec: duplicate host chunk id " + std::to_string(dup_id));
  } else {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      check_unique(spec.group_blocks[g], groups_[g].num_blocks, "GPU block id (load destination)");
    }
  }
}

void Planner::validate(Direction direction, const TransferSpec& spec) {
  if (!spec.group_chunks.empty()) {
    validate_group_chunks(direction, spec);
    return;
  }
  const std::uint64_t bpc = layout_.blocks_per_chunk;
  if (spec.chunks.empty()) throw_invalid("transfer spec: no host chunks");
  if (spec.skip >= bpc) {
    throw_invalid("transfer spec: skip " + std::to_string(spec.skip) +
                  " must be < blocks_per_chunk " + std::to_string(bpc));
  }
  if (spec.group_blocks.size() != groups_.size()) {
    throw_invalid("transfer spec: " + std::to_string(spec.group_blocks.size()) +
                  " block lists for " + std::to_string(groups_.size()) + " KV groups");
  }
  const std::uint64_t capacity = spec.chunks.size() * bpc - spec.skip;
  std::uint64_t longest = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto blocks = spec.group_blocks[g];
    if (blocks.size() > capacity) {
      throw_invalid("transfer spec: group " + std::to_string(g) + " has " +
                    std::to_string(blocks.size()) + " blocks but " +
                    std::to_string(spec.chunks.size()) + " chunks from position " +
                    std::to_string(spec.skip) + " hold " + std::to_string(capacity));
    }
    longest = std::max<std::uint64_t>(longest, blocks.size());
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] >= groups_[g].num_blocks) {
        throw_invalid("transfer spec: group " + std::to_string(g) + " block id " +
                      std::to_string(blocks[i]) + " (index " + std::to_string(i) +
                      ") is out of range: the group's tensors have " +
                      std::to_string(groups_[g].num_blocks) + " blocks");
      }
    }
  }
  if (longest + spec.skip <= (spec.chunks.size() - 1) * bpc) {
    throw_invalid("transfer spec: " + std::to_string(spec.chunks.size()) +
                  " chunks listed but the blocks (" + std::to_string(longest) + " from position " +
                  std::to_string(spec.skip) + ") fill only " +
                  std::to_string((longest + spec.skip + bpc - 1) / bpc));
  }
  for (std::size_t c = 0; c < spec.chunks.size(); ++c) {
    if (spec.chunks[c] >= layout_.host.num_chunks) {
      throw_invalid("transfer spec: host chunk id " + std::to_string(spec.chunks[c]) + " (index " +
                    std::to_string(c) + ") is out of range: the host has " +
                    std::to_string(layout_.host.num_chunks) + " chunks");
    }
  }

  if (groups_share_sections_) {
    std::size_t used = 0;
    for (const auto blocks : spec.group_blocks) used += blocks.empty() ? 0 : 1;
    if (used > 1) {
      throw_invalid("transfer spec: " + std::to_string(used) +
                    " groups map blocks onto the same chunks, but their tensors share slot "
                    "sections; give each group its own chunks (TransferSpec::group_chunks)");
    }
  }
  // Two copies into the same destination would make the result depend on copy order: refuse
  // duplicate destinations (chunks for a store, GPU blocks per group for a load).
  if (direction == Direction::kStore) {
    check_unique(spec.chunks, layout_.host.num_chunks, "host chunk id");
  } else {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      check_unique(spec.group_blocks[g], groups_[g].num_blocks, "GPU block id (load destination)");
    }
  }
}

template <class Emit>
void Planner::emit_chunk_group(std::byte* slot, std::uint64_t c, std::uint32_t skip, std::size_t g,
                               std::span<const std::uint64_t> blocks, Emit& emit) const {
  const std::uint64_t bpc = layout_.blocks_per_chunk;
  const std::uint64_t first_pos = c == 0 ? skip : 0;
  const std::uint64_t chunk_start = c * bpc;  // global position of this chunk's first slot
  if (chunk_start + first_pos >= blocks.size() + skip) return;
  const std::uint64_t last_pos = std::min<std::uint64_t>(bpc, blocks.size() + skip - chunk_start);
  const Group& group = groups_[g];
  for (std::uint32_t t = group.first_tensor; t < group.first_tensor + group.tensor_count; ++t) {
    const Tensor& tensor = tensors_[t];
    std::byte* section = slot + tensor.host_offset;
    for (std::uint64_t p = first_pos; p < last_pos; ++p) {
      const std::uint64_t block = blocks[chunk_start + p - skip];
      emit(section + p * tensor.host_stride, tensor.base + block * tensor.stride, tensor.page);
    }
  }
}

Plan Planner::plan(Direction direction, const TransferSpec& spec) {
  validate(direction, spec);
  copies_.clear();
  std::uint64_t bytes = 0;
  std::uint64_t fragments = 0;
  const bool store = direction == Direction::kStore;

  // Emitting in host order makes host-contiguous pieces adjacent, so a single look-back merge
  // finds every run that is contiguous on both sides in that order.
  auto emit = [&](std::byte* host, std::uint64_t device, std::uint64_t n) {
    auto* dev = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(device));
    const void* src = store ? static_cast<const void*>(dev) : host;
    void* dst = store ? static_cast<void*>(host) : dev;
    ++fragments;
    bytes += n;
    if (!copies_.empty()) {
      CopyDescriptor& last = copies_.back();
      if (static_cast<const std::byte*>(last.src) + last.bytes == src &&
          static_cast<std::byte*>(last.dst) + last.bytes == dst) {
        last.bytes += n;
        return;
      }
    }
    copies_.push_back(CopyDescriptor{src, dst, n});
  };

  if (spec.group_chunks.empty()) {
    // Host order (chunk, group, tensor, position).
    for (std::size_t c = 0; c < spec.chunks.size(); ++c) {
      std::byte* slot = layout_.host.slot(spec.chunks[c]);
      for (std::size_t g = 0; g < groups_.size(); ++g) {
        emit_chunk_group(slot, c, spec.skip, g, spec.group_blocks[g], emit);
      }
    }
  } else {
    // Host order (group, chunk, tensor, position): each chunk holds one group.
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const GroupChunks& gc = spec.group_chunks[g];
      for (std::size_t c = 0; c < gc.chunks.size(); ++c) {
        emit_chunk_group(layout_.host.slot(gc.chunks[c]), c, gc.skip, g, spec.group_blocks[g],
                         emit);
      }
    }
  }
  return Plan{std::span<CopyDescriptor>(copies_), bytes, fragments};
}

void Planner::shift_host_side(Plan& plan, Direction direction, std::ptrdiff_t delta) noexcept {
  if (delta == 0) return;
  for (CopyDescriptor& d : plan.copies) {
    if (direction == Direction::kStore) {
      d.dst = static_cast<std::byte*>(d.dst) + delta;
    } else {
      d.src = static_cast<const std::byte*>(d.src) + delta;
    }
  }
}

void Planner::shift_host_side(Plan& plan, Direction direction,
                              std::span<const HostSegment> segments) {
  if (segments.size() == 1) {
    shift_host_side(plan, direction, segments.front().delta);
    return;
  }
  const bool store = direction == Direction::kStore;
  split_.clear();
  for (const CopyDescriptor& whole : plan.copies) {
    CopyDescriptor d = whole;
    for (;;) {
      const auto* host = static_cast<const std::byte*>(store ? d.dst : d.src);
      auto it =
          std::upper_bound(segments.begin(), segments.end(), host,
                           [](const std::byte* h, const HostSegment& s) { return h < s.host; });
      if (it == segments.begin() || host >= std::prev(it)->host + std::prev(it)->bytes) {
        throw Error(ErrorCode::kInternal, "transfer engine: host address " +
                                              fmt::format("{}", static_cast<const void*>(host)) +
                                              " lies in no registered piece");
      }
      const HostSegment& seg = *std::prev(it);
      const auto room = static_cast<std::uint64_t>(seg.host + seg.bytes - host);
      CopyDescriptor part = d;
      part.bytes = std::min(d.bytes, room);
      if (store) {
        part.dst = static_cast<std::byte*>(part.dst) + seg.delta;
      } else {
        part.src = static_cast<const std::byte*>(part.src) + seg.delta;
      }
      split_.push_back(part);
      if (part.bytes == d.bytes) break;
      d.src = static_cast<const std::byte*>(d.src) + part.bytes;
      d.dst = static_cast<std::byte*>(d.dst) + part.bytes;
      d.bytes -= part.bytes;
    }
  }
  plan.copies = std::span<CopyDescriptor>(split_);
}

CopyPath choose_path(const PathPolicy& policy, const Plan& plan, bool kernel_allowed) noexcept {
  if (!kernel_allowed || plan.copies.empty()) return CopyPath::kDma;
  const std::uint64_t mean = plan.bytes / plan.copies.size();
  if (plan.copies.size() >= policy.kernel_min_count && mean < policy.kernel_below_bytes) {
    return CopyPath::kKernel;
  }
  return CopyPath::kDma;
}

}  // namespace kvoffload::detail
