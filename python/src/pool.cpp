// kvoffload.NodePool: one KV chunk pool per node shared by every engine that attaches
// (docs/DESIGN.md §6.6). Calls hold the GIL (they are microseconds); a stopped holder of the
// pool's lock makes one fail after lock_timeout seconds, never hang.
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include <kvoffload/error.hpp>
#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/node_pool.hpp>

#include "bindings.hpp"
#include "keys.hpp"

namespace py = pybind11;

namespace kvoffload::python {

namespace {

using pool::NodePool;

py::list key_list(std::span<const BlockKey> keys) {
  py::list out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = key_to_py(keys[i]);
  return out;
}

template <class T>
std::vector<T> vec(std::span<const T> s) {
  return {s.begin(), s.end()};
}

// Python-owned copies of the outcomes (the C++ views die at the next call).
struct PyPoolLookup {
  std::uint32_t hits = 0, cross_engine_hits = 0;
  std::vector<std::uint32_t> slots;
};
struct PyPoolStore {
  std::vector<std::uint32_t> positions, slots;
  py::list evicted;
  std::uint32_t skipped_present = 0, skipped_writing = 0, skipped_no_room = 0, skipped_cap = 0;
};

PyPoolLookup copy(const pool::LookupOutcome& o) {
  return {o.hits, o.cross_engine_hits, vec(o.slots)};
}
PyPoolStore copy(const pool::StoreOutcome& o) {
  return {vec(o.positions),  vec(o.slots),      key_list(o.evicted), o.skipped_present,
          o.skipped_writing, o.skipped_no_room, o.skipped_cap};
}

// A NodePool with its key conversion buffer.
struct PyNodePool {
  explicit PyNodePool(NodePool p) : pool(std::move(p)) {}
  NodePool pool;
  std::vector<BlockKey> keys;
  std::span<const BlockKey> convert(py::handle iterable) {
    keys_from_py(iterable, keys);
    return keys;
  }
  void check_chunk(std::uint32_t slot, std::uint32_t rank) const {
    if (!pool.attached()) {
      throw Error(ErrorCode::kState,
                  "node pool '" + pool.path().string() + "': chunk access after detach()");
    }
    (void)pool.chunk(slot, rank);  // range check
  }
};

std::chrono::milliseconds millis(double seconds, const char* what) {
  if (!(seconds >= 0) || seconds > 3600) {
    throw Error(ErrorCode::kInvalidArgument, std::string("node pool ") + what + " " +
                                                 std::to_string(seconds) +
                                                 " s is out of range; it must be 0 .. 3600");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000.0));
}

py::dict tenant_dict(const pool::TenantStats& t) {
  py::dict d;
  d["index"] = t.index;
  d["engine_id"] = t.engine_id;
  d["pid"] = t.pid;
  d["lookup_keys"] = t.lookup_keys;
  d["hits"] = t.hits;
  d["cross_engine_hits"] = t.cross_engine_hits;
  d["stores_prepared"] = t.stores_prepared;
  d["stores_committed"] = t.stores_committed;
  d["stores_aborted"] = t.stores_aborted;
  d["evictions"] = t.evictions;
  d["pins"] = t.pins;
  d["pinned"] = t.pinned;
  d["occupancy"] = t.occupancy;
  d["cap_slots"] = t.cap_slots;
  return d;
}

}  // namespace

