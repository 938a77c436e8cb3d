// kvoffload._kvoffload.SglangStoreCore: the C++ half of kvoffload.sglang.KvoffloadStorage, SGLang's
// HiCache storage backend (python/kvoffload/sglang.py): the remote tier (Redis, Redis Cluster,
// memcached) or the file tier, read and written straight from and into SGLang's host KV pool.
//
// Note [Pages and pieces]: SGLang names a page by a hash string and describes where it lives in
// the host pool with get_page_buffer_meta(): a list of (pointer, bytes), the same number of
// pieces per page (MHA page_first: K then V; MLA: one). Each piece is one tier value under the
// BlockKey hash128(utf-8 key, 0, tag + piece index): tag 0 for the zero-copy pieces, another tag
// for the legacy flat pages SGLang copies (kLegacyTag in sglang.py), so one store never mixes the
// two forms. A page succeeds when every one of its pieces does. No byte passes through Python:
// the tiers read the pieces for a put and write them on a verified get (nothing on a miss, in the
// remote tier; the file tier, like the vLLM tier, verifies in place, see open_file).
//
// Note [Bounded calls]: SGLang calls these from its storage threads and gives up on a prefetch
// at its budget (2 s + 0.1 s per 1k tokens); an exception or a hang kills its thread. Every call
// here waits only for batches whose deadlines the tier enforces (the remote tier's get/put
// timeouts, from submission) or local I/O, with the GIL released; a wait never returns before the
// batch is ready, because the tier writes into SGLang's pages until then (a page SGLang freed on
// an early return would be written later). Existence checks poll the tier's asynchronous lookup
// until every key is resolved or `budget_ms` passed, then count what is unresolved as absent.
//
// Remote values have one size per RemoteTier (its geometry), so the remote store opens one tier
// per value size it meets (the pieces, the flat pages, a draft pool's flat pages); prepare()
// opens the ones SGLang's pool implies up front, so the storage threads do not pay the connect.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>
#include <kvoffload/hash.hpp>
#include <kvoffload/remote_tier.hpp>
#include <kvoffload/tier.hpp>

#include "bindings.hpp"
#include "stats_dict.hpp"

namespace py = pybind11;

namespace kvoffload::python {
namespace {

using Clock = std::chrono::steady_clock;

// The BlockKey of piece `piece` of the page named `key` (Note [Pages and pieces]).
BlockKey piece_key(std::string_view key, unsigned tag, std::size_t piece) {
  std::string buf;
  buf.reserve(key.size() + 2);
  buf.append(key);
  buf.push_back('\0');
  buf.push_back(static_cast<char>(static_cast<unsigned char>(tag + piece)));
  const Hash128 h = hash_bytes_128(buf.data(), buf.size());
  return BlockKey(h.hi, h.lo);
}

std::string_view key_text(PyObject* obj) {
  Py_ssize_t n = 0;
  const char* s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, &n) : nullptr;
  if (s == nullptr) {
    PyErr_Clear();
    throw Error(ErrorCode::kInvalidArgument,
                std::string("kvoffload.sglang: a page key is a str, got ") + Py_TYPE(obj)->tp_name);
  }
  return {s, static_cast<std::size_t>(n)};
}

// Pages of one call: the keys of their pieces and, for I/O, where each piece lives.
struct Pages {
  std::size_t pages = 0;
  std::size_t pieces = 0;  // per page
  std::vector<BlockKey> keys;
  std::vector<std::uintptr_t> ptrs;
  std::vector<std::uint64_t> sizes;
};

Pages pages_of(const py::sequence& keys, unsigned tag, std::size_t pieces) {
  if (tag + pieces > 256) {
    throw Error(ErrorCode::kInvalidArgument, "kvoffload.sglang: " + std::to_string(pieces) +
                                                 " pieces per page with tag " +
                                                 std::to_string(tag) + " exceed 256 pieces");
  }
  Pages p;
  p.pages = keys.size();
  p.pieces = pieces;
  p.keys.reserve(p.pages * pieces);
  for (std::size_t i = 0; i < p.pages; ++i) {
    const std::string_view k = key_text(keys[i].ptr());
    for (std::size_t j = 0; j < pieces; ++j) p.keys.push_back(piece_key(k, tag, j));
  }
  return p;
}

Pages pages_of(const py::sequence& keys, const std::vector<std::uintptr_t>& ptrs,
               const std::vector<std::uint64_t>& sizes, unsigned tag) {
  if (keys.size() == 0 || ptrs.size() % keys.size() != 0 || ptrs.size() != sizes.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "kvoffload.sglang: " + std::to_string(keys.size()) + " keys with " +
                    std::to_string(ptrs.size()) + " pointers and " + std::to_string(sizes.size()) +
                    " sizes: expected the same number of pieces for every page");
  }
  Pages p = pages_of(keys, tag, ptrs.size() / keys.size());
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    if (ptrs[i] == 0 || sizes[i] == 0) {
      throw Error(ErrorCode::kInvalidArgument, "kvoffload.sglang: piece " + std::to_string(i) +
                                                   " has pointer " + std::to_string(ptrs[i]) +
                                                   " and " + std::to_string(sizes[i]) +
                                                   " bytes; both must be non-zero");
    }
  }
  p.ptrs = ptrs;
  p.sizes = sizes;
  return p;
}

