// kvoffload._kvoffload.VllmManagerCore: the batched binding under kvoffload.vllm.KvoffloadManager.
// (Over ~500 lines for one idea: one class binding vLLM's whole manager interface, each call a
// short loop over a batch.)
//
// vLLM names a block by an OffloadKey, a bytes object (a block hash, 32 bytes for SHA-256, plus 4
// bytes of KV-group index). The Manager keys are 128 bits, so each key's bytes are hashed to 128
// bits (key_of, vllm_keys.hpp), straight from the bytes object's buffer: no Python object and no
// allocation per key. Every call converts its whole sequence in one loop into a reused vector.
//
// vLLM hands back the key objects it was given (evicted keys, stored-event keys), so the core keeps
// a strong reference to the key object stored in each slot (slot_keys_) and builds the result lists
// from those, in C++, without a Python-level loop.
//
// The Manager runs with ManagerSemantics::kVllm (Note [vLLM semantics] in manager.cpp). Calls hold
// the GIL throughout (they take microseconds), so Python threads are serialised.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <pybind11/stl.h>  // the std::vector<SlotIndex> argument of make_spec

#include <kvoffload/error.hpp>
#include <kvoffload/manager.hpp>

#include "bindings.hpp"
#include "region_holder.hpp"
#include "vllm_keys.hpp"

namespace py = pybind11;

namespace kvoffload::python {
namespace {

class VllmManagerCore {
 public:
  explicit VllmManagerCore(const ManagerConfig& config)
      : manager_(config),
        slot_keys_(config.num_chunks, nullptr),
        counts_skipped_(config.store_threshold >= 2) {}
  ~VllmManagerCore() {
    for (PyObject* o : slot_keys_) Py_XDECREF(o);
  }
  VllmManagerCore(const VllmManagerCore&) = delete;
  VllmManagerCore& operator=(const VllmManagerCore&) = delete;

  // 0 miss, 1 hit, 2 hit pending.
  int lookup(PyObject* key) {
    const BlockKey k = key_of(key);
    LookupResult r = LookupResult::kMiss;
    manager_.lookup(std::span<const BlockKey>(&k, 1), std::span<LookupResult>(&r, 1));
    return static_cast<int>(r);
  }

  void touch(const Items& keys) { manager_.touch(convert(keys)); }
  std::span<const SlotIndex> prepare_load(const Items& keys) {
    return manager_.prepare_load(convert(keys));
  }
  void complete_load(const Items& keys) { manager_.complete_load(convert(keys)); }
  StorePlan prepare_store(const Items& keys) {
    refresh_ready();
    return manager_.prepare_store(convert(keys));
  }

  // Note [Ready prefix]: with kvoffload_bringup='background' the workers serve while their pool
  // comes up, so the scheduler must never hand out a chunk some rank has not brought up yet. The
  // manager starts with no ready slot; the scheduler maps the region unranked (in background
  // mode: it populates nothing) and, before each store is planned, grows the manager's ready
  // prefix to the rows every rank has published as ready in the region header (one atomic
  // load per rank). Once every row is ready the mapping is dropped and prepare_store costs
  // nothing more. A rank that fails its bring-up keeps the prefix where it stopped.
  void follow_readiness(std::shared_ptr<RegionHolder> region) {
    ready_region_ = std::move(region);
    refresh_ready();
  }
  void refresh_ready() {
    if (!ready_region_) return;
    const Region& r = ready_region_->region;
    if (r.is_open()) {
      const std::uint64_t n =
          std::min<std::uint64_t>(r.chunks_ready_on_all_ranks(), manager_.num_chunks());
      if (n > manager_.ready_chunks()) manager_.set_ready_chunks(n);
    }
    if (!r.is_open() || manager_.ready_chunks() >= manager_.num_chunks()) ready_region_.reset();
  }
  // Note [Live page of a vLLM scheduler]: as `kvoffload run`'s scheduler does (OffloadStack), the
  // manager mirrors its occupancy and counters into the region's live statistics page, read by
  // `kvoffload top`, `kvoffload region list` and the exporter. The scheduler maps the region
  // unranked in background mode for it (populating nothing, holding no rank's slots), and keeps
  // the mapping until shutdown; closing it marks the page's scheduler block detached. None stops.
  void publish_live_stats(std::shared_ptr<RegionHolder> region) {
    if (region) manager_.publish_live_stats(region->region);
    live_region_ = std::move(region);  // the previous one (if any) closes: its block detaches
  }
  [[nodiscard]] bool publishing_live_stats() const noexcept { return live_region_ != nullptr; }
  [[nodiscard]] std::uint32_t ready_chunks() const noexcept { return manager_.ready_chunks(); }
  [[nodiscard]] bool following_readiness() const noexcept { return ready_region_ != nullptr; }
  std::span<const std::uint32_t> complete_store(const Items& keys, bool success) {
    return manager_.complete_store(convert(keys), success);
  }
  void reset() { manager_.reset(); }

