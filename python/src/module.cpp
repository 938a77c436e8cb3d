// The pybind11 extension kvoffload._kvoffload (re-exported by the package kvoffload).
//
// Binds the C++ API directly (richer than going through the C API, and the same library).
// Pointers cross as Python ints, so an engine passes torch's tensor.data_ptr() straight in.
// Errors: every kvoffload::Error becomes kvoffload.Error, whose str() is the C++ message and which
// carries .code (kvoffload.ErrorCode), .errno and .call.
#include <kvoffload/error.hpp>
#include <kvoffload/version.hpp>

#include "bindings.hpp"

namespace py = pybind11;

namespace kvoffload::python {
// Declared here, not in bindings.hpp (which every binding source includes): live_stats.cpp.
void bind_live_stats(py::module_& m);
}  // namespace kvoffload::python

PYBIND11_MODULE(_kvoffload, m) {
  m.doc() = "kvoffload: KV-cache offload to a shared pinned host pool (C++ extension)";
  m.attr("__version__") = KVOFFLOAD_VERSION_STRING;
  kvoffload::python::bind_errors(m);
  kvoffload::python::bind_region(m);
  kvoffload::python::bind_live_stats(m);
  kvoffload::python::bind_runtime(m);
  kvoffload::python::bind_worker(m);
  kvoffload::python::bind_manager(m);
  kvoffload::python::bind_pool(m);
  kvoffload::python::bind_vllm_manager(m);
  kvoffload::python::bind_remote(m);
  kvoffload::python::bind_vllm_tiers(m);
  kvoffload::python::bind_sglang_store(m);
  kvoffload::python::bind_sglang_pool_copy(m);
}