// A value's bytes on the wire beyond its payload, at most: the 64-byte header, the key and the
// request's framing.
constexpr std::uint64_t kWireOverhead = 256;

class SglangStoreCore {
 public:
  explicit SglangStoreCore(RemoteTierOptions base) : remote_(std::move(base)) {}
  explicit SglangStoreCore(FileTierOptions file) : file_(std::move(file)) { reopen_file(); }
  ~SglangStoreCore() { close(); }
  SglangStoreCore(const SglangStoreCore&) = delete;
  SglangStoreCore& operator=(const SglangStoreCore&) = delete;

  // Opens the tier for values of `bytes` now (remote; the file tier holds every size).
  void prepare(std::uint64_t bytes) {
    py::gil_scoped_release release;
    (void)tier_for(bytes);
  }

  // Stores every page; one bool per page (all of its pieces stored).
  std::vector<bool> put(const py::sequence& keys, const std::vector<std::uintptr_t>& ptrs,
                        const std::vector<std::uint64_t>& sizes, unsigned tag) {
    const Pages p = pages_of(keys, ptrs, sizes, tag);
    std::vector<bool> ok(p.pages, true);
    py::gil_scoped_release release;
    run(p, ok, /*load=*/false);
    return ok;
  }

  // Reads every page into its pieces; one bool per page (all of its pieces verified).
  std::vector<bool> get(const py::sequence& keys, const std::vector<std::uintptr_t>& ptrs,
                        const std::vector<std::uint64_t>& sizes, unsigned tag) {
    const Pages p = pages_of(keys, ptrs, sizes, tag);
    std::vector<bool> ok(p.pages, true);
    py::gil_scoped_release release;
    run(p, ok, /*load=*/true);
    return ok;
  }

  // How many pages from the first are present (every piece of `piece_bytes`), asking the tier's
  // asynchronous lookup until each key is resolved or `budget_ms` passed (Note [Bounded calls]).
  std::size_t exists(const py::sequence& keys, std::size_t pieces, std::uint64_t piece_bytes,
                     unsigned tag, unsigned budget_ms) {
    const Pages p = pages_of(keys, tag, pieces);
    if (p.keys.empty()) return 0;
    py::gil_scoped_release release;
    const std::shared_ptr<SecondaryTier> tier = tier_for(piece_bytes);
    std::vector<TierPresence> answer(p.keys.size(), TierPresence::kPending);
    const auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
    std::vector<std::size_t> pending(p.keys.size());
    for (std::size_t i = 0; i < pending.size(); ++i) pending[i] = i;
    std::vector<BlockKey> ask;
    std::vector<TierPresence> out;
    auto pause = std::chrono::microseconds(200);
    while (true) {
      ask.clear();
      for (const std::size_t i : pending) ask.push_back(p.keys[i]);
      out.assign(ask.size(), TierPresence::kPending);
      tier->lookup(ask, out);
      std::size_t keep = 0;
      for (std::size_t n = 0; n < pending.size(); ++n) {
        answer[pending[n]] = out[n];
        if (out[n] == TierPresence::kPending) pending[keep++] = pending[n];
      }
      pending.resize(keep);
      if (pending.empty() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(5000));
    }
    std::size_t hits = 0;
    for (; hits < p.pages; ++hits) {
      for (std::size_t j = 0; j < p.pieces; ++j) {
        if (answer[hits * p.pieces + j] != TierPresence::kPresent) return hits;
      }
    }
    return hits;
  }