  // A new list of the evicted keys: the objects they were stored with.
  py::list evicted_list(const StorePlan& plan) const {
    py::list evicted(plan.evicted_slots.size());
    for (std::size_t i = 0; i < plan.evicted_slots.size(); ++i) {
      PyObject* o = slot_keys_[plan.evicted_slots[i]];
      Py_INCREF(o);
      PyList_SET_ITEM(evicted.ptr(), static_cast<Py_ssize_t>(i), o);
    }
    return evicted;
  }

  // A new list of the keys to store (the call's own objects); records each in its slot.
  py::list to_store_list(const Items& items, const StorePlan& plan) {
    py::list to_store(plan.keys.size());
    for (std::size_t i = 0; i < plan.keys.size(); ++i) {
      PyObject* o = items[plan.positions[i]];
      Py_INCREF(o);
      PyList_SET_ITEM(to_store.ptr(), static_cast<Py_ssize_t>(i), o);
      PyObject*& held = slot_keys_[plan.slots[i]];
      Py_INCREF(o);
      Py_XDECREF(held);  // the slot's previous key (evicted, failed or reset), if any
      held = o;
    }
    return to_store;
  }

  // A new list of items[done[i]].
  static py::list pick(const Items& items, std::span<const std::uint32_t> done) {
    py::list out(done.size());
    for (std::size_t i = 0; i < done.size(); ++i) {
      PyObject* o = items[done[i]];
      Py_INCREF(o);
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), o);
    }
    return out;
  }

  static py::list slot_list(std::span<const SlotIndex> slots) {
    py::list out(slots.size());
    for (std::size_t i = 0; i < slots.size(); ++i) {
      PyObject* v = PyLong_FromUnsignedLong(slots[i]);
      if (v == nullptr) throw py::error_already_set();
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), v);
    }
    return out;
  }

  // (write-pending, pinned, stores skipped by the threshold so far): what vLLM's get_stats reads.
  py::tuple counters() const {
    const ManagerStats s = manager_.stats();
    return py::make_tuple(s.write_pending, s.pinned, s.stores_skipped_threshold);
  }

  // Lookups the threshold tracker holds for key (0: not tracked).
  std::uint32_t threshold_count(py::handle key) const {
    return manager_.threshold_count(key_of(key.ptr()));
  }

  [[nodiscard]] const Manager& manager() const noexcept { return manager_; }
  // Whether get_stats reports the stores skipped by the threshold (vLLM: store_threshold >= 2).
  [[nodiscard]] bool counts_skipped() const noexcept { return counts_skipped_; }

  // Slot of a key (None when absent), for tests.
  py::object slot_of(py::handle key) const {
    const SlotIndex s = manager_.slot_of(key_of(key.ptr()));
    if (s == kNoSlot) return py::none();
    return py::int_(s);
  }

 private:
  std::span<const BlockKey> convert(const Items& items) {
    keys_.resize(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) keys_[i] = key_of(items[i]);
    return keys_;
  }

  Manager manager_;
  std::vector<PyObject*> slot_keys_;            // strong references; slot s's latest key object
  std::shared_ptr<RegionHolder> ready_region_;  // Note [Ready prefix]; null: every slot is ready
  std::shared_ptr<RegionHolder> live_region_;   // Note [Live page of a vLLM scheduler]
  std::vector<BlockKey> keys_;
  bool counts_skipped_;
};

// Note [Fast entry points]: vLLM calls the manager once per key for lookup and once per request
// for the rest, so the per-call cost is what separates this adapter from vLLM's own Python. The
// hot methods are therefore plain METH_FASTCALL C functions bound to a capsule (no pybind11
// argument dispatch, no Python frame): KvoffloadManager installs them as instance attributes, so
// `manager.lookup(key, req_context)` runs this code directly, and they build vLLM's own result
// objects (LookupResult members, CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent).
//
// Note [Plain result objects]: building a CPULoadStoreSpec through its constructor runs
// BlockIDsLoadStoreSpec.__init__, `np.array(block_ids, dtype=np.int64)` over a Python list, about
// 1 µs, twice in a request (load and store), which was most of this adapter's cost. When the
// caller hands `new_array` = (numpy.empty, int64 dtype), called as empty(n, dtype), the spec is
// built as the constructor would leave it: a bare instance of the class whose only attribute,
// block_ids, is that array filled with the slot ids; PrepareStoreOutput likewise gets its three
// fields set on a bare instance instead of running the dataclass __init__. kvoffload.vllm uses
// this only after checking, against objects built by vLLM's own constructors, that the result is
// the same (same type, same attribute names, same dtype and flags; no __post_init__, no slots):
// a vLLM whose constructors do more gets the constructor path.
// A bare instance of the Python class `cls` (its __new__ with no arguments; __init__ not run).
py::object bare_instance(const py::object& cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  if (!PyType_Check(cls.ptr()) || type->tp_new == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "kvoffload.vllm: a result class is not a type");
  }
  py::tuple no_args;
  auto obj = py::reinterpret_steal<py::object>(type->tp_new(type, no_args.ptr(), nullptr));
  if (!obj) throw py::error_already_set();
  return obj;
}

