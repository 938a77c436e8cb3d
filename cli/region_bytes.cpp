// `region create --fill / --check` over a mapped region (see region_bytes.hpp).
#include "region_bytes.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include <kvoffload/error.hpp>

namespace kvoffload::cli {

std::string hex_byte(unsigned value) {
  char buf[8];
  (void)std::snprintf(buf, sizeof(buf), "0x%02x", value & 0xffU);
  return buf;
}

namespace {

// The byte ranges one chunk contributes to --fill / --check for this mapper.
std::vector<std::span<std::byte>> chunk_spans(const Region& region, std::uint64_t chunk,
                                              bool whole_rows) {
  if (region.rank()) return {region.slot(chunk)};
  if (whole_rows) return {region.row(chunk)};
  // Unranked check: every copy's slot; the padding at the end of a row is nobody's to write.
  std::vector<std::span<std::byte>> spans;
  const std::uint32_t copies = region.geometry().copies();
  spans.reserve(copies);
  for (std::uint32_t copy = 0; copy < copies; ++copy) spans.push_back(region.slot(chunk, copy));
  return spans;
}

// Runs fn(begin_chunk, end_chunk, worker) over `threads` contiguous chunk ranges.
template <class Fn>
void for_chunk_ranges(std::uint64_t chunks, unsigned threads, Fn fn) {
  const std::uint64_t workers =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(threads, chunks));
  if (workers == 1) {
    fn(std::uint64_t{0}, chunks, 0U);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers);
  for (std::uint64_t w = 0; w < workers; ++w) {
    const std::uint64_t begin = chunks * w / workers;
    const std::uint64_t end = chunks * (w + 1) / workers;
    pool.emplace_back([&fn, begin, end, w] { fn(begin, end, static_cast<unsigned>(w)); });
  }
  for (auto& t : pool) t.join();
}

struct Mismatch {
  std::uint64_t chunk = 0;
  std::uint32_t copy = 0;         // slot index within the row (the rank, or 0 when replicated)
  std::uint64_t offset = 0;       // byte offset within that slot
  std::uint64_t data_offset = 0;  // byte offset from the start of the region data
  unsigned found = 0;
};

// First byte of `span` that differs from `value`, by memcmp against a block of the expected byte
// (fast) and a byte scan only inside the block that differs.
std::optional<std::uint64_t> first_difference(std::span<const std::byte> span,
                                              const std::vector<std::byte>& reference) {
  for (std::uint64_t pos = 0; pos < span.size(); pos += reference.size()) {
    const std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>(reference.size(), span.size() - pos));
    if (std::memcmp(span.data() + pos, reference.data(), n) == 0) continue;
    for (std::size_t i = 0; i < n; ++i) {
      if (span[pos + i] != reference[0]) return pos + i;
    }
  }
  return std::nullopt;
}

}  // namespace

std::uint64_t fill_region(const Region& region, std::uint8_t value, unsigned threads) {
  std::vector<std::uint64_t> written(threads, 0);
  for_chunk_ranges(region.geometry().num_chunks(), threads,
                   [&](std::uint64_t begin, std::uint64_t end, unsigned worker) {
                     for (std::uint64_t c = begin; c < end; ++c) {
                       for (auto span : chunk_spans(region, c, /*whole_rows=*/true)) {
                         std::memset(span.data(), value, span.size());
                         written[worker] += span.size();
                       }
                     }
                   });
  std::uint64_t total = 0;
  for (auto w : written) total += w;
  return total;
}

// Verifies the bytes; returns the number checked or throws kMismatch naming the first difference.
std::uint64_t check_region(const Region& region, std::uint8_t value, unsigned threads) {
  std::vector<std::optional<Mismatch>> first(threads);
  std::vector<std::uint64_t> checked(threads, 0);
  const std::vector<std::byte> reference(std::size_t{64} << 10, std::byte{value});
  const RegionGeometry& geo = region.geometry();
  for_chunk_ranges(
      geo.num_chunks(), threads, [&](std::uint64_t begin, std::uint64_t end, unsigned worker) {
        for (std::uint64_t c = begin; c < end; ++c) {
          const auto spans = chunk_spans(region, c, /*whole_rows=*/false);
          for (std::size_t s = 0; s < spans.size(); ++s) {
            if (auto pos = first_difference(spans[s], reference)) {
              Mismatch m;
              m.chunk = c;
              m.copy =
                  region.rank() ? geo.copy_index(*region.rank()) : static_cast<std::uint32_t>(s);
              m.offset = *pos;
              m.data_offset = static_cast<std::uint64_t>(spans[s].data() - region.data()) + *pos;
              m.found = static_cast<unsigned>(spans[s][*pos]);
              first[worker] = m;
              return;  // ranges are in chunk order: this worker's first is enough
            }
            checked[worker] += spans[s].size();
          }
        }
      });
  std::optional<Mismatch> earliest;
  std::uint64_t total = 0;
  for (unsigned w = 0; w < threads; ++w) {
    total += checked[w];
    if (first[w] && (!earliest || first[w]->data_offset < earliest->data_offset))
      earliest = first[w];
  }
  if (earliest) {
    throw Error(ErrorCode::kMismatch,
                "check of " + region.path().string() + " failed: chunk " +
                    std::to_string(earliest->chunk) + ", slot " + std::to_string(earliest->copy) +
                    ", byte offset " + std::to_string(earliest->offset) + " (data offset " +
                    std::to_string(earliest->data_offset) + ") holds " + hex_byte(earliest->found) +
                    ", expected " + hex_byte(value) +
                    ". The process that fills the region may not have written it yet, or wrote "
                    "another value.");
  }
  return total;
}

}  // namespace kvoffload::cli
