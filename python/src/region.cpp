// kvoffload.Region and kvoffload.HostBuffer.
//
// Note [Views keep the region mapped]
// Region.slot()/row()/data() return a HostBuffer exporting the mapped memory through the buffer
// protocol, so numpy.asarray(region.slot(c)) is a zero-copy view. A HostBuffer holds a shared
// reference to the region, and numpy's array holds the HostBuffer (through the memoryview it
// took), so the mapping outlives every view even when the Region object is dropped first; the
// region is detached when its last holder goes. An explicit Region.close() while views exist would
// leave them pointing at unmapped memory (a segfault on access), so it is refused with
// ErrorCode.STATE naming how many views are alive.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "bindings.hpp"
#include "region_holder.hpp"

namespace py = pybind11;

namespace kvoffload::python {
namespace {

const Region& open_region(const RegionHolder& h) {
  if (!h.region.is_open()) throw Error(ErrorCode::kState, "the region is closed");
  return h.region;
}

HostBuffer make_buffer(const std::shared_ptr<RegionHolder>& h, std::span<std::byte> span) {
  return HostBuffer(h, span.data(), span.size());
}

}  // namespace

void bind_region(py::module_& m) {
  py::class_<HostBuffer>(m, "HostBuffer", py::buffer_protocol(),
                         "Writable bytes of the shared region (buffer protocol, zero-copy); "
                         "keeps the region mapped while it exists")
      .def_buffer([](HostBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1}, /*readonly=*/false);
      })
      .def_property_readonly(
          "address", [](const HostBuffer& b) { return reinterpret_cast<std::uintptr_t>(b.data()); },
          "Address of the first byte, as an int")
      .def_property_readonly("nbytes", &HostBuffer::size)
      .def("__len__", &HostBuffer::size)
      .def("__repr__", [](const HostBuffer& b) {
        return "<kvoffload.HostBuffer address=0x" +
               py::str("{:x}")
                   .format(reinterpret_cast<std::uintptr_t>(b.data()))
                   .cast<std::string>() +
               " nbytes=" + std::to_string(b.size()) + ">";
      });

  py::class_<RegionGeometry>(m, "RegionGeometry")
      .def_property_readonly("num_chunks", &RegionGeometry::num_chunks)
      .def_property_readonly("slot_bytes", &RegionGeometry::slot_bytes)
      .def_property_readonly("world_size", &RegionGeometry::world_size)
      .def_property_readonly("replicated", &RegionGeometry::replicated)
      .def_property_readonly("slot_align", &RegionGeometry::slot_align)
      .def_property_readonly("slot_stride", &RegionGeometry::slot_stride)
      .def_property_readonly("copies", &RegionGeometry::copies)
      .def_property_readonly("row_stride", &RegionGeometry::row_stride)
      .def_property_readonly("data_bytes", &RegionGeometry::data_bytes)
      .def_property_readonly("page_size", &RegionGeometry::page_size)
      .def("slot_offset", &RegionGeometry::slot_offset, py::arg("chunk"), py::arg("rank"))
      .def("__eq__", [](const RegionGeometry& a, const RegionGeometry& b) { return a == b; })
      .def("__repr__", [](const RegionGeometry& g) {
        return "RegionGeometry(num_chunks=" + std::to_string(g.num_chunks()) +
               ", slot_bytes=" + std::to_string(g.slot_bytes()) +
               ", world_size=" + std::to_string(g.world_size()) +
               ", replicated=" + (g.replicated() ? "True" : "False") +
               ", slot_align=" + std::to_string(g.slot_align()) +
               ", row_stride=" + std::to_string(g.row_stride()) +
               ", data_bytes=" + std::to_string(g.data_bytes()) + ")";
      });
  m.def(
      "compute_geometry",
      [](std::uint64_t num_chunks, std::uint64_t slot_bytes, std::uint32_t world_size,
         bool replicated, std::size_t page_size, std::uint64_t slot_align) {
        return RegionGeometry::compute(
            RegionLayout{num_chunks, slot_bytes, world_size, replicated, slot_align}, page_size);
      },
      py::arg("num_chunks"), py::arg("slot_bytes"), py::arg("world_size") = 1,
      py::arg("replicated") = false, py::arg("page_size") = 4096,
      py::arg("slot_align") = kDefaultSlotAlign,
      "The geometry a region of this layout has (no region is created)");

  py::class_<PopulateReport>(m, "PopulateReport")
      .def_property_readonly(
          "method", [](const PopulateReport& p) { return std::string(to_string(p.method)); })
      .def_readonly("bytes", &PopulateReport::bytes)
      .def_readonly("seconds", &PopulateReport::seconds);

  py::class_<RegionHolder, std::shared_ptr<RegionHolder>>(m, "Region", R"(The shared host region.

Create or join with Region.create_or_join(...); slot()/row()/data() return HostBuffers that numpy
views without copying. Use as a context manager, or call close(); dropping the last reference also
detaches.)")
      .def_static(
          "create_or_join",
          [](const std::string& engine_id, std::uint64_t num_chunks, std::uint64_t slot_bytes,
             std::uint32_t world_size, std::optional<std::uint32_t> rank, bool replicated,
             std::optional<std::filesystem::path> shm_dir, double join_timeout,
             unsigned populate_threads, bool populate, std::uint64_t slot_align,
             const std::string& bringup) {
            if (!(join_timeout >= 0.0)) {
              throw Error(ErrorCode::kInvalidArgument,
                          "join_timeout must be >= 0 seconds, got " + std::to_string(join_timeout));
            }
            RegionOptions opts;
            opts.engine_id = engine_id;
            opts.layout = RegionLayout{num_chunks, slot_bytes, world_size, replicated, slot_align};
            opts.rank = rank;
            if (shm_dir) opts.shm_dir = *shm_dir;
            opts.join_timeout =
                std::chrono::milliseconds(static_cast<std::int64_t>(join_timeout * 1000.0));
            opts.populate_threads = populate_threads;
            opts.populate = populate;
            opts.bringup = parse_bringup_mode(bringup);
            // A joiner may wait for the creator (another thread of this process, perhaps).
            py::gil_scoped_release release;
            return std::make_shared<RegionHolder>(Region::create_or_join(opts));
          },
          py::kw_only(), py::arg("engine_id"), py::arg("num_chunks"), py::arg("slot_bytes"),
          py::arg("world_size") = 1, py::arg("rank") = py::none(), py::arg("replicated") = false,
          py::arg("shm_dir") = py::none(), py::arg("join_timeout") = 30.0,
          py::arg("populate_threads") = 1, py::arg("populate") = true,
          py::arg("slot_align") = kDefaultSlotAlign, py::arg("bringup") = "blocking",
          "Creates the region, or joins it when another process created it, and takes this "
          "mapper's role: rank `rank`, or with rank=None the scheduler role (the unranked mapper). "
          "One live holder per role: a second one raises kvoffload.Error with code IN_USE, naming "
          "the holder's PID. join_timeout in seconds. bringup='background' returns once the "
          "region is mapped (an unranked mapper then populates nothing and uses only the rows "
          "every rank made ready: chunks_ready_on_all_ranks()).")
      .def(
          "chunks_ready_on_all_ranks",
          [](const RegionHolder& h) { return open_region(h).chunks_ready_on_all_ranks(); },
          "Rows every rank has brought up (the region header's ready prefixes; never blocks)")
      .def_property_readonly("geometry",
                             [](const RegionHolder& h) { return open_region(h).geometry(); })
      .def_property_readonly(
          "role",
          [](const RegionHolder& h) { return std::string(to_string(open_region(h).role())); },
          "'creator' or 'joiner'")
      .def_property_readonly("path", [](const RegionHolder& h) { return open_region(h).path(); })
      .def_property_readonly("engine_id",
                             [](const RegionHolder& h) { return open_region(h).engine_id(); })
      .def_property_readonly("rank", [](const RegionHolder& h) { return open_region(h).rank(); })
      .def_property_readonly("populate_report",
                             [](const RegionHolder& h) { return open_region(h).populate_report(); })
      .def_property_readonly("is_open", [](const RegionHolder& h) { return h.region.is_open(); })
      .def_property_readonly(
          "live_views", [](const RegionHolder& h) { return h.live_views.load(); },
          "HostBuffers (and the arrays viewing them) still alive")
      .def(
          "slot",
          [](const std::shared_ptr<RegionHolder>& h, std::uint64_t chunk,
             std::optional<std::uint32_t> rank) {
            const Region& r = open_region(*h);
            return make_buffer(h, rank ? r.slot(chunk, *rank) : r.slot(chunk));
          },
          py::arg("chunk"), py::arg("rank") = py::none(),
          "Rank `rank`'s slot of `chunk` (default: this mapper's own rank)")
      .def(
          "slot_address",
          [](const RegionHolder& h, std::uint64_t chunk, std::optional<std::uint32_t> rank) {
            const Region& r = open_region(h);
            return reinterpret_cast<std::uintptr_t>(
                (rank ? r.slot(chunk, *rank) : r.slot(chunk)).data());
          },
          py::arg("chunk"), py::arg("rank") = py::none(), "Address of the slot, as an int")
      .def(
          "row",
          [](const std::shared_ptr<RegionHolder>& h, std::uint64_t chunk) {
            return make_buffer(h, open_region(*h).row(chunk));
          },
          py::arg("chunk"), "The whole row of `chunk` (row_stride bytes)")
      .def(
          "data",
          [](const std::shared_ptr<RegionHolder>& h) {
            const Region& r = open_region(*h);
            return HostBuffer(h, r.data(), r.geometry().data_bytes());
          },
          "All of the region's data (data_bytes bytes)")
      .def_property_readonly("address",
                             [](const RegionHolder& h) {
                               return reinterpret_cast<std::uintptr_t>(open_region(h).data());
                             })
      .def("close", &RegionHolder::close,
           "Detaches (idempotent). Returns False when a teardown step failed (logged). Raises "
           "Error(STATE) while HostBuffers or arrays viewing them are alive.")
      .def("__enter__", [](const std::shared_ptr<RegionHolder>& h) { return h; })
      .def("__exit__",
           [](RegionHolder& h, const py::args&) {
             h.close();
             return false;
           })
      .def("__repr__", [](const RegionHolder& h) {
        if (!h.region.is_open()) return std::string("<kvoffload.Region closed>");
        return "<kvoffload.Region " + h.region.path().string() + " " +
               std::string(to_string(h.region.role())) + ">";
      });

  py::class_<RegionInfo>(m, "RegionInfo")
      .def_readonly("path", &RegionInfo::path)
      .def_readonly("engine_id", &RegionInfo::engine_id)
      .def_readonly("file_bytes", &RegionInfo::file_bytes)
      .def_readonly("attached", &RegionInfo::attached)
      .def_readonly("stale", &RegionInfo::stale)
      .def_readonly("complete", &RegionInfo::complete)
      .def_readonly("geometry", &RegionInfo::geometry)
      .def_readonly("problem", &RegionInfo::problem)
      .def_property_readonly(
          "owners",
          [](const RegionInfo& info) {
            // [(rank or None for the scheduler, pid)], ranks in order then the scheduler.
            py::list out;
            for (const RegionOwner& o : info.owners) {
              out.append(
                  py::make_tuple(o.rank ? py::object(py::int_(*o.rank)) : py::none(), o.pid));
            }
            return out;
          },
          "Roles held now: [(rank, pid)], rank None for the scheduler; pid 0 not yet recorded");
  // shm_dir=None: default_shm_dir() ($KVOFFLOAD_SHM_DIR, else /dev/shm), as everywhere else.
  m.def(
      "list_regions",
      [](const std::optional<std::filesystem::path>& shm_dir) {
        return list_regions(shm_dir ? *shm_dir : default_shm_dir());
      },
      py::arg("shm_dir") = py::none(),
      "Regions in shm_dir (default: $KVOFFLOAD_SHM_DIR, else /dev/shm), counted without taking "
      "any lock");
  m.def(
      "clean_regions",
      [](const std::optional<std::filesystem::path>& shm_dir,
         const std::optional<std::string>& engine_id) {
        auto result = clean_regions(shm_dir ? *shm_dir : default_shm_dir(), engine_id);
        return py::make_tuple(result.removed, result.kept);
      },
      py::arg("shm_dir") = py::none(), py::arg("engine_id") = py::none(),
      "Removes stale regions of shm_dir (default: $KVOFFLOAD_SHM_DIR, else /dev/shm); returns "
      "(removed, kept) lists of paths");
  m.def("region_path", &region_path, py::arg("shm_dir"), py::arg("engine_id"));
  m.def("default_shm_dir", &default_shm_dir);
}

}  // namespace kvoffload::python