// Note [Stats in C]: vLLM's scheduler calls get_stats once per step, and with its Python (the
// occupancy read, the dicts, OffloadingConnectorStats' dataclass __init__) it was the costliest
// manager call of a step, cache-cold between steps. StatsTemplate holds what stays the same: the
// stats class, the two keys of its data dict, the metric names and the metric-type strings, all
// read off stats built by vLLM's own methods; build_stats fills fresh dicts from it in the order
// vLLM's methods insert their keys (CPUOffloadingManager.get_stats). kvoffload.vllm hands a
// template over only after checking, once per process, that build_stats gives what vLLM's methods
// give for sample values (Note [Stats without methods] in kvoffload/vllm/manager.py); otherwise
// get_stats stays the Python builder.
struct StatsTemplate {
  py::object cls;         // OffloadingConnectorStats
  bool plain = false;     // built as a bare instance with its `data` set (no __init__)
  py::object types_key;   // data's key of the metric types
  py::object values_key;  // data's key of the values per label tuple
  py::object usage, allocation, write_usage, read_usage, skipped;  // metric names
  py::object gauge, histogram, counter;                            // metric-type strings
  py::object data_kwnames;                                         // ("data",)

  static StatsTemplate from(const py::tuple& t) {
    if (t.size() != 12) {
      throw Error(ErrorCode::kInvalidArgument,
                  "kvoffload.vllm: a stats template is (cls, plain, types_key, values_key, 5 "
                  "metric names, gauge, histogram, counter)");
    }
    StatsTemplate s;
    s.cls = t[0];
    s.plain = t[1].cast<bool>();
    s.types_key = t[2];
    s.values_key = t[3];
    s.usage = t[4];
    s.allocation = t[5];
    s.write_usage = t[6];
    s.read_usage = t[7];
    s.skipped = t[8];
    s.gauge = t[9];
    s.histogram = t[10];
    s.counter = t[11];
    s.data_kwnames = py::make_tuple("data");
    return s;
  }
};

void set_item(PyObject* dict, PyObject* key, PyObject* value) {
  if (PyDict_SetItem(dict, key, value) != 0) throw py::error_already_set();
}

// {(): value}: the value of an unlabelled metric.
py::dict unlabelled(PyObject* value) {
  static PyObject* const no_labels = PyTuple_New(0);
  py::dict d;
  set_item(d.ptr(), no_labels, value);
  return d;
}

// The stats CPUOffloadingManager.get_stats builds for these values; `sizes` (the allocation
// sizes of the batch) is taken and emptied; `skipped` < 0: no stores-skipped counter.
py::object build_stats(const StatsTemplate& t, double usage, double write_usage, double read_usage,
                       const py::list& sizes, long long skipped) {
  py::dict types;
  py::dict values;
  py::float_ u(usage);
  set_item(types.ptr(), t.usage.ptr(), t.gauge.ptr());
  set_item(values.ptr(), t.usage.ptr(), unlabelled(u.ptr()).ptr());
  const Py_ssize_t n = PyList_GET_SIZE(sizes.ptr());
  if (n > 0) {
    auto taken = py::reinterpret_steal<py::object>(PyList_GetSlice(sizes.ptr(), 0, n));
    if (!taken || PyList_SetSlice(sizes.ptr(), 0, n, nullptr) != 0) throw py::error_already_set();
    set_item(types.ptr(), t.allocation.ptr(), t.histogram.ptr());
    set_item(values.ptr(), t.allocation.ptr(), unlabelled(taken.ptr()).ptr());
  }
  py::float_ w(write_usage);
  py::float_ r(read_usage);
  set_item(types.ptr(), t.write_usage.ptr(), t.gauge.ptr());
  set_item(types.ptr(), t.read_usage.ptr(), t.gauge.ptr());
  set_item(values.ptr(), t.write_usage.ptr(), unlabelled(w.ptr()).ptr());
  set_item(values.ptr(), t.read_usage.ptr(), unlabelled(r.ptr()).ptr());
  if (skipped >= 0) {
    py::int_ k(skipped);
    set_item(types.ptr(), t.skipped.ptr(), t.counter.ptr());
    set_item(values.ptr(), t.skipped.ptr(), unlabelled(k.ptr()).ptr());
  }
  py::dict data;
  set_item(data.ptr(), t.types_key.ptr(), types.ptr());
  set_item(data.ptr(), t.values_key.ptr(), values.ptr());
  if (!t.plain) {
    PyObject* args[1] = {data.ptr()};
    auto out = py::reinterpret_steal<py::object>(
        PyObject_Vectorcall(t.cls.ptr(), args, 0, t.data_kwnames.ptr()));
    if (!out) throw py::error_already_set();
    return out;
  }
  py::object out = bare_instance(t.cls);
  static PyObject* const data_name = PyUnicode_InternFromString("data");
  if (PyObject_SetAttr(out.ptr(), data_name, data.ptr()) != 0) throw py::error_already_set();
  return out;
}

