#pragma once
// kvoffload.TransferEngine's holder, shared by transfer.cpp (engines an engine builds itself) and
// worker.cpp (the engine of a kvoffload.OffloadWorker, which the worker owns).
#include <memory>
#include <vector>

#include <pybind11/pybind11.h>

#include <kvoffload/kv_layout.hpp>
#include <kvoffload/transfer_engine.hpp>

namespace kvoffload::python {

// The engine plus the Python objects it depends on: the runtime (must outlive it) and the region
// or host buffer holding its slots. Declared before `engine` so they are released after it. An
// OffloadWorker's engine is an aliasing pointer that keeps the worker itself alive.
struct PyEngine {
  pybind11::object runtime_ref;
  pybind11::object host_ref;
  std::shared_ptr<TransferEngine> engine;
};

// A list of KV groups, each a sequence of DeviceTensor (or (base, num_blocks, page_bytes[,
// block_stride]) tuples); kInvalidArgument otherwise.
std::vector<KvGroup> groups_from_py(pybind11::handle groups);

}  // namespace kvoffload::python
