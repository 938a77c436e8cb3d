#pragma once
// vLLM's OffloadKey (a bytes object: a block hash, 32 bytes for SHA-256, plus 4 bytes of KV-group
// index) as a kvoffload BlockKey: the key's bytes hashed to 128 bits, straight from the bytes
// object's buffer (no Python object and no allocation per key). The hash is fixed (no seed, no
// process state), so the same OffloadKey names the same BlockKey in every process and after a
// restart: the file tier's records and the remote tier's values are found again by it.
// Shared by VllmManagerCore (vllm_manager.cpp) and the vLLM secondary tiers (vllm_tiers.cpp).
#include <kvoffload/block_key.hpp>
#include <kvoffload/error.hpp>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace kvoffload::python {

namespace py = pybind11;

constexpr std::uint64_t murmur_rotl(std::uint64_t x, int r) noexcept {
  return (x << r) | (x >> (64 - r));
}
constexpr std::uint64_t murmur_fmix(std::uint64_t k) noexcept {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

// 128-bit hash of a key's bytes: MurmurHash3_x64_128's block mixing and finalisation, with the
// tail zero-padded into one last block and the length folded in. Engines' keys are themselves
// cryptographic hashes, so a 128-bit mix keeps distinct keys distinct (birthday bound ~n^2/2^129)
// at a few nanoseconds per 36-byte key.
inline BlockKey key_of_bytes(const char* data, std::size_t len) noexcept {
  constexpr std::uint64_t c1 = 0x87c37b91114253d5ULL;
  constexpr std::uint64_t c2 = 0x4cf5ad432745937fULL;
  std::uint64_t h1 = 0x9E3779B97F4A7C15ULL;
  std::uint64_t h2 = 0xC2B2AE3D27D4EB4FULL;
  const auto mix = [&](std::uint64_t k1, std::uint64_t k2) {
    k1 *= c1;
    k1 = murmur_rotl(k1, 31);
    k1 *= c2;
    h1 ^= k1;
    h1 = murmur_rotl(h1, 27);
    h1 += h2;
    h1 = h1 * 5 + 0x52dce729;
    k2 *= c2;
    k2 = murmur_rotl(k2, 33);
    k2 *= c1;
    h2 ^= k2;
    h2 = murmur_rotl(h2, 31);
    h2 += h1;
    h2 = h2 * 5 + 0x38495ab5;
  };
  std::size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    std::uint64_t k1 = 0;
    std::uint64_t k2 = 0;
    std::memcpy(&k1, data + i, 8);
    std::memcpy(&k2, data + i + 8, 8);
    mix(k1, k2);
  }
  if (i < len) {
    unsigned char tail[16] = {};
    std::memcpy(tail, data + i, len - i);
    std::uint64_t k1 = 0;
    std::uint64_t k2 = 0;
    std::memcpy(&k1, tail, 8);
    std::memcpy(&k2, tail + 8, 8);
    mix(k1, k2);
  }
  h1 ^= len;
  h2 ^= len;
  h1 += h2;
  h2 += h1;
  h1 = murmur_fmix(h1);
  h2 = murmur_fmix(h2);
  h1 += h2;
  h2 += h1;
  return BlockKey(h1, h2);
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
