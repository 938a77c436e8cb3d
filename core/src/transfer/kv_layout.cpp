// KV layout validation and host-slot constructors.
#include <algorithm>
#include <limits>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/kv_layout.hpp>

namespace kvoffload {

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

bool mul_overflows(std::uint64_t a, std::uint64_t b) noexcept {
  return a != 0 && b > kMax / a;
}

std::string where(std::size_t g, std::size_t t) {
  return "group " + std::to_string(g) + " tensor " + std::to_string(t);
}

}  // namespace

std::string_view to_string(Direction d) noexcept {
  return d == Direction::kStore ? "store" : "load";
}

HostSlots HostSlots::from_buffer(std::span<std::byte> buffer, std::uint64_t slot_bytes,
                                 std::uint64_t row_stride, std::uint32_t copy_index) {
  if (buffer.data() == nullptr || buffer.empty()) throw_invalid("host slots: empty host buffer");
  if (slot_bytes == 0) throw_invalid("host slots: slot_bytes must be > 0");
  if (row_stride == 0) row_stride = slot_bytes;
  if (mul_overflows(copy_index, slot_bytes))
    throw_invalid("host slots: copy_index * slot_bytes overflows");
  HostSlots s;
  s.base = buffer.data();
  s.buffer_bytes = buffer.size();
  s.row_stride = row_stride;
  s.slot_offset = std::uint64_t{copy_index} * slot_bytes;
  s.slot_bytes = slot_bytes;
  if (s.slot_offset + slot_bytes > row_stride) {
    throw_invalid("host slots: copy " + std::to_string(copy_index) + " of " +
                  std::to_string(slot_bytes) + "-byte slots does not fit a row of " +
                  std::to_string(row_stride) + " bytes");
  }
  s.num_chunks = s.buffer_bytes / row_stride;
  if (s.num_chunks == 0) {
    throw_invalid("host slots: buffer of " + std::to_string(s.buffer_bytes) +
                  " bytes holds no row of " + std::to_string(row_stride) + " bytes");
  }
  return s;
}

namespace {

std::uint64_t position_stride(const DeviceTensor& t) noexcept {
  return t.host_page_stride == 0 ? t.page_bytes : t.host_page_stride;
}

// [offset, end) of an explicit section: positions 0..bpc-1, the last one page_bytes long.
// Callers have checked that it does not overflow (validate()).
std::uint64_t section_end(const DeviceTensor& t, std::uint32_t bpc) noexcept {
  return t.host_offset + (std::uint64_t{bpc} - 1) * position_stride(t) + t.page_bytes;
}

bool overlap(const DeviceTensor& a, const DeviceTensor& b, std::uint32_t bpc) noexcept {
  return a.host_offset < section_end(b, bpc) && b.host_offset < section_end(a, bpc);
}

}  // namespace

bool KvLayout::explicit_sections() const noexcept {
  return !groups.empty() && !groups.front().tensors.empty() &&
         groups.front().tensors.front().host_offset != DeviceTensor::kPacked;
}

std::uint64_t KvLayout::chunk_payload_bytes() const noexcept {
  std::uint64_t sum = 0;
  for (const KvGroup& g : groups) {
    for (const DeviceTensor& t : g.tensors) {
      sum = explicit_sections() ? std::max(sum, section_end(t, blocks_per_chunk))
                                : sum + t.page_bytes * blocks_per_chunk;
    }
  }
  return sum;
}

bool KvLayout::groups_share_sections() const noexcept {
  if (!explicit_sections()) return false;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t h = g + 1; h < groups.size(); ++h) {
      for (const DeviceTensor& a : groups[g].tensors) {
        for (const DeviceTensor& b : groups[h].tensors) {
          if (overlap(a, b, blocks_per_chunk)) return true;
        }
      }
    }
  }
  return false;
}

