// kvoffload.DeviceRuntime (streams, events, host registration, device buffers) and, once built,
// the transfer engine. Device pointers and native stream/event handles are Python ints.
#include <cstdint>
#include <memory>
#include <string>

#include <pybind11/stl.h>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>

#include "bindings.hpp"
#include "region_holder.hpp"

namespace py = pybind11;

namespace kvoffload::python {

void* ptr_of(std::uintptr_t address) {
  return reinterpret_cast<void*>(address);
}
std::uintptr_t int_of(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// A stream argument: a kvoffload.Stream, or an int native handle (a torch stream's cuda_stream,
// or Stream.native of a host stream; 0 = the legacy default stream / "no stream" on host).
StreamView stream_from_py(py::handle obj) {
  if (py::isinstance<Stream>(obj)) return obj.cast<const Stream&>().view();
  if (PyLong_Check(obj.ptr())) return StreamView::from_native(obj.cast<std::uintptr_t>());
  throw Error(ErrorCode::kInvalidArgument, "expected a kvoffload.Stream or an int stream handle");
}
EventView event_from_py(py::handle obj) {
  if (py::isinstance<Event>(obj)) return obj.cast<const Event&>().view();
  if (PyLong_Check(obj.ptr())) return EventView::from_native(obj.cast<std::uintptr_t>());
  throw Error(ErrorCode::kInvalidArgument, "expected a kvoffload.Event or an int event handle");
}

void bind_transfer_engine(py::module_& m);

void bind_runtime(py::module_& m) {
  py::class_<BackendInfo>(m, "BackendInfo")
      .def_readonly("name", &BackendInfo::name)
      .def_readonly("built", &BackendInfo::built)
      .def_readonly("device_count", &BackendInfo::device_count)
      .def_readonly("detail", &BackendInfo::detail)
      .def("__repr__", [](const BackendInfo& b) {
        return "BackendInfo(name='" + b.name + "', built=" + (b.built ? "True" : "False") +
               ", device_count=" + std::to_string(b.device_count) + ")";
      });
  m.def("list_backends", &list_backends, "Every backend this library knows, built or not");
  m.def("probe_backend", &probe_backend, py::arg("name"),
        "What make_runtime(name) would use, opening only that backend (no device is touched)");

  // Owners keep their runtime alive (keep_alive below): the runtime must outlive them.
  py::class_<Stream>(m, "Stream")
      .def_property_readonly("native", &Stream::native, "The backend's stream handle, as an int")
      .def("__int__", &Stream::native)
      .def("reset", &Stream::reset);
  py::class_<Event>(m, "Event")
      .def_property_readonly("native", &Event::native)
      .def("__int__", &Event::native)
      .def("reset", &Event::reset);
  py::class_<HostRegistration>(m, "HostRegistration")
      .def_property_readonly("host_base",
                             [](const HostRegistration& r) { return int_of(r.host_base()); })
      .def_property_readonly("device_base",
                             [](const HostRegistration& r) { return int_of(r.device_base()); })
      .def_property_readonly("nbytes", &HostRegistration::bytes)
      .def(
          "device_pointer",
          [](const HostRegistration& r, std::uintptr_t host) {
            return int_of(r.device_pointer(ptr_of(host)));
          },
          py::arg("host_address"))
      .def("reset", &HostRegistration::reset,
           "Unregisters now; False when the backend reported a failure");
  py::class_<DeviceBuffer>(m, "DeviceBuffer")
      .def_property_readonly("address", [](const DeviceBuffer& b) { return int_of(b.data()); })
      .def_property_readonly("nbytes", &DeviceBuffer::bytes)
      .def("__int__", [](const DeviceBuffer& b) { return int_of(b.data()); })
      .def("reset", &DeviceBuffer::reset);

  py::class_<DeviceRuntime>(m, "DeviceRuntime", "A device backend: 'host', 'cuda' or 'hip'")
      .def_property_readonly("name", [](const DeviceRuntime& rt) { return std::string(rt.name()); })
      .def_property_readonly("supports_kernel_path", &DeviceRuntime::supports_kernel_path)
      .def("info", &DeviceRuntime::info)
      .def("create_stream", &DeviceRuntime::create_stream, py::keep_alive<0, 1>())
      .def("create_event", &DeviceRuntime::create_event, py::arg("timing") = false,
           py::keep_alive<0, 1>())
      .def("allocate_device", &DeviceRuntime::allocate_device, py::arg("nbytes"),
           py::keep_alive<0, 1>())
      .def(
          "register_host",
          [](DeviceRuntime& rt, std::uintptr_t address, std::size_t nbytes, std::size_t align) {
            py::gil_scoped_release release;  // registration of a large range takes seconds
            return rt.register_host(ptr_of(address), nbytes, align);
          },
          py::arg("address"), py::arg("nbytes"), py::arg("align") = 0, py::keep_alive<0, 1>(),
          "Registers host memory; the returned HostRegistration unregisters when dropped")
      .def(
          "register_region",
          [](DeviceRuntime& rt, const std::shared_ptr<RegionHolder>& h) {
            if (!h->region.is_open()) throw Error(ErrorCode::kState, "the region is closed");
            py::gil_scoped_release release;
            return rt.register_host(h->region.data(), h->region.geometry().data_bytes(),
                                    h->region.geometry().row_stride());
          },
          py::arg("region"), py::keep_alive<0, 1>(), py::keep_alive<0, 2>(),
          "Registers a region's whole data, row-aligned (keeps the region alive)")
      .def(
          "record_event",
          [](DeviceRuntime& rt, py::handle e, py::handle s) {
            rt.record_event(event_from_py(e), stream_from_py(s));
          },
          py::arg("event"), py::arg("stream"))
      .def(
          "wait_event",
          [](DeviceRuntime& rt, py::handle s, py::handle e) {
            rt.wait_event(stream_from_py(s), event_from_py(e));
          },
          py::arg("stream"), py::arg("event"))
      .def(
          "query_event",
          [](DeviceRuntime& rt, py::handle e) { return rt.query_event(event_from_py(e)); },
          py::arg("event"))
      .def(
          "synchronize_event",
          [](DeviceRuntime& rt, py::handle e) {
            const EventView v = event_from_py(e);
            py::gil_scoped_release release;
            rt.synchronize_event(v);
          },
          py::arg("event"))
      .def(
          "synchronize_stream",
          [](DeviceRuntime& rt, py::handle s) {
            const StreamView v = stream_from_py(s);
            py::gil_scoped_release release;
            rt.synchronize_stream(v);
          },
          py::arg("stream"))
      .def(
          "elapsed_seconds",
          [](DeviceRuntime& rt, py::handle a, py::handle b) {
            return rt.elapsed_seconds(event_from_py(a), event_from_py(b));
          },
          py::arg("start"), py::arg("end"))
      .def(
          "memcpy_sync",
          [](DeviceRuntime& rt, std::uintptr_t dst, std::uintptr_t src, std::size_t n) {
            py::gil_scoped_release release;
            rt.memcpy_sync(ptr_of(dst), ptr_of(src), n);
          },
          py::arg("dst"), py::arg("src"), py::arg("nbytes"))
      .def(
          "memset_sync",
          [](DeviceRuntime& rt, std::uintptr_t dst, int value, std::size_t n) {
            py::gil_scoped_release release;
            rt.memset_sync(ptr_of(dst), value, n);
          },
          py::arg("dst"), py::arg("value"), py::arg("nbytes"));

  m.def(
      "make_runtime",
      [](const std::string& name, int device, unsigned host_copy_threads) {
        RuntimeOptions o;
        o.device = device;
        o.host_copy_threads = host_copy_threads;
        return make_runtime(name, o);
      },
      py::arg("name") = "auto", py::kw_only(), py::arg("device") = 0,
      py::arg("host_copy_threads") = 0,
      "'host' | 'cuda' | 'hip' | 'auto' (cuda, else hip, else host)");

  bind_transfer_engine(m);
}

}  // namespace kvoffload::python