struct FastState {
  py::object owner;  // the VllmManagerCore Python object: keeps `core` alive
  VllmManagerCore* core = nullptr;
  py::object error_cls;       // kvoffload.Error
  py::object lookup_results;  // (MISS, HIT, HIT_PENDING)
  py::object spec_cls;        // CPULoadStoreSpec
  py::object output_cls;      // PrepareStoreOutput
  py::object event_cls;       // OffloadingEvent
  py::object medium;          // Medium.CPU
  py::object events;          // the manager's event list, or None when events are off
  py::object alloc_sizes;     // the manager's allocation_sizes_in_current_batch
  py::object output_kwnames;  // ("keys_to_store", "store_spec", "evicted_keys")
  py::object event_kwnames;   // ("keys", "medium", "removed")
  py::object new_array;       // None, or (numpy.empty, int64) (Note [Plain result objects])
  bool plain_output = false;  // PrepareStoreOutput built as a bare instance
  py::object context_cls;     // RequestOffloadingContext
  py::object context_fields;  // None, or the attributes a RequestOffloadingContext() holds
  std::optional<StatsTemplate> stats;  // get_stats in C (Note [Stats in C]); none: Python's
  std::uint64_t skipped_reported = 0;  // stores skipped by the threshold at the last get_stats
};

// block_ids as `empty(n, dtype)` (new_array = (numpy.empty, numpy.dtype("int64"))) filled with the
// slots; throws unless it is a writable C-contiguous array of 8-byte integers.
py::object filled_block_ids(const py::object& new_array, std::span<const SlotIndex> slots) {
  if (!PyTuple_Check(new_array.ptr()) || PyTuple_GET_SIZE(new_array.ptr()) != 2) {
    throw Error(ErrorCode::kInvalidArgument,
                "kvoffload.vllm: new_array must be (numpy.empty, an int64 dtype)");
  }
  py::int_ n(slots.size());
  PyObject* args[2] = {n.ptr(), PyTuple_GET_ITEM(new_array.ptr(), 1)};
  auto arr = py::reinterpret_steal<py::object>(
      PyObject_Vectorcall(PyTuple_GET_ITEM(new_array.ptr(), 0), args, 2, nullptr));
  if (!arr) throw py::error_already_set();
  Py_buffer view;
  // The dtype is the caller's int64 (checked once by kvoffload.vllm); here only the size.
  if (PyObject_GetBuffer(arr.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
    throw py::error_already_set();
  }
  const bool ok = view.itemsize == 8 && view.len == static_cast<Py_ssize_t>(slots.size() * 8);
  if (ok) {
    auto* out = static_cast<std::int64_t*>(view.buf);
    for (std::size_t i = 0; i < slots.size(); ++i) out[i] = static_cast<std::int64_t>(slots[i]);
  }
  PyBuffer_Release(&view);
  if (!ok) {
    throw Error(ErrorCode::kInvalidArgument,
                "kvoffload.vllm: new_array must make a writable C-contiguous int64 array");
  }
  return arr;
}

// CPULoadStoreSpec(slots): through the constructor, or plain (Note [Plain result objects]).
py::object make_spec(const py::object& spec_cls, const py::object& new_array,
                     std::span<const SlotIndex> slots) {
  if (new_array.is_none()) {
    py::list ids = VllmManagerCore::slot_list(slots);
    auto spec = py::reinterpret_steal<py::object>(PyObject_CallOneArg(spec_cls.ptr(), ids.ptr()));
    if (!spec) throw py::error_already_set();
    return spec;
  }
  py::object spec = bare_instance(spec_cls);
  static PyObject* const block_ids = PyUnicode_InternFromString("block_ids");
  if (PyObject_SetAttr(spec.ptr(), block_ids, filled_block_ids(new_array, slots).ptr()) != 0) {
    throw py::error_already_set();
  }
  return spec;
}

// PrepareStoreOutput(keys_to_store=, store_spec=, evicted_keys=), plain or through __init__.
py::object make_output(const py::object& output_cls, bool plain, const py::object& kwnames,
                       PyObject* to_store, PyObject* spec, PyObject* evicted) {
  PyObject* values[3] = {to_store, spec, evicted};
  if (!plain) {
    auto out = py::reinterpret_steal<py::object>(
        PyObject_Vectorcall(output_cls.ptr(), values, 0, kwnames.ptr()));
    if (!out) throw py::error_already_set();
    return out;
  }
  py::object out = bare_instance(output_cls);
  for (Py_ssize_t i = 0; i < 3; ++i) {
    if (PyObject_SetAttr(out.ptr(), PyTuple_GET_ITEM(kwnames.ptr(), i), values[i]) != 0) {
      throw py::error_already_set();
    }
  }
  return out;
}

constexpr const char* kCapsuleName = "kvoffload.vllm.FastState";

FastState* state_of(PyObject* capsule) noexcept {
  return static_cast<FastState*>(PyCapsule_GetPointer(capsule, kCapsuleName));
}

// error_already_set::restore() throws if called twice (pybind11_fail); never here, but a noexcept
// caller must not let it out.
void restore_error(py::error_already_set& e) noexcept {
  try {
    e.restore();
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "kvoffload.vllm: a Python error could not be restored");
  }
}

