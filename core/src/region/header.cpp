#include "region/header.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/hash.hpp>

#include "live/live_page.hpp"
#include "sys/sys.hpp"

namespace kvoffload::detail {

namespace {
std::uint64_t round_up_to_page(std::uint64_t bytes, std::size_t page_size) noexcept {
  const std::uint64_t page = page_size;
  return (bytes + page - 1) / page * page;
}
}  // namespace

std::uint64_t owners_offset_for(std::uint32_t world_size) noexcept {
  return kReadinessOffset + std::uint64_t{world_size} * sizeof(RankReadiness);
}

std::uint64_t stats_offset_for(std::size_t page_size, std::uint32_t world_size) noexcept {
  return round_up_to_page(
      owners_offset_for(world_size) + (std::uint64_t{world_size} + 1) * sizeof(OwnerRecord),
      page_size);
}

std::uint64_t stats_bytes_for(std::size_t page_size, std::uint32_t world_size) noexcept {
  return round_up_to_page(live_bytes(world_size), page_size);
}

std::uint64_t data_offset_for(std::size_t page_size, std::uint32_t world_size) noexcept {
  return stats_offset_for(page_size, world_size) + stats_bytes_for(page_size, world_size);
}

RegionHeader make_header(const RegionGeometry& g, std::string_view engine_id) {
  RegionHeader h{};
  std::memcpy(h.magic, kRegionMagic, sizeof h.magic);
  h.version = kRegionVersion;
  h.state = static_cast<std::uint32_t>(RegionState::kCreating);
  h.data_offset = data_offset_for(g.page_size(), g.world_size());
  h.num_chunks = g.num_chunks();
  h.slot_bytes = g.slot_bytes();
  h.world_size = g.world_size();
  h.replicated = g.replicated() ? 1U : 0U;
  h.row_stride = g.row_stride();
  h.data_bytes = g.data_bytes();
  h.page_size = g.page_size();
  h.slot_align = g.slot_align();
  h.slot_stride = g.slot_stride();
  h.readiness_offset = kReadinessOffset;
  h.owners_offset = owners_offset_for(g.world_size());
  h.stats_offset = stats_offset_for(g.page_size(), g.world_size());
  h.stats_bytes = stats_bytes_for(g.page_size(), g.world_size());
  const std::size_t n = std::min(engine_id.size(), sizeof h.engine_id - 1);
  std::memcpy(h.engine_id, engine_id.data(), n);
  h.checksum = header_checksum(h);
  return h;
}

std::uint64_t header_checksum(const RegionHeader& header) noexcept {
  RegionHeader fixed = header;
  fixed.state = 0;
  fixed.checksum = 0;
  return hash_bytes_128(&fixed, sizeof fixed).lo;
}

std::optional<std::uint32_t> old_format_version(const RegionHeader& h,
                                                std::uint64_t file_bytes) noexcept {
  if (std::memcmp(h.magic, kRegionMagic, sizeof h.magic) != 0 || h.version == 0 ||
      h.version >= kRegionVersion) {
    return std::nullopt;
  }
  const std::uint64_t page = h.page_size;
  if (page < 4096 || (page & (page - 1)) != 0 || h.data_offset == 0 || h.data_offset % page != 0 ||
      h.num_chunks == 0 || h.row_stride == 0 ||
      h.num_chunks > std::numeric_limits<std::uint64_t>::max() / h.row_stride ||
      h.data_bytes != h.num_chunks * h.row_stride ||
      h.data_bytes > std::numeric_limits<std::uint64_t>::max() - h.data_offset ||
      file_bytes != h.data_offset + h.data_bytes) {
    return std::nullopt;
  }
  return h.version;
}

std::string header_problem(const RegionHeader& h, std::uint64_t file_bytes) {
  const auto layout = header_layout(h);
  if (!layout) {
    if (const auto old = old_format_version(h, file_bytes)) {
      return "a region of format " + std::to_string(*old) + ", left by an older kvoffload (this " +
             "one writes format " + std::to_string(kRegionVersion) +
             "); not a region of this format: `region clean` removes it once nothing holds it";
    }
    return "no region header (bad magic or version); not a region file";
  }
  if (h.checksum != header_checksum(h)) {
    return "corrupt header (its checksum does not match its fields: changed after creation); "
           "not a region file";
  }
  std::optional<RegionGeometry> g;
  try {
    g = RegionGeometry::compute(*layout, static_cast<std::size_t>(h.page_size));
  } catch (const Error& e) {
    return std::string("corrupt header (") + e.what() + "); not a region file";
  }
  if (h.row_stride != g->row_stride() || h.data_bytes != g->data_bytes() ||
      h.slot_stride != g->slot_stride() ||
      h.data_offset != data_offset_for(g->page_size(), g->world_size()) ||
      h.readiness_offset != kReadinessOffset ||
      h.owners_offset != owners_offset_for(g->world_size()) ||
      h.stats_offset != stats_offset_for(g->page_size(), g->world_size()) ||
      h.stats_bytes != stats_bytes_for(g->page_size(), g->world_size())) {
    return "corrupt header (its offsets and strides disagree with its geometry); not a region "
           "file";
  }
  const std::uint64_t needed = h.data_offset + h.data_bytes;
  if (file_bytes != needed) {
    return "the file is " + std::to_string(file_bytes) + " bytes but its header's geometry (" +
           std::to_string(h.num_chunks) + " chunks, world_size " + std::to_string(h.world_size) +
           ") needs " + std::to_string(needed) + "; not a region file";
  }
  return {};
}

std::optional<RegionLayout> header_layout(const RegionHeader& h) noexcept {
  if (std::memcmp(h.magic, kRegionMagic, sizeof h.magic) != 0 || h.version != kRegionVersion) {
    return std::nullopt;
  }
  return RegionLayout{.num_chunks = h.num_chunks,
                      .slot_bytes = h.slot_bytes,
                      .world_size = h.world_size,
                      .replicated = h.replicated != 0,
                      .slot_align = h.slot_align};
}

namespace {

void pwrite_all(const Syscalls& sys, int fd, const void* buf, std::size_t len, off_t off,
                const std::string& what) {
  const auto* p = static_cast<const std::byte*>(buf);
  while (len > 0) {
    const ssize_t n = retry_eintr([&] { return sys.pwrite(sys.context, fd, p, len, off); });
    if (n < 0) throw_system_error("pwrite", errno, what);
    if (n == 0) throw_system_error("pwrite", EIO, what + " (wrote 0 bytes)");
    p += n;
    len -= static_cast<std::size_t>(n);
    off += n;
  }
}

// Reads exactly `len` bytes at `off`; false when the file ends first.
bool pread_all(const Syscalls& sys, int fd, void* buf, std::size_t len, off_t off,
               const std::string& what) {
  auto* p = static_cast<std::byte*>(buf);
  std::size_t got = 0;
  while (got < len) {
    const ssize_t n = retry_eintr([&] {
      return sys.pread(sys.context, fd, p + got, len - got, off + static_cast<off_t>(got));
    });
    if (n < 0) throw_system_error("pread", errno, what);
    if (n == 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

bool read_header(const Syscalls& sys, int fd, RegionHeader& out, const std::string& path) {
  return pread_all(sys, fd, &out, sizeof out, 0, "of the header of " + path);
}

void write_header(const Syscalls& sys, int fd, const RegionHeader& header,
                  const std::string& path) {
  // The whole area before the data, so the readiness table and the live statistics area are
  // allocated (and zero) from the start: a reader mapping them never faults on a hole.
  std::vector<std::byte> area(static_cast<std::size_t>(header.data_offset));
  std::memcpy(area.data(), &header, sizeof header);
  format_live_page(std::span(area).subspan(static_cast<std::size_t>(header.stats_offset),
                                           static_cast<std::size_t>(header.stats_bytes)),
                   header.world_size);
  pwrite_all(sys, fd, area.data(), area.size(), 0, "of the header of " + path);
}

void write_state(const Syscalls& sys, int fd, RegionState state, const std::string& path) {
  const auto value = static_cast<std::uint32_t>(state);
  pwrite_all(sys, fd, &value, sizeof value, offsetof(RegionHeader, state),
             "of the state of " + path);
}

void write_owner(const Syscalls& sys, int fd, std::uint64_t offset, const OwnerRecord& record,
                 const std::string& path) {
  pwrite_all(sys, fd, &record, sizeof record, static_cast<off_t>(offset),
             "of the owner table of " + path);
}

OwnerRecord read_owner(const Syscalls& sys, int fd, std::uint64_t offset, const std::string& path) {
  OwnerRecord record{};
  if (!pread_all(sys, fd, &record, sizeof record, static_cast<off_t>(offset),
                 "of the owner table of " + path)) {
    return OwnerRecord{};
  }
  return record;
}

}  // namespace kvoffload::detail
