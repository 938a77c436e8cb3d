#pragma once
// vLLM's OffloadKey (a bytes object: a block hash, 32 bytes for SHA-256, plus 4 bytes of KV-group
// index) as a kvoffload BlockKey: the key's bytes hashed to 128 bits, straight from the bytes
// object's buffer (no Python object and no allocation per key). The hash is fixed (no seed, no
// process state), so the same OffloadKey names the same BlockKey in every process and after a
// restart: the file tier's records and the remote tier's values are found again by it.
// Shared by VllmManagerCore (vllm_manager.cpp) and the vLLM secondary tiers (vllm_tiers.cpp).
#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

#include <kvoffload/block_key.hpp>
#include <kvoffload/error.hpp>
#include <kvoffload/hash.hpp>

namespace kvoffload::python {

namespace py = pybind11;

// The key's bytes hashed to 128 bits (hash_bytes_128: fixed, so stable across processes).
inline BlockKey key_of_bytes(const char* data, std::size_t len) noexcept {
  const Hash128 h = hash_bytes_128(data, len);
  return BlockKey(h.hi, h.lo);
}

[[noreturn]] inline void throw_bad_key(PyObject* obj) {
  throw Error(
      ErrorCode::kInvalidArgument,
      std::string("kvoffload.vllm: an OffloadKey is a bytes object, got ") + Py_TYPE(obj)->tp_name);
}

inline BlockKey key_of(PyObject* obj) {
  if (PyBytes_CheckExact(obj) || PyBytes_Check(obj)) {
    return key_of_bytes(PyBytes_AS_STRING(obj), static_cast<std::size_t>(PyBytes_GET_SIZE(obj)));
  }
  if (PyByteArray_Check(obj)) {
    return key_of_bytes(PyByteArray_AS_STRING(obj),
                        static_cast<std::size_t>(PyByteArray_GET_SIZE(obj)));
  }
  throw_bad_key(obj);
}

// Borrowed items of a sequence (list/tuple directly, anything else iterated once into a list).
class Items {
 public:
  explicit Items(py::handle seq) {
    if (PyBytes_Check(seq.ptr())) {
      throw Error(ErrorCode::kInvalidArgument,
                  "kvoffload.vllm: expected a collection of keys, got one bytes key");
    }
    fast_ = py::reinterpret_steal<py::object>(
        PySequence_Fast(seq.ptr(), "expected a collection of keys"));
    if (!fast_) throw py::error_already_set();
    size_ = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(fast_.ptr()));
    items_ = PySequence_Fast_ITEMS(fast_.ptr());
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] PyObject* operator[](std::size_t i) const noexcept { return items_[i]; }

 private:
  py::object fast_;
  std::size_t size_ = 0;
  PyObject** items_ = nullptr;
};

}  // namespace kvoffload::python
