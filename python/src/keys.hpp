#pragma once
// Block keys on the Python side: ints in [0, 2**128) (an engine's block hash as an int), or
// bytes/bytearray of up to 16 bytes (big-endian). Keys come back as ints.
#include <vector>

#include <pybind11/pybind11.h>

#include <kvoffload/block_key.hpp>

namespace kvoffload::python {

BlockKey key_from_py(pybind11::handle obj);
pybind11::int_ key_to_py(const BlockKey& key);
// Converts any iterable of keys into `out` (cleared first).
void keys_from_py(pybind11::handle iterable, std::vector<BlockKey>& out);

}  // namespace kvoffload::python