  // Forgets everything: the remote tiers are reopened (what they remember of the store is
  // dropped; the shared values stay for the other instances), the file tier's records are
  // removed. Waits for the batches in flight.
  void clear() {
    py::gil_scoped_release release;
    std::map<std::uint64_t, std::shared_ptr<SecondaryTier>> old;
    {
      std::lock_guard lock(mutex_);
      old.swap(tiers_);
    }
    for (auto& [bytes, tier] : old) tier->close();
    if (file_) {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(file_->root, ec)) {
        if (entry.path().filename().string().size() == 2 && entry.is_directory()) {
          std::filesystem::remove_all(entry.path(), ec);
        }
      }
      reopen_file();
    }
  }

  // One stats dict per tier: (value bytes or 0 for the file tier, kind, stats).
  py::list stats() const {
    std::map<std::uint64_t, std::shared_ptr<SecondaryTier>> tiers;
    {
      std::lock_guard lock(mutex_);
      tiers = tiers_;
    }
    py::list out;
    for (const auto& [bytes, tier] : tiers) {
      if (const auto* r = dynamic_cast<const RemoteTier*>(tier.get())) {
        out.append(py::make_tuple(bytes, "remote", stats_dict(r->remote_stats())));
      } else {
        out.append(py::make_tuple(bytes, "file", stats_dict(tier->stats())));
      }
    }
    return out;
  }

  std::string store_key(const std::string& key, unsigned tag, std::size_t piece,
                        std::uint64_t bytes) {
    const auto tier = tier_for(bytes);
    const auto* r = dynamic_cast<const RemoteTier*>(tier.get());
    if (r == nullptr) throw Error(ErrorCode::kState, "kvoffload.sglang: not a remote store");
    return r->store_key(piece_key(key, tag, piece), 0);
  }

  std::string record_path(const std::string& key, unsigned tag, std::size_t piece) {
    const auto tier = tier_for(0);
    const auto* f = dynamic_cast<const FileTier*>(tier.get());
    if (f == nullptr) throw Error(ErrorCode::kState, "kvoffload.sglang: not a file store");
    return f->record_path(piece_key(key, tag, piece)).string();
  }

  bool close() noexcept {
    std::map<std::uint64_t, std::shared_ptr<SecondaryTier>> old;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      old.swap(tiers_);
    }
    bool ok = true;
    for (auto& [bytes, tier] : old) ok = tier->close() && ok;
    return ok;
  }

 private:
  void reopen_file() {
    std::shared_ptr<SecondaryTier> tier = FileTier::open(*file_);
    std::lock_guard lock(mutex_);
    tiers_[0] = std::move(tier);
  }

  std::shared_ptr<SecondaryTier> tier_for(std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    if (closed_) throw Error(ErrorCode::kState, "kvoffload.sglang: the store is closed");
    if (file_) {
      const auto it = tiers_.find(0);
      if (it == tiers_.end()) throw Error(ErrorCode::kState, "kvoffload.sglang: no file tier");
      return it->second;
    }
    if (const auto it = tiers_.find(bytes); it != tiers_.end()) return it->second;
    RemoteTierOptions o = *remote_;
    o.geometry.slot_bytes = bytes;
    o.name = remote_->name + "/" + std::to_string(bytes);
    // Bounded by connect_timeout; an unreachable store is a warning, refused credentials throw
    // (and leave no entry behind).
    std::shared_ptr<SecondaryTier> tier = RemoteTier::open(o);
    tiers_.emplace(bytes, tier);
    return tier;
  }

  // One batch per value size (remote) or one (file), submitted together and waited for. Remote
  // puts go in waves of at most a quarter of the tier's send queue (max_queued_bytes, counted
  // with each value's header and request framing), each waited for before the next: SGLang backs
  // up 128 pages a call (1 GiB of 8 MiB pages), a put beyond the queue is refused at once rather
  // than queued, and the queue may still hold the tail of the previous wave's accounting.
  void run(const Pages& p, std::vector<bool>& ok, bool load) {
    std::map<std::uint64_t, std::vector<std::size_t>> by_size;
    for (std::size_t i = 0; i < p.keys.size(); ++i) by_size[file_ ? 0 : p.sizes[i]].push_back(i);
    std::vector<std::pair<std::uint64_t, std::vector<std::size_t>>> groups;
    const bool waves = !load && remote_.has_value();
    const std::uint64_t wave_bytes =
        waves ? std::max<std::uint64_t>(remote_->max_queued_bytes / 4, 1) : 0;
    for (auto& [bytes, items] : by_size) {
      if (!waves) {
        groups.emplace_back(bytes, std::move(items));
        continue;
      }
      std::vector<std::size_t> wave;
      std::uint64_t in_wave = 0;
      for (const std::size_t i : items) {
        const std::uint64_t wire = p.sizes[i] + kWireOverhead;
        if (!wave.empty() && in_wave + wire > wave_bytes) {
          groups.emplace_back(bytes, std::move(wave));
          wave.clear();
          in_wave = 0;
        }
        wave.push_back(i);
        in_wave += wire;
      }
      if (!wave.empty()) groups.emplace_back(bytes, std::move(wave));
    }
    std::vector<std::pair<TierBatch, const std::vector<std::size_t>*>> batches;
    std::vector<std::shared_ptr<SecondaryTier>> held;  // alive until their batches are waited for
    for (const auto& [bytes, items] : groups) {
      std::shared_ptr<SecondaryTier> tier;
      try {
        tier = tier_for(bytes);
      } catch (const Error&) {
        for (const std::size_t i : items) ok[i / p.pieces] = false;
        continue;
      }
      batches.emplace_back(submit(*tier, p, items, load), &items);
      held.push_back(std::move(tier));
      if (waves) collect(batches, p, ok);
    }
    collect(batches, p, ok);
  }

  static TierBatch submit(SecondaryTier& tier, const Pages& p,
                          const std::vector<std::size_t>& items, bool load) {
    if (load) {
      std::vector<TierGet> gets;
      gets.reserve(items.size());
      for (const std::size_t i : items) {
        gets.push_back(
            {p.keys[i], std::span<std::byte>(reinterpret_cast<std::byte*>(p.ptrs[i]), p.sizes[i])});
      }
      return tier.get(gets);
    }
    std::vector<TierPut> puts;
    puts.reserve(items.size());
    for (const std::size_t i : items) {
      puts.push_back({p.keys[i], std::span<const std::byte>(
                                     reinterpret_cast<const std::byte*>(p.ptrs[i]), p.sizes[i])});
    }
    return tier.put(puts);
  }

  // Waits for every batch (Note [Bounded calls]) and marks the pages whose pieces failed.
  void collect(std::vector<std::pair<TierBatch, const std::vector<std::size_t>*>>& batches,
               const Pages& p, std::vector<bool>& ok) {
    for (const auto& [batch, items] : batches) {
      const std::vector<TierItemResult> results = batch.wait();
      for (std::size_t n = 0; n < results.size(); ++n) {
        if (results[n].status == TierItemStatus::kOk) continue;
        ok[(*items)[n] / p.pieces] = false;
        if (results[n].status == TierItemStatus::kFailed) note_failure(results[n]);
      }
    }
    batches.clear();
  }

  void note_failure(const TierItemResult& r) {
    std::lock_guard lock(mutex_);
    last_failure_ = std::string(to_string(r.status)) + (r.detail.empty() ? "" : ": " + r.detail);
  }

 public:
  // The last item failure (an error, not a miss) of any call, for the caller's warning; "" none.
  std::string take_last_failure() {
    std::lock_guard lock(mutex_);
    return std::exchange(last_failure_, std::string());
  }

 private:
  std::string last_failure_;
  std::optional<RemoteTierOptions> remote_;
  std::optional<FileTierOptions> file_;
  mutable std::mutex mutex_;
  bool closed_ = false;
  std::map<std::uint64_t, std::shared_ptr<SecondaryTier>> tiers_;  // by value bytes (file: 0)
};

