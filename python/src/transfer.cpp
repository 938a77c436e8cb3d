// kvoffload.TransferEngine, DeviceTensor, JobResult. Device addresses are ints, so an engine
// passes torch's tensor.data_ptr() (and stream.cuda_stream) straight in.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include <kvoffload/error.hpp>
#include <kvoffload/kv_layout.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "bindings.hpp"
#include "engine_holder.hpp"
#include "region_holder.hpp"
#include "stats_dict.hpp"

namespace py = pybind11;

namespace kvoffload::python {

StreamView stream_from_py(py::handle obj);
EventView event_from_py(py::handle obj);

namespace {

Direction direction_from_py(py::handle obj) {
  if (py::isinstance<Direction>(obj)) return obj.cast<Direction>();
  if (py::isinstance<py::str>(obj)) {
    const auto s = obj.cast<std::string>();
    if (s == "store") return Direction::kStore;
    if (s == "load") return Direction::kLoad;
    throw Error(ErrorCode::kInvalidArgument,
                "direction must be 'store' or 'load', got '" + s + "'");
  }
  throw Error(ErrorCode::kInvalidArgument,
              "direction must be 'store', 'load' or a kvoffload.Direction");
}

EngineOptions options_from_py(bool register_host, bool allow_kernel, bool calibrate,
                              bool job_timing) {
  EngineOptions o;
  o.job_timing = job_timing;
  o.register_host = register_host;
  o.allow_kernel = allow_kernel;
  o.calibrate = calibrate;
  return o;
}

}  // namespace

// A group is a sequence of DeviceTensor (or (base, num_blocks, page_bytes[, block_stride]) tuples).
std::vector<KvGroup> groups_from_py(py::handle groups) {
  std::vector<KvGroup> out;
  for (py::handle g : groups) {
    KvGroup group;
    for (py::handle t : g) {
      if (py::isinstance<DeviceTensor>(t)) {
        group.tensors.push_back(t.cast<DeviceTensor>());
        continue;
      }
      auto v = t.cast<std::vector<std::uint64_t>>();
      if (v.size() != 3 && v.size() != 4) {
        throw Error(
            ErrorCode::kInvalidArgument,
            "a device tensor is a DeviceTensor or (base, num_blocks, page_bytes[, block_stride]), "
            "got a sequence of " +
                std::to_string(v.size()));
      }
      group.tensors.push_back({v[0], v[1], v[2], v.size() == 4 ? v[3] : 0});
    }
    out.push_back(std::move(group));
  }
  return out;
}

void bind_transfer_engine(py::module_& m) {
  py::enum_<Direction>(m, "Direction")
      .value("STORE", Direction::kStore)
      .value("LOAD", Direction::kLoad);

  py::class_<DeviceTensor>(m, "DeviceTensor",
                           "One device KV tensor: num_blocks pages of page_bytes, block b at "
                           "base + b*block_stride. host_offset (None: packed after the previous "
                           "tensor) and host_page_stride place its section in a slot.")
      .def(py::init([](std::uint64_t base, std::uint64_t num_blocks, std::uint64_t page_bytes,
                       std::uint64_t block_stride, std::optional<std::uint64_t> host_offset,
                       std::uint64_t host_page_stride) {
             DeviceTensor t;
             t.base = base;
             t.num_blocks = num_blocks;
             t.page_bytes = page_bytes;
             t.block_stride = block_stride;
             t.host_offset = host_offset.value_or(DeviceTensor::kPacked);
             t.host_page_stride = host_page_stride;
             return t;
           }),
           py::arg("base"), py::arg("num_blocks"), py::arg("page_bytes"),
           py::arg("block_stride") = 0, py::kw_only(), py::arg("host_offset") = py::none(),
           py::arg("host_page_stride") = 0)
      .def_readwrite("base", &DeviceTensor::base)
      .def_readwrite("num_blocks", &DeviceTensor::num_blocks)
      .def_readwrite("page_bytes", &DeviceTensor::page_bytes)
      .def_readwrite("block_stride", &DeviceTensor::block_stride)
      .def_property_readonly("host_offset",
                             [](const DeviceTensor& t) -> std::optional<std::uint64_t> {
                               if (t.host_offset == DeviceTensor::kPacked) return std::nullopt;
                               return t.host_offset;
                             })
      .def_readonly("host_page_stride", &DeviceTensor::host_page_stride);

  py::class_<JobResult>(m, "JobResult")
      .def_property_readonly(
          "job_id", [](const JobResult& r) { return static_cast<std::uint64_t>(r.job_id); })
      .def_property_readonly("direction",
                             [](const JobResult& r) { return std::string(to_string(r.direction)); })
      .def_readonly("success", &JobResult::success)
      .def_readonly("bytes", &JobResult::bytes)
      .def_readonly("seconds", &JobResult::seconds)
      .def_readonly("error", &JobResult::error)
      .def("__repr__", [](const JobResult& r) {
        return "JobResult(job_id=" + std::to_string(static_cast<std::uint64_t>(r.job_id)) +
               ", direction='" + std::string(to_string(r.direction)) +
               "', success=" + (r.success ? "True" : "False") +
               ", bytes=" + std::to_string(r.bytes) +
               (r.error.empty() ? "" : ", error='" + r.error + "'") + ")";
      });

  py::class_<PyEngine>(m, "TransferEngine", R"(Moves KV blocks between device caches and host slots.

TransferEngine(runtime, region, rank, groups, blocks_per_chunk): this rank's slots of a Region.
TransferEngine.for_buffer(runtime, buffer, slot_bytes, groups, blocks_per_chunk, row_stride=0):
slots in any HostBuffer (or an int address with nbytes=...).
groups: a list of KV groups, each a list of DeviceTensor (or (base, num_blocks, page_bytes[,
block_stride]) tuples) with device addresses as ints.
job_timing=True: each result's seconds is its copy time on the stream (two timing events per
job); False: no timing event is recorded and seconds is 0 (EngineOptions::job_timing).)")
      .def(py::init([](const py::object& runtime, const std::shared_ptr<RegionHolder>& region,
                       std::uint32_t rank, py::handle groups, std::uint32_t blocks_per_chunk,
                       bool register_host, bool allow_kernel, bool calibrate, bool job_timing) {
             if (!region->region.is_open()) throw Error(ErrorCode::kState, "the region is closed");
             auto& rt = runtime.cast<DeviceRuntime&>();
             auto g = groups_from_py(groups);
             auto p = std::make_unique<PyEngine>();
             p->runtime_ref = runtime;
             p->host_ref = py::cast(region);
             p->engine = std::make_unique<TransferEngine>(
                 rt, region->region, rank, std::move(g), blocks_per_chunk,
                 options_from_py(register_host, allow_kernel, calibrate, job_timing));
             return p;
           }),
           py::arg("runtime"), py::arg("region"), py::arg("rank"), py::arg("groups"),
           py::arg("blocks_per_chunk"), py::kw_only(), py::arg("register_host") = true,
           py::arg("allow_kernel") = true, py::arg("calibrate") = false,
           py::arg("job_timing") = true)
      .def_static(
          "for_buffer",
          [](const py::object& runtime, py::object buffer, std::uint64_t slot_bytes,
             py::handle groups, std::uint32_t blocks_per_chunk, std::uint64_t row_stride,
             std::uint32_t copy_index, std::uint64_t nbytes, bool register_host, bool allow_kernel,
             bool calibrate, bool job_timing) {
            auto& rt = runtime.cast<DeviceRuntime&>();
            std::byte* base = nullptr;
            std::uint64_t size = 0;
            if (PyLong_Check(buffer.ptr())) {
              base = reinterpret_cast<std::byte*>(buffer.cast<std::uintptr_t>());
              size = nbytes;
            } else {
              // Any writable buffer (a HostBuffer, a numpy array): the engine keeps it alive.
              py::buffer_info info =
                  py::reinterpret_borrow<py::buffer>(buffer).request(/*writable=*/true);
              base = static_cast<std::byte*>(info.ptr);
              size = static_cast<std::uint64_t>(info.size * info.itemsize);
            }
            KvLayout layout;
            layout.groups = groups_from_py(groups);
            layout.blocks_per_chunk = blocks_per_chunk;
            layout.host = HostSlots::from_buffer({base, size}, slot_bytes, row_stride, copy_index);
            auto p = std::make_unique<PyEngine>();
            p->runtime_ref = runtime;
            p->host_ref = buffer;
            p->engine = std::make_unique<TransferEngine>(
                rt, std::move(layout),
                options_from_py(register_host, allow_kernel, calibrate, job_timing));
            return p;
          },
          py::arg("runtime"), py::arg("buffer"), py::arg("slot_bytes"), py::arg("groups"),
          py::arg("blocks_per_chunk"), py::kw_only(), py::arg("row_stride") = 0,
          py::arg("copy_index") = 0, py::arg("nbytes") = 0, py::arg("register_host") = true,
          py::arg("allow_kernel") = true, py::arg("calibrate") = false,
          py::arg("job_timing") = true)
      .def(
          "submit",
          [](PyEngine& p, std::uint64_t job_id, py::handle direction,
             const std::vector<std::uint64_t>& chunks,
             const std::vector<std::vector<std::uint64_t>>& group_blocks, std::uint32_t skip,
             const std::optional<std::vector<std::pair<std::vector<std::uint64_t>, std::uint32_t>>>&
                 group_chunks,
             const py::object& wait_stream, const py::object& wait_event) {
            if (!wait_stream.is_none() && !wait_event.is_none()) {
              throw Error(ErrorCode::kInvalidArgument, "give wait_stream or wait_event, not both");
            }
            std::vector<std::span<const std::uint64_t>> groups(group_blocks.begin(),
                                                               group_blocks.end());
            std::vector<GroupChunks> per_group;
            if (group_chunks) {
              for (const auto& [ids, first] : *group_chunks) per_group.push_back({ids, first});
            }
            TransferSpec spec;
            spec.chunks = chunks;
            spec.skip = skip;
            spec.group_blocks = groups;
            spec.group_chunks = per_group;
            WaitOn w;
            if (!wait_stream.is_none()) w = WaitOn::stream(stream_from_py(wait_stream));
            if (!wait_event.is_none()) w = WaitOn::event(event_from_py(wait_event));
            p.engine->submit(JobId{job_id}, direction_from_py(direction), spec, w);
          },
          py::arg("job_id"), py::arg("direction"), py::arg("chunks"), py::arg("group_blocks"),
          py::kw_only(), py::arg("skip") = 0, py::arg("group_chunks") = py::none(),
          py::arg("wait_stream") = py::none(), py::arg("wait_event") = py::none(),
          "Enqueues a job (direction 'store' = device to host, 'load' = host to device) after "
          "wait_stream (a Stream or an int handle, e.g. torch.cuda.current_stream().cuda_stream) "
          "or wait_event; returns at once. group_blocks[g] lists group g's device block ids. "
          "group_chunks: instead of chunks and skip (pass [] and 0), one (chunk ids, skip) pair "
          "per group, each group filling chunks of its own.")
      .def(
          "poll", [](PyEngine& p) { return p.engine->poll(); },
          "Results of jobs finished since the last poll")
      .def(
          "wait",
          [](PyEngine& p, const std::vector<std::uint64_t>& ids) {
            std::vector<JobId> j;
            j.reserve(ids.size());
            for (auto id : ids) j.push_back(JobId{id});
            py::gil_scoped_release release;
            return p.engine->wait(j);
          },
          py::arg("job_ids"),
          "Blocks until the listed jobs finish; their results in the order given")
      .def("wait_all",
           [](PyEngine& p) {
             py::gil_scoped_release release;
             return p.engine->wait_all();
           })
      .def("shutdown",
           [](PyEngine& p) {
             py::gil_scoped_release release;
             p.engine->shutdown();
           })
      .def_property_readonly("host_registered",
                             [](const PyEngine& p) { return p.engine->host_registered(); })
      .def("stats", [](const PyEngine& p) { return stats_dict(p.engine->stats()); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyEngine& p, const py::args&) {
        py::gil_scoped_release release;
        p.engine->shutdown();
        return false;
      });
}

}  // namespace kvoffload::python
