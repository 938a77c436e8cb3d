// HostSlots of a Region: kept apart from kv_layout.cpp so the layout code has no link dependency
// on the region implementation.
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/region.hpp>

namespace kvoffload {

HostSlots HostSlots::from_region(const Region& region, std::uint32_t rank) {
  const RegionGeometry& g = region.geometry();
  HostSlots s;
  s.base = region.data();
  s.buffer_bytes = g.data_bytes();
  s.num_chunks = g.num_chunks();
  s.row_stride = g.row_stride();
  s.slot_offset = g.slot_offset(0, rank);  // validates rank; replicated: slot 0 for every rank
  s.slot_bytes = g.slot_bytes();
  return s;
}

}  // namespace kvoffload