// Runs body; C++ exceptions become Python exceptions (kvoffload.Error for kvoffload's).
template <class Body>
PyObject* guarded(FastState* st, Body&& body) noexcept {
  try {
    return body();
  } catch (py::error_already_set& e) {
    restore_error(e);
  } catch (const Error& e) {
    try {
      py::object exc = st->error_cls(e.what(), static_cast<int>(e.code()), e.sys_errno(), e.call());
      PyErr_SetObject(st->error_cls.ptr(), exc.ptr());
    } catch (py::error_already_set& inner) {
      restore_error(inner);
    } catch (...) {
      PyErr_SetString(PyExc_RuntimeError, e.what());  // kvoffload.Error could not be built
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "kvoffload.vllm: unknown C++ exception");
  }
  return nullptr;
}

bool check_args(const char* name, Py_ssize_t nargs, Py_ssize_t want) noexcept {
  if (nargs >= 1 && nargs <= want) return true;
  PyErr_Format(PyExc_TypeError, "%s() takes the keys and req_context, got %zd positional arguments",
               name, nargs);
  return false;
}

PyObject* new_event(FastState* st, PyObject* keys, bool removed) {
  PyObject* args[3] = {keys, st->medium.ptr(), removed ? Py_True : Py_False};
  return PyObject_Vectorcall(st->event_cls.ptr(), args, 0, st->event_kwnames.ptr());
}

PyObject* fast_lookup(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (!check_args("lookup", nargs, 2)) return nullptr;
  return guarded(st, [&]() -> PyObject* {
    const int code = st->core->lookup(args[0]);
    PyObject* r = PyTuple_GET_ITEM(st->lookup_results.ptr(), code);
    Py_INCREF(r);
    return r;
  });
}

PyObject* fast_touch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (!check_args("touch", nargs, 2)) return nullptr;
  return guarded(st, [&]() -> PyObject* {
    st->core->touch(Items(args[0]));
    Py_RETURN_NONE;
  });
}

PyObject* fast_complete_load(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (!check_args("complete_load", nargs, 2)) return nullptr;
  return guarded(st, [&]() -> PyObject* {
    st->core->complete_load(Items(args[0]));
    Py_RETURN_NONE;
  });
}

PyObject* fast_prepare_load(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (!check_args("prepare_load", nargs, 2)) return nullptr;
  return guarded(st, [&]() -> PyObject* {
    return make_spec(st->spec_cls, st->new_array, st->core->prepare_load(Items(args[0])))
        .release()
        .ptr();
  });
}

PyObject* fast_prepare_store(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (!check_args("prepare_store", nargs, 2)) return nullptr;
  return guarded(st, [&]() -> PyObject* {
    const Items items(args[0]);
    const StorePlan plan = st->core->prepare_store(items);
    if (plan.slots_needed != 0) {
      // vLLM records the size of every allocation it attempts, failed ones included.
      py::int_ needed(plan.slots_needed);
      if (PyList_Append(st->alloc_sizes.ptr(), needed.ptr()) != 0) throw py::error_already_set();
    }
    if (!plan.ok()) Py_RETURN_NONE;
    py::list evicted = st->core->evicted_list(plan);
    py::list to_store = st->core->to_store_list(items, plan);
    if (!evicted.empty() && !st->events.is_none()) {
      py::object event = py::reinterpret_steal<py::object>(new_event(st, evicted.ptr(), true));
      if (!event || PyList_Append(st->events.ptr(), event.ptr()) != 0)
        throw py::error_already_set();
    }
    py::object spec = make_spec(st->spec_cls, st->new_array, plan.slots);
    return make_output(st->output_cls, st->plain_output, st->output_kwnames, to_store.ptr(),
                       spec.ptr(), evicted.ptr())
        .release()
        .ptr();
  });
}

// complete_store(keys, req_context, success=True)
PyObject* fast_complete_store(PyObject* self, PyObject* const* args, Py_ssize_t nargsf,
                              PyObject* kwnames) {
  FastState* st = state_of(self);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* success_obj = nargs >= 3 ? args[2] : nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_CompareWithASCIIString(name, "success") == 0 && success_obj == nullptr) {
      success_obj = args[nargs + i];
    } else if (PyUnicode_CompareWithASCIIString(name, "req_context") != 0 || nargs >= 2) {
      PyErr_Format(PyExc_TypeError, "complete_store() got an unexpected keyword argument %R", name);
      return nullptr;
    }
  }
  if (nargs < 1 || nargs > 3) {
    PyErr_Format(PyExc_TypeError,
                 "complete_store() takes keys, req_context and success, got %zd arguments", nargs);
    return nullptr;
  }
  int success = 1;
  if (success_obj != nullptr && (success = PyObject_IsTrue(success_obj)) < 0) return nullptr;
  return guarded(st, [&]() -> PyObject* {
    const Items items(args[0]);
    const auto done = st->core->complete_store(items, success != 0);
    if (success != 0 && !done.empty() && !st->events.is_none()) {
      py::list stored = VllmManagerCore::pick(items, done);
      py::object event = py::reinterpret_steal<py::object>(new_event(st, stored.ptr(), false));
      if (!event || PyList_Append(st->events.ptr(), event.ptr()) != 0)
        throw py::error_already_set();
    }
    Py_RETURN_NONE;
  });
}

