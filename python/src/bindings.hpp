#pragma once
// One bind_* function per part of the API; module.cpp calls them in order (errors first, so the
// exception translator is in place before anything else is bound).
#include <pybind11/pybind11.h>

namespace kvoffload::pool {
class NodePool;
}

namespace kvoffload::python {

void bind_errors(pybind11::module_& m);
void bind_region(pybind11::module_& m);
void bind_runtime(pybind11::module_& m);
void bind_worker(pybind11::module_& m);  // after bind_runtime: it returns TransferEngines
void bind_manager(pybind11::module_& m);
void bind_pool(pybind11::module_& m);
void bind_vllm_manager(pybind11::module_& m);
void bind_remote(pybind11::module_& m);
void bind_vllm_tiers(pybind11::module_& m);
void bind_sglang_store(pybind11::module_& m);
void bind_sglang_pool_copy(pybind11::module_& m);

// The pool of a kvoffload.NodePool (pool.cpp); TypeError for another object.
pool::NodePool& node_pool_of(pybind11::handle obj);

}  // namespace kvoffload::python
