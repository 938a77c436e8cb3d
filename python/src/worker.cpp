// kvoffload.OffloadWorker: one rank assembled by the library (Note [Rank assembly] in
// core/src/stack/offload_worker.cpp), so a Python engine gets progressive bring-up with each
// piece registered as it comes up, and the safe teardown order, without building it by hand.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <kvoffload/error.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/region.hpp>

#include "bindings.hpp"
#include "engine_holder.hpp"

namespace py = pybind11;

namespace kvoffload::python {
namespace {

// The worker, shared: worker.engine holds an aliasing pointer into it, so close() can tell
// whether that engine is still referenced.
struct PyWorker {
  std::shared_ptr<OffloadWorker> worker;

  OffloadWorker& open() const {
    if (!worker) throw Error(ErrorCode::kState, "the OffloadWorker is closed");
    return *worker;
  }
};

py::dict bringup_dict(const BringupStatus& b) {
  py::dict d;
  d["state"] = std::string(to_string(b.state));
  d["ready_chunks"] = b.ready_chunks;
  d["num_chunks"] = b.num_chunks;
  d["seconds"] = b.seconds;
  d["failed_chunk"] = b.failed_chunk;
  d["error"] = b.error ? py::object(py::str(b.error->what())) : py::object(py::none());
  return d;
}

// Bytes of the worker's region (a slot), kept mapped by the shared reference to the worker:
// close() refuses while one is alive, as it does while the engine is referenced.
struct WorkerBytes {
  std::shared_ptr<OffloadWorker> owner;
  std::span<std::byte> bytes;
};

}  // namespace

void bind_worker(py::module_& m) {
  py::class_<WorkerBytes>(m, "WorkerBytes", py::buffer_protocol(),
                          "Writable bytes of an OffloadWorker's region (numpy.asarray views them)")
      .def_buffer([](WorkerBytes& b) {
        return py::buffer_info(reinterpret_cast<std::uint8_t*>(b.bytes.data()),
                               static_cast<py::ssize_t>(b.bytes.size()), false);
      })
      .def("__len__", [](const WorkerBytes& b) { return b.bytes.size(); });

  py::class_<PyWorker>(m, "OffloadWorker", R"(One rank of an engine, assembled by the library.

OffloadWorker(engine_id=..., num_chunks=..., slot_bytes=..., world_size=..., rank=..., groups=...,
blocks_per_chunk=..., backend='auto', devices=[], bringup='blocking', ...): probes the backend,
makes the runtime on the rank's device (devices[rank % len(devices)], else rank % device count),
joins (or creates) the region for `rank` and brings its slots up: 'blocking' returns with the pool
registered; 'background' returns once the region is mapped and registers each piece as it comes
up (a 64 MiB first piece, doubling up to bringup_piece_bytes) while the rank serves. `engine` is
the TransferEngine over `groups` (the engine's device tensors, as for TransferEngine). close()
drains the engine, unregisters every piece before the region unmaps, and releases the runtime
last.)")
      .def(py::init([](const std::string& engine_id, std::uint64_t num_chunks,
                       std::uint64_t slot_bytes, std::uint32_t world_size, std::uint32_t rank,
                       py::handle groups, std::uint32_t blocks_per_chunk,
                       const std::string& backend, const std::vector<int>& devices, bool replicated,
                       std::uint64_t slot_align, std::optional<std::filesystem::path> shm_dir,
                       double join_timeout, unsigned populate_threads, const std::string& bringup,
                       std::uint64_t bringup_piece_bytes, std::uint64_t bringup_first_piece_bytes,
                       bool allow_kernel, bool job_timing) {
             if (!(join_timeout >= 0.0)) {
               throw Error(ErrorCode::kInvalidArgument, "join_timeout must be >= 0 seconds, got " +
                                                            std::to_string(join_timeout));
             }
             WorkerConfig c;
             c.region.engine_id = engine_id;
             c.region.layout =
                 RegionLayout{num_chunks, slot_bytes, world_size, replicated, slot_align};
             c.region.rank = rank;
             if (shm_dir) c.region.shm_dir = *shm_dir;
             c.region.join_timeout =
                 std::chrono::milliseconds(static_cast<std::int64_t>(join_timeout * 1000.0));
             c.region.populate_threads = populate_threads;
             c.region.bringup = parse_bringup_mode(bringup);
             c.region.bringup_piece_bytes = bringup_piece_bytes;
             c.region.bringup_first_piece_bytes = bringup_first_piece_bytes;
             c.backend = backend;
             c.devices = devices;
             c.groups = groups_from_py(groups);
             c.blocks_per_chunk = blocks_per_chunk;
             c.engine.allow_kernel = allow_kernel;
             c.engine.job_timing = job_timing;
             // A joiner may wait for the creator; a blocking bring-up populates the whole pool.
             py::gil_scoped_release release;
             return PyWorker{std::shared_ptr<OffloadWorker>(OffloadWorker::build(c))};
           }),
           py::kw_only(), py::arg("engine_id"), py::arg("num_chunks"), py::arg("slot_bytes"),
           py::arg("world_size"), py::arg("rank"), py::arg("groups"), py::arg("blocks_per_chunk"),
           py::arg("backend") = "auto", py::arg("devices") = std::vector<int>{},
           py::arg("replicated") = false, py::arg("slot_align") = kDefaultSlotAlign,
           py::arg("shm_dir") = py::none(), py::arg("join_timeout") = 30.0,
           py::arg("populate_threads") = 1, py::arg("bringup") = "blocking",
           py::arg("bringup_piece_bytes") = kDefaultBringupPieceBytes,
           py::arg("bringup_first_piece_bytes") = kDefaultBringupFirstPieceBytes,
           py::arg("allow_kernel") = true, py::arg("job_timing") = true)
      .def_property_readonly(
          "engine",
          [](const PyWorker& w) {
            OffloadWorker& ow = w.open();
            PyEngine e;
            e.engine = std::shared_ptr<TransferEngine>(w.worker, &ow.engine());
            return e;
          },
          "The rank's TransferEngine (submit, poll, wait); it keeps the worker alive")
      .def_property_readonly("device", [](const PyWorker& w) { return w.open().device(); })
      .def_property_readonly(
          "backend", [](const PyWorker& w) { return std::string(w.open().runtime().name()); })
      .def_property_readonly("region_path",
                             [](const PyWorker& w) { return w.open().region().path(); })
      .def_property_readonly("geometry",
                             [](const PyWorker& w) { return w.open().region().geometry(); })
      .def_property_readonly("rank", [](const PyWorker& w) { return w.open().region().rank(); })
      .def(
          "slot",
          [](const PyWorker& w, std::uint64_t chunk, std::optional<std::uint32_t> rank) {
            const Region& r = w.open().region();
            return WorkerBytes{w.worker, rank ? r.slot(chunk, *rank) : r.slot(chunk)};
          },
          py::arg("chunk"), py::arg("rank") = py::none(),
          "Rank `rank`'s slot of `chunk` (default: this rank's), a writable buffer that keeps "
          "the worker open; meaningful only below bringup_status()['ready_chunks']")
      .def(
          "bringup_status",
          [](const PyWorker& w) { return bringup_dict(w.open().region().bringup_status()); },
          "This rank's bring-up: state, ready_chunks, num_chunks, seconds, failed_chunk, error")
      .def(
          "wait_bringup",
          [](const PyWorker& w) {
            const Region& r = w.open().region();
            py::gil_scoped_release release;
            r.wait_bringup();
          },
          "Blocks until the bring-up is no longer running; raises its error when it failed")
      .def(
          "chunks_ready_on_all_ranks",
          [](const PyWorker& w) { return w.open().region().chunks_ready_on_all_ranks(); },
          "Rows ready on every rank (never blocks)")
      .def(
          "registration",
          [](const PyWorker& w) {
            const WorkerRegistration r = w.open().registration();
            py::dict d;
            d["pieces"] = r.pieces;
            d["bytes"] = r.bytes;
            d["seconds"] = r.seconds;
            d["longest_piece_seconds"] = r.longest_piece_seconds;
            return d;
          },
          "The pieces registered so far: pieces, bytes (this rank's registered bytes), seconds")
      .def(
          "close",
          [](PyWorker& w) {
            if (!w.worker) return true;
            if (w.worker.use_count() > 1) {
              throw Error(ErrorCode::kState,
                          "cannot close the OffloadWorker: its engine is still referenced "
                          "(drop every worker.engine object and worker.slot() buffer first)");
            }
            std::shared_ptr<OffloadWorker> ow = std::move(w.worker);
            py::gil_scoped_release release;
            return ow->close();
          },
          "Engine drains, pieces unregister, region unmaps, runtime last (idempotent). False when "
          "a teardown step failed (logged)")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyWorker& w, const py::args&) {
        if (w.worker && w.worker.use_count() == 1) {
          std::shared_ptr<OffloadWorker> ow = std::move(w.worker);
          py::gil_scoped_release release;
          ow->close();
        }
        return false;
      });
}

}  // namespace kvoffload::python