// (write_pending, pinned, stores_skipped), what get_stats reads once per scheduler step, as a
// fast entry point too: between two steps the interpreter evicts pybind11's dispatch path from
// the caches, and through VllmManagerCore.counters this one read cost 4 µs there (0.2 µs hot).
PyObject* fast_occupancy(PyObject* self, PyObject* const* /*args*/, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (nargs != 0) {
    PyErr_Format(PyExc_TypeError, "_occupancy() takes no arguments, got %zd", nargs);
    return nullptr;
  }
  return guarded(st, [&]() -> PyObject* {
    const ManagerStats s = st->core->manager().stats();
    return Py_BuildValue("(KKK)", static_cast<unsigned long long>(s.write_pending),
                         static_cast<unsigned long long>(s.pinned),
                         static_cast<unsigned long long>(s.stores_skipped_threshold));
  });
}

// The per-request and per-step hooks. vLLM's own are Python methods returning a constant (a new
// RequestOffloadingContext, None, False); as C functions they cost a call and no frame.
// on_new_request builds its context as RequestOffloadingContext() does: through the constructor,
// or, when kvoffload.vllm found the class a plain dataclass whose instances hold only constant
// defaults, as a bare instance given those attributes (Note [Plain result objects]).
PyObject* fast_on_new_request(PyObject* self, PyObject* const* /*args*/, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (nargs != 1) {
    PyErr_Format(PyExc_TypeError, "on_new_request() takes the req_context, got %zd arguments",
                 nargs);
    return nullptr;
  }
  return guarded(st, [&]() -> PyObject* {
    if (st->context_fields.is_none()) {
      PyObject* out = PyObject_CallNoArgs(st->context_cls.ptr());
      if (out == nullptr) throw py::error_already_set();
      return out;
    }
    py::object out = bare_instance(st->context_cls);
    PyObject* name = nullptr;
    PyObject* value = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(st->context_fields.ptr(), &pos, &name, &value)) {
      if (PyObject_SetAttr(out.ptr(), name, value) != 0) throw py::error_already_set();
    }
    return out.release().ptr();
  });
}

PyObject* fast_on_request_finished(PyObject* /*self*/, PyObject* const* /*args*/,
                                   Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_Format(PyExc_TypeError, "on_request_finished() takes the req_context, got %zd arguments",
                 nargs);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* fast_on_schedule_end(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_Format(PyExc_TypeError, "on_schedule_end() takes the context, got %zd arguments", nargs);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* fast_has_pending_work(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t nargs) {
  if (nargs != 0) {
    PyErr_Format(PyExc_TypeError, "has_pending_work() takes no arguments, got %zd", nargs);
    return nullptr;
  }
  Py_RETURN_FALSE;
}

// take_events(): the events recorded since the last call, as a list (vLLM's is a generator that
// yields them and then clears the list; the scheduler drains it at once); () with events off.
PyObject* fast_take_events(PyObject* self, PyObject* const* /*args*/, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (nargs != 0) {
    PyErr_Format(PyExc_TypeError, "take_events() takes no arguments, got %zd", nargs);
    return nullptr;
  }
  if (st->events.is_none()) return PyTuple_New(0);
  PyObject* events = st->events.ptr();
  const Py_ssize_t n = PyList_GET_SIZE(events);
  PyObject* out = PyList_GetSlice(events, 0, n);
  if (out == nullptr) return nullptr;
  if (n > 0 && PyList_SetSlice(events, 0, n, nullptr) != 0) {
    Py_DECREF(out);
    return nullptr;
  }
  return out;
}

// get_stats(): CPUOffloadingManager.get_stats's metrics in one call (Note [Stats in C]).
PyObject* fast_get_stats(PyObject* self, PyObject* const* /*args*/, Py_ssize_t nargs) {
  FastState* st = state_of(self);
  if (nargs != 0) {
    PyErr_Format(PyExc_TypeError, "get_stats() takes no arguments, got %zd", nargs);
    return nullptr;
  }
  return guarded(st, [&]() -> PyObject* {
    const Manager& m = st->core->manager();
    const ManagerStats s = m.stats();
    const double n = static_cast<double>(m.num_chunks());
    const double usage = n > 0 ? static_cast<double>(s.write_pending + s.pinned) / n : 0.0;
    const double write_usage = n > 0 ? static_cast<double>(s.write_pending) / n : 0.0;
    long long skipped = -1;
    if (st->core->counts_skipped()) {
      skipped = static_cast<long long>(s.stores_skipped_threshold - st->skipped_reported);
      st->skipped_reported = s.stores_skipped_threshold;
    }
    return build_stats(*st->stats, usage, write_usage, std::max(usage - write_usage, 0.0),
                       py::reinterpret_borrow<py::list>(st->alloc_sizes), skipped)
        .release()
        .ptr();
  });
}

PyMethodDef kFastMethods[] = {
    {"lookup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_lookup)),
     METH_FASTCALL, "lookup(key, req_context) -> LookupResult"},
    {"touch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_touch)),
     METH_FASTCALL, "touch(keys, req_context)"},
    {"prepare_load", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_prepare_load)),
     METH_FASTCALL, "prepare_load(keys, req_context) -> CPULoadStoreSpec"},
    {"complete_load",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_complete_load)), METH_FASTCALL,
     "complete_load(keys, req_context)"},
    {"prepare_store",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_prepare_store)), METH_FASTCALL,
     "prepare_store(keys, req_context) -> PrepareStoreOutput | None"},
    {"complete_store",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_complete_store)),
     METH_FASTCALL | METH_KEYWORDS, "complete_store(keys, req_context, success=True)"},
    {"_occupancy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_occupancy)),
     METH_FASTCALL, "_occupancy() -> (write_pending, pinned, stores_skipped), as counters()"},
    {"on_new_request",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_on_new_request)),
     METH_FASTCALL, "on_new_request(req_context) -> RequestOffloadingContext"},
    {"on_request_finished",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_on_request_finished)),
     METH_FASTCALL, "on_request_finished(req_context)"},
    {"take_events", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_take_events)),
     METH_FASTCALL, "take_events() -> the events since the last call"},
};