FsyncPolicy fsync_policy(const std::string& s) {
  if (s == "none") return FsyncPolicy::kNone;
  if (s == "data") return FsyncPolicy::kData;
  if (s == "full") return FsyncPolicy::kFull;
  throw Error(ErrorCode::kInvalidArgument,
              "fsync '" + s + "' is not one of 'none', 'data', 'full'");
}

}  // namespace

void bind_sglang_store(py::module_& m) {
  py::class_<SglangStoreCore>(m, "SglangStoreCore", R"(The C++ half of kvoffload.sglang's HiCache
storage backend: pages of SGLang's host KV pool read and written in place by a RemoteTier or a
FileTier, each call bounded (waits only on the tier's own deadlines, GIL released).)")
      .def_static(
          "open_remote",
          [](const RemoteTierOptions& base) {
            base.validate();
            return std::make_unique<SglangStoreCore>(base);
          },
          py::arg("options"),
          "A remote store; options' geometry names the pages (its slot_bytes is set per value "
          "size). Opens no connection until prepare() or the first call.")
      .def_static(
          "open_file",
          [](const std::string& root, unsigned io_threads, unsigned read_threads,
             std::uint64_t capacity_bytes, bool direct_io, const std::string& fsync,
             const std::string& name, bool shared) {
            FileTierOptions o;
            o.root = root;
            o.io_threads = io_threads;
            o.read_threads = read_threads;
            o.capacity_bytes = capacity_bytes;
            o.direct_io = direct_io ? DirectIoMode::kAuto : DirectIoMode::kBuffered;
            o.fsync = fsync_policy(fsync);
            o.name = name;
            o.shared = shared;  // every instance of the model on the directory (Note [Shared root])
            // SGLang releases the host pages of a page that did not load (the prefetch stops at
            // the first failed page and frees the rest), so records are read straight into the
            // pages and verified there, without a bounce copy.
            o.verify_in_destination = true;
            py::gil_scoped_release release;  // indexes the records a previous run left
            return std::make_unique<SglangStoreCore>(std::move(o));
          },
          py::arg("root"), py::arg("io_threads"), py::arg("read_threads"),
          py::arg("capacity_bytes"), py::arg("direct_io") = true, py::arg("fsync") = "none",
          py::arg("name") = "sglang-file", py::arg("shared") = true)
      .def("prepare", &SglangStoreCore::prepare, py::arg("value_bytes"))
      .def("put", &SglangStoreCore::put, py::arg("keys"), py::arg("ptrs"), py::arg("sizes"),
           py::arg("tag"), "Stores each page's pieces; one bool per page.")
      .def("get", &SglangStoreCore::get, py::arg("keys"), py::arg("ptrs"), py::arg("sizes"),
           py::arg("tag"), "Reads each page's pieces in place; one bool per page.")
      .def("exists", &SglangStoreCore::exists, py::arg("keys"), py::arg("pieces"),
           py::arg("piece_bytes"), py::arg("tag"), py::arg("budget_ms"),
           "How many pages from the first have every piece present.")
      .def("take_last_failure", &SglangStoreCore::take_last_failure,
           "The last failed item's reason since the previous call (an error, not a miss); \"\" "
           "when none.")
      .def("clear", &SglangStoreCore::clear)
      .def("stats", &SglangStoreCore::stats,
           "[(value bytes (0: file), 'remote' | 'file', stats dict)] per tier opened.")
      .def("store_key", &SglangStoreCore::store_key, py::arg("key"), py::arg("tag"),
           py::arg("piece"), py::arg("value_bytes"))
      .def("record_path", &SglangStoreCore::record_path, py::arg("key"), py::arg("tag"),
           py::arg("piece"))
      .def("close", &SglangStoreCore::close, py::call_guard<py::gil_scoped_release>(),
           "Drains and closes every tier. Idempotent.");
}

}  // namespace kvoffload::python
