// kvoffload._kvoffload.sglang_pool_copy: the page copies of kvoffload.sglang's "pool" backend
// (python/kvoffload/sglang_pool.py) between SGLang's host KV pool and the node pool's chunks, in
// one call per batch with the GIL released (they were one ctypes.memmove per piece in Python).
//
// A batch is `slots` (one chunk per page) and the pages' pieces as get_page_buffer_meta gives
// them (`ptrs`, `sizes`: the same number of pieces per page, page i's pieces at
// [i * per, (i + 1) * per)); a page's pieces lie back to back from the start of its chunk. Every
// argument is checked before the first byte moves, as the pool checks chunk_address and
// write_chunk (attached, slot in range, a page's bytes within slot_bytes), plus non-zero host
// pointers and sizes: a bad batch copies nothing and raises kvoffload.Error (INVALID_ARGUMENT or
// STATE) naming the value. The caller holds what makes the chunks its own during the copy (pins
// for a load, writing slots for a store) and keeps the pool attached until the call returns.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include <kvoffload/error.hpp>
#include <kvoffload/node_pool.hpp>

#include "bindings.hpp"

namespace py = pybind11;

namespace kvoffload::python {
namespace {

struct Copy {
  std::byte* chunk;
  std::size_t first;  // first piece
};

void copy_pages(py::handle pool_obj, const std::vector<std::uint32_t>& slots,
                const std::vector<std::uintptr_t>& ptrs, const std::vector<std::uint64_t>& sizes,
                bool to_pool) {
  pool::NodePool& pool = node_pool_of(pool_obj);
  if (!pool.attached()) {
    throw Error(ErrorCode::kState,
                "node pool '" + pool.path().string() + "': chunk access after detach()");
  }
  const std::size_t pages = slots.size();
  if (ptrs.size() != sizes.size() || (pages == 0 ? !ptrs.empty() : ptrs.size() % pages != 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                "sglang_pool_copy: " + std::to_string(pages) + " slots with " +
                    std::to_string(ptrs.size()) + " pointers and " + std::to_string(sizes.size()) +
                    " sizes: expected the same number of pieces for every page");
  }
  if (pages == 0) return;
  const std::size_t per = ptrs.size() / pages;
  const std::uint64_t slot_bytes = pool.geometry().slot_bytes;
  std::vector<Copy> plan;
  plan.reserve(pages);
  for (std::size_t i = 0; i < pages; ++i) {
    std::uint64_t total = 0;
    for (std::size_t j = i * per; j < (i + 1) * per; ++j) {
      if (ptrs[j] == 0 || sizes[j] == 0) {
        throw Error(ErrorCode::kInvalidArgument, "sglang_pool_copy: piece " + std::to_string(j) +
                                                     " has pointer " + std::to_string(ptrs[j]) +
                                                     " and " + std::to_string(sizes[j]) +
                                                     " bytes; both must be non-zero");
      }
      total += sizes[j];
    }
    if (total > slot_bytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  "sglang_pool_copy: page " + std::to_string(i) + " has " + std::to_string(total) +
                      " bytes for a slot of " + std::to_string(slot_bytes));
    }
    plan.push_back({pool.chunk(slots[i], 0), i * per});  // chunk() range-checks the slot
  }
  const py::gil_scoped_release release;
  for (const Copy& c : plan) {
    std::byte* at = c.chunk;
    for (std::size_t j = c.first; j < c.first + per; ++j) {
      auto* host = reinterpret_cast<std::byte*>(ptrs[j]);
      if (to_pool) {
        std::memcpy(at, host, sizes[j]);
      } else {
        std::memcpy(host, at, sizes[j]);
      }
      at += sizes[j];
    }
  }
}

}  // namespace

void bind_sglang_pool_copy(py::module_& m) {
  m.def("sglang_pool_copy", &copy_pages, py::arg("pool"), py::arg("slots"), py::arg("ptrs"),
        py::arg("sizes"), py::arg("to_pool"),
        "Copies pages between host memory and a NodePool's chunks (to_pool: host -> chunk), one "
        "chunk per slot, each page's pieces (ptrs/sizes, the same number per page) back to back "
        "from the chunk's start; checks everything first (a bad batch copies nothing), GIL "
        "released while copying.");
}

}  // namespace kvoffload::python