// Installed only when vLLM's base class has the hook and its default returns a constant
// (kvoffload.vllm checks), and get_stats only with a stats template.
PyMethodDef kStepHooks[] = {
    {"on_schedule_end",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_on_schedule_end)),
     METH_FASTCALL, "on_schedule_end(context)"},
    {"has_pending_work",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_has_pending_work)),
     METH_FASTCALL, "has_pending_work() -> False"},
};
PyMethodDef kGetStats = {
    "get_stats", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_get_stats)),
    METH_FASTCALL, "get_stats() -> OffloadingConnectorStats"};

}  // namespace

void bind_vllm_manager(py::module_& m) {
  py::class_<VllmManagerCore>(m, "VllmManagerCore",
                              R"(The C++ side of kvoffload.vllm.KvoffloadManager (use that class).

A Manager with vLLM's CPUOffloadingManager semantics over bytes keys (hashed to 128 bits in C++).)")
      .def(py::init([](std::uint64_t num_blocks, const std::string& policy,
                       std::uint32_t store_threshold, std::uint64_t max_tracker_size,
                       std::optional<std::uint64_t> ready_chunks) {
             ManagerConfig c;
             c.num_chunks = num_blocks;
             c.ready_chunks = ready_chunks;
             c.policy = parse_policy_kind(policy);
             c.store_threshold = store_threshold;
             c.threshold_tracker_capacity = max_tracker_size;
             c.record_events = false;  // the adapter builds vLLM's events from the results
             c.semantics = ManagerSemantics::kVllm;
             return std::make_unique<VllmManagerCore>(c);
           }),
           py::arg("num_blocks"), py::arg("policy"), py::arg("store_threshold"),
           py::arg("max_tracker_size"), py::arg("ready_chunks") = py::none())
      .def("follow_readiness", &VllmManagerCore::follow_readiness, py::arg("region"),
           "Hand out only the chunks every rank of `region` (an unranked mapping, in background "
           "mode) has brought up; the mapping is dropped once all are (Note [Ready prefix])")
      .def("refresh_ready", &VllmManagerCore::refresh_ready,
           "Grow the ready prefix now (prepare_store does it before each plan)")
      .def("publish_live_stats", &VllmManagerCore::publish_live_stats, py::arg("region"),
           "Mirror the manager's occupancy and counters into `region`'s live statistics page "
           "(an unranked mapping), as kvoffload run's scheduler does; None stops (Note [Live "
           "page of a vLLM scheduler])")
      .def_property_readonly("publishing_live_stats", &VllmManagerCore::publishing_live_stats)
      .def_property_readonly("ready_chunks", &VllmManagerCore::ready_chunks)
      .def_property_readonly("following_readiness", &VllmManagerCore::following_readiness)
      .def(
          "fast_methods",
          [](const py::object& self, py::object error_cls, py::tuple lookup_results,
             py::object spec_cls, py::object output_cls, py::object event_cls, py::object medium,
             py::object events, py::list alloc_sizes, py::object new_array, bool plain_output,
             py::object context_cls, py::object context_fields, const py::object& stats_template,
             const std::vector<std::string>& step_hooks) {
            if (lookup_results.size() != 3) {
              throw Error(ErrorCode::kInvalidArgument,
                          "fast_methods: lookup_results needs (MISS, HIT, HIT_PENDING)");
            }
            auto state = std::make_unique<FastState>();
            state->owner = self;
            state->core = &self.cast<VllmManagerCore&>();
            state->error_cls = std::move(error_cls);
            state->lookup_results = std::move(lookup_results);
            state->spec_cls = std::move(spec_cls);
            state->output_cls = std::move(output_cls);
            state->event_cls = std::move(event_cls);
            state->medium = std::move(medium);
            state->events = std::move(events);
            state->alloc_sizes = std::move(alloc_sizes);
            state->output_kwnames = py::make_tuple("keys_to_store", "store_spec", "evicted_keys");
            state->event_kwnames = py::make_tuple("keys", "medium", "removed");
            state->new_array = std::move(new_array);
            state->plain_output = plain_output;
            state->context_cls = std::move(context_cls);
            if (!context_fields.is_none() && !PyDict_Check(context_fields.ptr())) {
              throw Error(ErrorCode::kInvalidArgument,
                          "fast_methods: context_fields must be a dict or None");
            }
            state->context_fields = std::move(context_fields);
            if (!stats_template.is_none()) {
              state->stats = StatsTemplate::from(stats_template.cast<py::tuple>());
            }
            const bool with_stats = state->stats.has_value();
            py::capsule capsule(state.get(), kCapsuleName, [](PyObject* c) {
              delete static_cast<FastState*>(PyCapsule_GetPointer(c, kCapsuleName));
            });
            (void)state.release();  // owned by the capsule from here on
            py::dict out;
            auto add = [&](PyMethodDef& def) {
              PyObject* f = PyCFunction_NewEx(&def, capsule.ptr(), nullptr);
              if (f == nullptr) throw py::error_already_set();
              out[def.ml_name] = py::reinterpret_steal<py::object>(f);
            };
            for (PyMethodDef& def : kFastMethods) add(def);
            for (const std::string& name : step_hooks) {
              auto* def = std::find_if(std::begin(kStepHooks), std::end(kStepHooks),
                                       [&](const PyMethodDef& d) { return name == d.ml_name; });
              if (def == std::end(kStepHooks)) {
                throw Error(ErrorCode::kInvalidArgument,
                            "fast_methods: step_hooks names " + name +
                                "; allowed: on_schedule_end, has_pending_work");
              }
              add(*def);
            }
            if (with_stats) add(kGetStats);
            return out;
          },
          py::arg("error_cls"), py::arg("lookup_results"), py::arg("spec_cls"),
          py::arg("output_cls"), py::arg("event_cls"), py::arg("medium"), py::arg("events"),
          py::arg("alloc_sizes"), py::arg("new_array") = py::none(),
          py::arg("plain_output") = false, py::arg("context_cls") = py::none(),
          py::arg("context_fields") = py::none(), py::arg("stats_template") = py::none(),
          py::arg("step_hooks") = std::vector<std::string>{},
          "The hot methods as C functions over vLLM's types (Note [Fast entry points]); "
          "new_array / plain_output / context_fields: Note [Plain result objects]; "
          "stats_template: Note [Stats in C] (get_stats is included only with one); step_hooks: "
          "which of on_schedule_end, has_pending_work to include")
      .def_static(
          "build_stats",
          [](const py::tuple& stats_template, double usage, double write_usage, double read_usage,
             const py::list& sizes, std::optional<long long> skipped) {
            return build_stats(StatsTemplate::from(stats_template), usage, write_usage, read_usage,
                               sizes, skipped.value_or(-1));
          },
          py::arg("stats_template"), py::arg("usage"), py::arg("write_usage"),
          py::arg("read_usage"), py::arg("sizes"), py::arg("skipped"),
          "The stats get_stats builds from these values (the check of Note [Stats in C]); "
          "empties `sizes`")
      .def_static(
          "plain_spec",
          [](const py::object& spec_cls, const py::object& new_array,
             const std::vector<SlotIndex>& ids) { return make_spec(spec_cls, new_array, ids); },
          py::arg("spec_cls"), py::arg("new_array"), py::arg("block_ids"),
          "A spec as prepare_load builds it (the conformance check of Note [Plain result objects])")
      .def_static(
          "plain_output",
          [](const py::object& output_cls, const py::object& to_store, const py::object& spec,
             const py::object& evicted) {
            return make_output(output_cls, true,
                               py::make_tuple("keys_to_store", "store_spec", "evicted_keys"),
                               to_store.ptr(), spec.ptr(), evicted.ptr());
          },
          py::arg("output_cls"), py::arg("keys_to_store"), py::arg("store_spec"),
          py::arg("evicted_keys"), "A PrepareStoreOutput as prepare_store builds it, plain")
      .def("reset", &VllmManagerCore::reset)
      .def("counters", &VllmManagerCore::counters, "(write_pending, pinned, stores_skipped) so far")
      .def("threshold_count", &VllmManagerCore::threshold_count, py::arg("key"),
           "Lookups the store-threshold tracker holds for key (0 when it is not tracked)")
      .def("slot_of", &VllmManagerCore::slot_of, py::arg("key"))
      .def_property_readonly("policy", [](const VllmManagerCore& c) {
        return std::string(c.manager().policy().name());
      });
}

}  // namespace kvoffload::python