void bind_pool(py::module_& m) {
  py::class_<PyPoolLookup>(m, "PoolLookup", "What NodePool.lookup found (a copy)")
      .def_readonly("hits", &PyPoolLookup::hits, "length of the ready prefix")
      .def_readonly("cross_engine_hits", &PyPoolLookup::cross_engine_hits,
                    "hits on chunks another engine stored")
      .def_readonly("slots", &PyPoolLookup::slots, "slots of the prefix (pinned if asked)")
      .def("__repr__", [](const PyPoolLookup& l) {
        return "<kvoffload.PoolLookup hits=" + std::to_string(l.hits) +
               " cross_engine_hits=" + std::to_string(l.cross_engine_hits) + ">";
      });
  py::class_<PyPoolStore>(m, "PoolStore", "What NodePool.prepare_stores allocated (a copy)")
      .def_readonly("positions", &PyPoolStore::positions, "keys[positions[i]] goes to slots[i]")
      .def_readonly("slots", &PyPoolStore::slots, "writing slots of this tenant")
      .def_readonly("evicted", &PyPoolStore::evicted, "keys evicted to make room")
      .def_readonly("skipped_present", &PyPoolStore::skipped_present)
      .def_readonly("skipped_writing", &PyPoolStore::skipped_writing)
      .def_readonly("skipped_no_room", &PyPoolStore::skipped_no_room)
      .def_readonly("skipped_cap", &PyPoolStore::skipped_cap)
      .def("__repr__", [](const PyPoolStore& s) {
        return "<kvoffload.PoolStore slots=" + std::to_string(s.slots.size()) + ">";
      });

  py::class_<PyNodePool>(m, "NodePool",
                         R"(One KV chunk pool per node, shared by every engine that attaches.

attach() creates the pool file or joins it; a pool of another geometry, fingerprint or eviction
policy ("lru" or "arc", fixed by the creator) is refused (kvoffload.Error, MISMATCH). Keys are ints in [0, 2**128) or bytes of up to 16. Use it as a
context manager, or call detach(): the last tenant out removes the pool.)")
      .def_static(
          "attach",
          [](const std::string& name, const std::string& engine_id, std::uint64_t slot_bytes,
             std::uint32_t slot_count, std::uint32_t world_size, const std::string& layout,
             const std::string& dtype, const std::string& fingerprint, const std::string& shm_dir,
             std::uint32_t max_tenants, std::uint64_t cap_bytes, double cap_fraction,
             double lock_timeout, double sweep_interval, const std::string& policy) {
            pool::PoolOptions o;
            o.policy = parse_policy_kind(policy);
            o.name = name;
            o.engine_id = engine_id;
            o.geometry.slot_bytes = slot_bytes;
            o.geometry.slot_count = slot_count;
            o.geometry.world_size = world_size;
            o.geometry.layout = layout;
            o.geometry.dtype = dtype;
            o.geometry.fingerprint = fingerprint;
            o.shm_dir = shm_dir;
            o.max_tenants = max_tenants;
            o.cap_bytes = cap_bytes;
            o.cap_fraction = cap_fraction;
            o.lock_timeout = millis(lock_timeout, "lock_timeout");
            o.sweep_interval = millis(sweep_interval, "sweep_interval");
            return std::make_unique<PyNodePool>(NodePool::attach(o));
          },
          py::arg("name"), py::arg("engine_id"), py::kw_only(), py::arg("slot_bytes"),
          py::arg("slot_count"), py::arg("world_size") = 1, py::arg("layout"), py::arg("dtype"),
          py::arg("fingerprint"), py::arg("shm_dir") = "", py::arg("max_tenants") = 16,
          py::arg("cap_bytes") = 0, py::arg("cap_fraction") = 0.0, py::arg("lock_timeout") = 5.0,
          py::arg("sweep_interval") = 1.0, py::arg("policy") = "lru")
      .def(
          "lookup",
          [](PyNodePool& p, py::handle keys, bool pin) {
            return copy(p.pool.lookup(p.convert(keys), pin));
          },
          py::arg("keys"), py::arg("pin") = false,
          "The ready prefix of keys: touched, or pinned for this tenant with pin=True")
      .def(
          "prepare_stores",
          [](PyNodePool& p, py::handle keys) {
            return copy(p.pool.prepare_stores(p.convert(keys)));
          },
          py::arg("keys"),
          "Writing slots for the keys neither ready nor being written, evicting LRU chunks")
      .def(
          "lookup_and_prepare",
          [](PyNodePool& p, py::handle keys, bool pin) {
            const NodePool::Cycle c = p.pool.lookup_and_prepare(p.convert(keys), pin);
            return py::make_tuple(copy(c.lookup), copy(c.store));
          },
          py::arg("keys"), py::arg("pin") = false,
          "lookup and prepare_stores of the rest under one lock")
      .def(
          "commit_stores",
          [](PyNodePool& p, const std::vector<std::uint32_t>& slots) {
            p.pool.commit_stores(slots);
          },
          py::arg("slots"))
      .def(
          "abort_stores",
          [](PyNodePool& p, const std::vector<std::uint32_t>& slots) {
            p.pool.abort_stores(slots);
          },
          py::arg("slots"))
      .def(
          "unpin",
          [](PyNodePool& p, const std::vector<std::uint32_t>& slots) { p.pool.unpin(slots); },
          py::arg("slots"))
      .def("reclaim_dead_tenants", [](PyNodePool& p) { return p.pool.reclaim_dead_tenants(); })
      .def("detach", [](PyNodePool& p) { p.pool.detach(); })
      .def(
          "write_chunk",
          [](PyNodePool& p, std::uint32_t slot, const py::bytes& data, std::uint32_t rank) {
            p.check_chunk(slot, rank);
            const std::string_view bytes = data;
            if (bytes.size() > p.pool.geometry().slot_bytes) {
              throw Error(ErrorCode::kInvalidArgument,
                          "write_chunk: " + std::to_string(bytes.size()) + " bytes for a slot of " +
                              std::to_string(p.pool.geometry().slot_bytes));
            }
            std::memcpy(p.pool.chunk(slot, rank), bytes.data(), bytes.size());
          },
          py::arg("slot"), py::arg("data"), py::arg("rank") = 0,
          "Copies data into rank's slot of the chunk")
      .def(
          "read_chunk",
          [](PyNodePool& p, std::uint32_t slot, std::uint32_t rank) {
            p.check_chunk(slot, rank);
            return py::bytes(reinterpret_cast<const char*>(p.pool.chunk(slot, rank)),
                             p.pool.geometry().slot_bytes);
          },
          py::arg("slot"), py::arg("rank") = 0, "A copy of rank's slot of the chunk")
      .def("stats",
           [](PyNodePool& p) {
             const pool::PoolStats s = p.pool.stats();
             py::dict d;
             d["slot_count"] = s.slot_count;
             d["free"] = s.free;
             d["writing"] = s.writing;
             d["ready"] = s.ready;
             d["pinned"] = s.pinned;
             d["repairs"] = s.repairs;
             d["tenants_reclaimed"] = s.tenants_reclaimed;
             d["policy"] = std::string(to_string(s.policy));
             d["arc_target"] = s.arc_target;
             d["recent"] = s.recent;
             d["frequent"] = s.frequent;
             d["ghost_recent"] = s.ghost_recent;
             d["ghost_frequent"] = s.ghost_frequent;
             py::list tenants;
             for (const auto& t : s.tenants) tenants.append(tenant_dict(t));
             d["tenants"] = tenants;
             return d;
           })
      .def("check_invariants", [](PyNodePool& p) { return p.pool.check_invariants(); })
      .def(
          "chunk_address",
          [](PyNodePool& p, std::uint32_t slot, std::uint32_t rank) {
            p.check_chunk(slot, rank);
            return reinterpret_cast<std::uintptr_t>(p.pool.chunk(slot, rank));
          },
          py::arg("slot"), py::arg("rank") = 0,
          "The address of rank's slot of the chunk, for a TransferEngine over the pool's bytes "
          "(valid until detach(); shut the engine down first)")
      .def(
          "rank_range",
          [](PyNodePool& p, std::uint32_t rank) {
            if (!p.pool.attached()) {
              throw Error(ErrorCode::kState,
                          "node pool '" + p.pool.path().string() + "': rank_range after detach()");
            }
            const pool::RankRange r = p.pool.rank_range(rank);
            py::dict d;
            d["address"] = reinterpret_cast<std::uintptr_t>(r.data);
            d["bytes"] = r.bytes;
            d["file_offset"] = r.file_offset;
            d["slot_stride"] = r.slot_stride;
            return d;
          },
          py::arg("rank"),
          "rank's slot of every chunk, one range (the pool is rank-major): a dict of address, "
          "bytes, file_offset (where it starts in the pool file) and slot_stride; chunk s is at "
          "address + s * slot_stride. A rank registers only this range")
      .def_property_readonly(
          "slot_stride", [](const PyNodePool& p) { return p.pool.slot_stride(); },
          "bytes between consecutive chunks' slots of one rank (slot_bytes rounded up to 256)")
      .def_property_readonly(
          "row_stride", [](const PyNodePool& p) { return p.pool.slot_stride(); },
          "bytes between consecutive chunks of one rank: slot_stride (the pool is rank-major)")
      .def_property_readonly(
          "rank_stride", [](const PyNodePool& p) { return p.pool.rank_range(0).bytes; },
          "bytes of one rank's range, and between ranks' ranges")
      .def_property_readonly("path", [](const PyNodePool& p) { return p.pool.path().string(); })
      .def_property_readonly("tenant_index",
                             [](const PyNodePool& p) { return p.pool.tenant_index(); })
      .def_property_readonly("attached", [](const PyNodePool& p) { return p.pool.attached(); })
      .def(
          "__enter__", [](PyNodePool& p) -> PyNodePool& { return p; },
          py::return_value_policy::reference)
      .def("__exit__", [](PyNodePool& p, py::handle, py::handle, py::handle) { p.pool.detach(); });
}

pool::NodePool& node_pool_of(py::handle obj) {
  if (!py::isinstance<PyNodePool>(obj)) {
    throw py::type_error(std::string("expected a kvoffload.NodePool, got ") +
                         Py_TYPE(obj.ptr())->tp_name);
  }
  return obj.cast<PyNodePool&>().pool;
}

}  // namespace kvoffload::python