void KvLayout::validate() const {
  if (groups.empty()) throw_invalid("kv layout: no KV groups");
  if (blocks_per_chunk == 0) throw_invalid("kv layout: blocks_per_chunk must be > 0");
  if (host.base == nullptr) throw_invalid("kv layout: host slots have no buffer");
  std::uint64_t page_sum = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].tensors.empty())
      throw_invalid("kv layout: group " + std::to_string(g) + " has no tensors");
    for (std::size_t t = 0; t < groups[g].tensors.size(); ++t) {
      const DeviceTensor& d = groups[g].tensors[t];
      const std::string w = where(g, t);
      if (d.base == 0) throw_invalid("kv layout: " + w + " has a null base pointer");
      if (d.num_blocks == 0) throw_invalid("kv layout: " + w + " has num_blocks 0");
      if (d.page_bytes == 0) throw_invalid("kv layout: " + w + " has page_bytes 0");
      const std::uint64_t stride = d.block_stride == 0 ? d.page_bytes : d.block_stride;
      if (stride < d.page_bytes) {
        throw_invalid("kv layout: " + w + " has block_stride " + std::to_string(stride) +
                      " < page_bytes " + std::to_string(d.page_bytes) + " (blocks would overlap)");
      }
      if (mul_overflows(d.num_blocks - 1, stride) ||
          (d.num_blocks - 1) * stride > kMax - d.page_bytes ||
          d.base > kMax - ((d.num_blocks - 1) * stride + d.page_bytes)) {
        throw_invalid("kv layout: " + w + " extent overflows the address space");
      }
      if (page_sum > kMax - d.page_bytes) throw_invalid("kv layout: sum of page_bytes overflows");
      page_sum += d.page_bytes;
      if ((d.host_offset != DeviceTensor::kPacked) != explicit_sections()) {
        throw_invalid("kv layout: " + w +
                      (explicit_sections() ? " is packed (host_offset unset)"
                                           : " has host_offset " + std::to_string(d.host_offset)) +
                      " but group 0 tensor 0 is " + (explicit_sections() ? "not" : "packed") +
                      ": give every tensor a host_offset or none");
      }
      if (explicit_sections()) {
        const std::uint64_t ps = position_stride(d);
        if (ps < d.page_bytes) {
          throw_invalid("kv layout: " + w + " has host_page_stride " + std::to_string(ps) +
                        " < page_bytes " + std::to_string(d.page_bytes) +
                        " (positions would overlap)");
        }
        if (mul_overflows(blocks_per_chunk - 1, ps) ||
            (blocks_per_chunk - 1) * ps > kMax - d.page_bytes ||
            d.host_offset > kMax - ((blocks_per_chunk - 1) * ps + d.page_bytes)) {
          throw_invalid("kv layout: " + w + " section overflows");
        }
        if (section_end(d, blocks_per_chunk) > host.slot_bytes) {
          throw_invalid("kv layout: " + w + " section [" + std::to_string(d.host_offset) + ", " +
                        std::to_string(section_end(d, blocks_per_chunk)) + ") (" +
                        std::to_string(blocks_per_chunk) + " positions " + std::to_string(ps) +
                        " bytes apart) does not fit the host slot of " +
                        std::to_string(host.slot_bytes) + " bytes");
        }
        for (std::size_t u = 0; u < t; ++u) {
          if (overlap(groups[g].tensors[u], d, blocks_per_chunk)) {
            throw_invalid("kv layout: " + w + " section overlaps the section of " + where(g, u) +
                          " (tensors of one group are copied into one chunk)");
          }
        }
      }
    }
  }
  if (!explicit_sections()) {
    if (mul_overflows(page_sum, blocks_per_chunk))
      throw_invalid("kv layout: blocks_per_chunk * page bytes overflows");
    const std::uint64_t need = page_sum * blocks_per_chunk;
    if (host.slot_bytes < need) {
      throw_invalid("kv layout: host slot of " + std::to_string(host.slot_bytes) +
                    " bytes is too small for " + std::to_string(blocks_per_chunk) +
                    " blocks per chunk x " + std::to_string(page_sum) +
                    " bytes per block (all tensors of all groups) = " + std::to_string(need) +
                    " bytes");
    }
  }
  if (host.num_chunks == 0 || host.row_stride == 0)
    throw_invalid("kv layout: host slots have no chunks");
  if (host.slot_offset + host.slot_bytes > host.row_stride) {
    throw_invalid("kv layout: host slot [" + std::to_string(host.slot_offset) + ", +" +
                  std::to_string(host.slot_bytes) + ") does not fit the row stride " +
                  std::to_string(host.row_stride));
  }
  if (mul_overflows(host.num_chunks, host.row_stride) ||
      host.num_chunks * host.row_stride > host.buffer_bytes) {
    throw_invalid("kv layout: " + std::to_string(host.num_chunks) + " chunks of " +
                  std::to_string(host.row_stride) + " bytes exceed the host buffer of " +
                  std::to_string(host.buffer_bytes) + " bytes");
  }
}

}  // namespace kvoffload
