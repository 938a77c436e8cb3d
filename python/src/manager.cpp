// kvoffload.Manager: the scheduler side (lookup, stores, loads, eviction, events, statistics).
//
// The Manager is thread-compatible; every call here runs with the GIL held (none releases it, the
// calls are microseconds), so Python threads sharing one Manager are serialised by the GIL.
#include <climits>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include <kvoffload/error.hpp>
#include <kvoffload/manager.hpp>

#include "bindings.hpp"
#include "keys.hpp"
#include "stats_dict.hpp"

namespace py = pybind11;

namespace kvoffload::python {

BlockKey key_from_py(py::handle obj) {
  if (PyLong_Check(obj.ptr())) {
    // Fast path: keys below 2**64 (integer hashes, tests) need one call.
    int overflow = 0;
    const long long small = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow == 0) {
      if (small < 0)
        throw Error(ErrorCode::kInvalidArgument,
                    "block keys must be >= 0, got " + std::to_string(small));
      return BlockKey::from_u64(static_cast<std::uint64_t>(small));
    }
    if (overflow < 0)
      throw Error(ErrorCode::kInvalidArgument,
                  "block keys must be >= 0, got " + py::str(obj).cast<std::string>());
    py::int_ value = py::reinterpret_borrow<py::int_>(obj);
    if (value.attr("__rshift__")(128).cast<bool>()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "block keys are 128-bit: " + py::str(obj).cast<std::string>() + " is >= 2**128");
    }
    const auto hi = PyLong_AsUnsignedLongLongMask(value.attr("__rshift__")(64).ptr());
    const auto lo = PyLong_AsUnsignedLongLongMask(obj.ptr());
    return BlockKey(hi, lo);
  }
  if (PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr())) {
    const std::string bytes =
        py::bytes(py::reinterpret_borrow<py::object>(obj)).cast<std::string>();
    if (bytes.size() > BlockKey::kBytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  "a block key given as bytes has at most 16 bytes, got " +
                      std::to_string(bytes.size()) + " (for a longer digest pass digest[:16])");
    }
    return BlockKey::from_bytes(
        {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
  }
  throw Error(ErrorCode::kInvalidArgument,
              "a block key is an int in [0, 2**128) or up to 16 bytes, got " +
                  py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
}

py::int_ key_to_py(const BlockKey& key) {
  if (key.hi() == 0) return py::int_(key.lo());
  return py::int_(py::int_(key.hi()).attr("__lshift__")(64).attr("__or__")(py::int_(key.lo())));
}

void keys_from_py(py::handle iterable, std::vector<BlockKey>& out) {
  out.clear();
  if (PyLong_Check(iterable.ptr()) || PyBytes_Check(iterable.ptr())) {
    throw Error(ErrorCode::kInvalidArgument, "expected a sequence of block keys, got a single key");
  }
  for (py::handle k : iterable) out.push_back(key_from_py(k));
}

namespace {

py::list keys_list(std::span<const BlockKey> keys) {
  py::list out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = key_to_py(keys[i]);
  return out;
}

// A Manager plus reused conversion buffers.
struct PyManager {
  explicit PyManager(const ManagerConfig& c) : manager(c) {}
  Manager manager;
  std::vector<BlockKey> keys, protected_keys;
  std::vector<LookupResult> results;

  std::span<const BlockKey> convert(py::handle iterable) {
    keys_from_py(iterable, keys);
    return keys;
  }
};

// Python-owned copy of a StorePlan (the C++ plan's views die at the next prepare_store).
struct PyStorePlan {
  bool ok = true;
  std::string reason;
  py::list keys, slots, evicted;
  std::uint64_t skipped_present = 0, skipped_threshold = 0, slots_needed = 0, slots_available = 0;
  std::string description;
};

}  // namespace

void bind_manager(py::module_& m) {
  py::enum_<LookupResult>(m, "LookupResult")
      .value("MISS", LookupResult::kMiss)
      .value("HIT", LookupResult::kHit)
      .value("HIT_PENDING", LookupResult::kHitPending);

  py::class_<PyStorePlan>(m, "StorePlan", "What prepare_store did (a copy; stays valid)")
      .def_readonly("ok", &PyStorePlan::ok)
      .def_readonly("reason", &PyStorePlan::reason, "'none', or why nothing could be stored")
      .def_readonly("keys", &PyStorePlan::keys, "keys to store now, in call order")
      .def_readonly("slots", &PyStorePlan::slots, "slots[i] receives keys[i]")
      .def_readonly("evicted", &PyStorePlan::evicted, "keys evicted to make room")
      .def_readonly("skipped_present", &PyStorePlan::skipped_present)
      .def_readonly("skipped_threshold", &PyStorePlan::skipped_threshold)
      .def_readonly("slots_needed", &PyStorePlan::slots_needed)
      .def_readonly("slots_available", &PyStorePlan::slots_available)
      .def("__bool__", [](const PyStorePlan& p) { return p.ok; })
      .def("__repr__",
           [](const PyStorePlan& p) { return "<kvoffload.StorePlan " + p.description + ">"; });

  py::class_<PyManager>(m, "Manager",
                        R"(Which KV chunks live in the region's slots (the scheduler side).

Keys are ints in [0, 2**128) (or bytes of up to 16). Thread-compatible: calls hold the GIL.)")
      .def(py::init([](std::uint64_t num_chunks, const std::string& policy,
                       std::uint32_t store_threshold, std::uint64_t threshold_tracker_capacity,
                       bool record_events) {
             ManagerConfig c;
             c.num_chunks = num_chunks;
             c.policy = parse_policy_kind(policy);
             c.store_threshold = store_threshold;
             c.threshold_tracker_capacity = threshold_tracker_capacity;
             c.record_events = record_events;
             return std::make_unique<PyManager>(c);
           }),
           py::arg("num_chunks"), py::kw_only(), py::arg("policy") = "lru",
           py::arg("store_threshold") = 0, py::arg("threshold_tracker_capacity") = 0,
           py::arg("record_events") = true)
      .def_property_readonly("num_chunks",
                             [](const PyManager& p) { return p.manager.num_chunks(); })
      .def_property_readonly(
          "policy", [](const PyManager& p) { return std::string(p.manager.policy().name()); })
      .def(
          "lookup",
          [](PyManager& p, py::handle keys) {
            auto k = p.convert(keys);
            p.results.resize(k.size());
            const size_t prefix = p.manager.lookup(k, p.results);
            py::list results(k.size());
            for (size_t i = 0; i < k.size(); ++i) results[i] = py::cast(p.results[i]);
            return py::make_tuple(prefix, results);
          },
          py::arg("keys"),
          "Returns (hit_prefix, [LookupResult per key]); hit_prefix = leading keys that are HIT")
      .def(
          "prepare_store",
          [](PyManager& p, py::handle keys, const py::object& protected_keys) {
            auto k = p.convert(keys);
            if (!protected_keys.is_none())
              keys_from_py(protected_keys, p.protected_keys);
            else
              p.protected_keys.clear();
            const StorePlan sp = p.manager.prepare_store(k, p.protected_keys);
            PyStorePlan out;
            out.ok = sp.ok();
            out.reason = std::string(to_string(sp.reason));
            out.keys = keys_list(sp.keys);
            out.slots = py::cast(std::vector<SlotIndex>(sp.slots.begin(), sp.slots.end()));
            out.evicted = keys_list(sp.evicted);
            out.skipped_present = sp.skipped_present;
            out.skipped_threshold = sp.skipped_threshold;
            out.slots_needed = sp.slots_needed;
            out.slots_available = sp.slots_available;
            out.description = sp.describe();
            return out;
          },
          py::arg("keys"), py::arg("protected") = py::none())
      .def(
          "complete_store",
          [](PyManager& p, py::handle keys, bool success) {
            p.manager.complete_store(p.convert(keys), success);
          },
          py::arg("keys"), py::arg("success") = true)
      .def(
          "prepare_load",
          [](PyManager& p, py::handle keys) {
            auto slots = p.manager.prepare_load(p.convert(keys));
            return std::vector<SlotIndex>(slots.begin(), slots.end());
          },
          py::arg("keys"), "Pins each key for one reader; returns their slots")
      .def(
          "complete_load",
          [](PyManager& p, py::handle keys) { p.manager.complete_load(p.convert(keys)); },
          py::arg("keys"))
      .def(
          "touch", [](PyManager& p, py::handle keys) { p.manager.touch(p.convert(keys)); },
          py::arg("keys"))
      .def("reset", [](PyManager& p) { p.manager.reset(); })
      .def("state_of",
           [](const PyManager& p, py::handle key) { return p.manager.state_of(key_from_py(key)); })
      .def("slot_of",
           [](const PyManager& p, py::handle key) -> py::object {
             const SlotIndex s = p.manager.slot_of(key_from_py(key));
             if (s == kNoSlot) return py::none();
             return py::int_(s);
           })
      .def("__contains__",
           [](const PyManager& p, py::handle key) { return p.manager.contains(key_from_py(key)); })
      .def("pin_count",
           [](const PyManager& p, py::handle key) { return p.manager.pin_count(key_from_py(key)); })
      .def(
          "take_events",
          [](PyManager& p) {
            py::list out;
            for (const auto& e : p.manager.take_events()) {
              out.append(py::make_tuple(e.kind == EventKind::kStored ? "stored" : "removed",
                                        keys_list(e.keys)));
            }
            return out;
          },
          "Events since the last call, oldest first: [('stored'|'removed', [keys]), ...]")
      .def("stats", [](const PyManager& p) { return stats_dict(p.manager.stats()); })
      .def("reset_stats", [](PyManager& p) { p.manager.reset_stats(); });
}

}  // namespace kvoffload::python
