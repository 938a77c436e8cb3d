// kvoffload._kvoffload.VllmTierCore: the C++ half of kvoffload.vllm's secondary tiers for vLLM's
// TieringOffloadingSpec (python/kvoffload/vllm/tiers.py): a FileTier or a RemoteTier over the
// primary tier's CPU KV cache, which vLLM hands to a secondary tier as a memoryview of
// (num_blocks, row bytes).
//
// A vLLM transfer job (job id, OffloadKeys, primary block ids) becomes one tier batch whose items
// read (store) or write (load) the rows of those blocks in place: no copy through Python. poll()
// hands back the jobs whose batches finished, with the keys that succeeded and the batch's own
// transfer time (TierBatch::finished_at), so a job that waited a scheduler step to be polled does
// not report that step as I/O time.
//
// Note [Scheduler thread]: every method is called on vLLM's scheduler thread and must not block
// it. Submissions, lookups and polls only queue work or read state (the GIL is released while the
// tier queues a batch, which takes its locks); drain() and close() wait for I/O and release the
// GIL for it. The remote tier's existence checks are batched per step: lookup() answers from what
// the tier remembers (RemoteTier::known) and collects the keys it has no answer for, and
// flush_lookups() (vLLM's on_schedule_end) asks them in one lookup() batch, one pipelined EXISTS
// per node, instead of one round trip per key.
//
// The primary buffer is held (a Py_buffer export) until close(): the tier's I/O threads read and
// write it, so close() first drains and closes the tier, then releases the export (vLLM releases
// its memoryview after shutting its tiers down).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <kvoffload/error.hpp>
#include <kvoffload/file_tier.hpp>
#include <kvoffload/remote_tier.hpp>
#include <kvoffload/tier.hpp>

#include "bindings.hpp"
#include "stats_dict.hpp"
#include "vllm_keys.hpp"

namespace py = pybind11;

namespace kvoffload::python {
namespace {

using Clock = std::chrono::steady_clock;

struct TierJob {
  std::int64_t id = 0;
  bool load = false;
  TierBatch batch;
  Clock::time_point submitted{};
};

class VllmTierCore {
 public:
  VllmTierCore(std::unique_ptr<SecondaryTier> tier, RemoteTier* remote,
               std::unique_ptr<py::buffer_info> primary, std::uint64_t row_bytes)
      : primary_(std::move(primary)), tier_(std::move(tier)), remote_(remote), row_(row_bytes) {
    base_ = static_cast<std::byte*>(primary_->ptr);
    rows_ = bytes_of(*primary_) / row_;
  }
  ~VllmTierCore() {
    // Destroyed with the GIL held (pybind11's dealloc): the tier drains before the buffer goes.
    tier_.reset();
  }
  VllmTierCore(const VllmTierCore&) = delete;
  VllmTierCore& operator=(const VllmTierCore&) = delete;

  static std::uint64_t bytes_of(const py::buffer_info& b) {
    return static_cast<std::uint64_t>(b.size) * static_cast<std::uint64_t>(b.itemsize);
  }

  // The primary buffer as vLLM gives it: writable, C-contiguous, a whole number of rows.
  static std::unique_ptr<py::buffer_info> request_primary(const py::buffer& primary,
                                                          std::uint64_t row_bytes) {
    auto info = std::make_unique<py::buffer_info>(primary.request(/*writable=*/true));
    const std::uint64_t total = bytes_of(*info);
    py::ssize_t expect = info->itemsize;
    for (py::ssize_t d = info->ndim - 1; d >= 0; --d) {
      if (info->shape[d] > 1 && info->strides[d] != expect) {
        throw Error(ErrorCode::kInvalidArgument,
                    "kvoffload.vllm tier: the primary KV buffer is not C-contiguous");
      }
      expect *= info->shape[d];
    }
    if (row_bytes == 0 || total % row_bytes != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "kvoffload.vllm tier: the primary KV buffer holds " + std::to_string(total) +
                      " bytes, not a whole number of rows of " + std::to_string(row_bytes));
    }
    return info;
  }

  // 0 absent, 1 present, 2 pending (a check is in flight or will start at flush_lookups()).
  int lookup(py::handle key) {
    check_open();
    const BlockKey k = key_of(key.ptr());
    if (remote_ == nullptr) return tier_->contains(k) ? 1 : 0;
    if (const auto answer = remote_->known(k)) return static_cast<int>(*answer);
    if (asked_set_.insert(k).second) asked_.push_back(k);
    return static_cast<int>(TierPresence::kPending);
  }

  // The remote tier: starts the existence checks of the keys lookup() collected, in one batch.
  // Returns how many keys it asked.
  std::size_t flush_lookups() {
    check_open();
    const std::size_t n = asked_.size();
    if (n != 0) {
      std::vector<TierPresence> out(n);
      remote_->lookup(asked_, out);
      asked_.clear();
      asked_set_.clear();
    }
    return n;
  }

  void submit(std::int64_t job_id, bool load, py::handle keys, py::handle block_ids) {
    check_open();
    const Items items(keys);
    const auto ids =
        py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(block_ids);
    if (!ids || ids.ndim() != 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "kvoffload.vllm tier: block_ids must be a 1-D sequence of integers");
    }
    const auto n = items.size();
    if (static_cast<std::size_t>(ids.shape(0)) != n) {
      throw Error(ErrorCode::kInvalidArgument, "kvoffload.vllm tier: job " +
                                                   std::to_string(job_id) + " has " +
                                                   std::to_string(n) + " keys but " +
                                                   std::to_string(ids.shape(0)) + " block ids");
    }
    const std::int64_t* id = ids.data();
    std::vector<TierPut> puts;
    std::vector<TierGet> gets;
    if (load) {
      gets.reserve(n);
    } else {
      puts.reserve(n);
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (id[i] < 0 || static_cast<std::uint64_t>(id[i]) >= rows_) {
        throw Error(ErrorCode::kInvalidArgument,
                    "kvoffload.vllm tier: job " + std::to_string(job_id) + ": block id " +
                        std::to_string(id[i]) + " is outside the primary tier's 0.." +
                        std::to_string(rows_ - 1));
      }
      std::byte* row = base_ + static_cast<std::uint64_t>(id[i]) * row_;
      const BlockKey k = key_of(items[i]);
      if (load) {
        gets.push_back({k, std::span<std::byte>(row, row_)});
      } else {
        puts.push_back({k, std::span<const std::byte>(row, row_)});
      }
    }
    TierJob job{job_id, load, {}, Clock::now()};
    {
      py::gil_scoped_release release;  // the tier takes its locks (and the file tier statvfs)
      job.batch = load ? tier_->get(gets) : tier_->put(puts);
    }
    jobs_.push_back(std::move(job));
  }

  // Finished jobs: (job id, is load, succeeded keys' indices or None when all succeeded, seconds,
  // the first failure's detail or "").
  py::list poll() {
    py::list out;
    std::size_t keep = 0;
    for (std::size_t j = 0; j < jobs_.size(); ++j) {
      TierJob& job = jobs_[j];
      if (!job.batch.ready()) {
        if (keep != j) jobs_[keep] = std::move(job);
        ++keep;
        continue;
      }
      out.append(result(job));
    }
    jobs_.resize(keep);
    return out;
  }

  [[nodiscard]] std::size_t pending() const noexcept { return jobs_.size(); }

  void drain() {
    check_open();
    py::gil_scoped_release release;
    tier_->drain();
  }

  py::dict stats() const {
    check_open();
    return stats_dict(tier_->stats());
  }

  py::dict remote_stats() const {
    check_open();
    if (remote_ == nullptr) throw Error(ErrorCode::kState, "not a remote tier");
    return stats_dict(remote_->remote_stats());
  }

  // The store key of a vLLM key's value (remote tier; tools and tests).
  std::string store_key(py::handle key) const {
    check_open();
    if (remote_ == nullptr) throw Error(ErrorCode::kState, "not a remote tier");
    return remote_->store_key(key_of(key.ptr()), 0);
  }

  // Where a vLLM key's record lives (file tier; tools and tests).
  std::string record_path(py::handle key) const {
    check_open();
    const auto* file = dynamic_cast<const FileTier*>(tier_.get());
    if (file == nullptr) throw Error(ErrorCode::kState, "not a file tier");
    return file->record_path(key_of(key.ptr())).string();
  }

  [[nodiscard]] std::uint64_t row_bytes() const noexcept { return row_; }
  [[nodiscard]] std::uint64_t rows() const noexcept { return rows_; }

  // Drains and closes the tier (GIL released), then releases the primary buffer. Idempotent.
  // Jobs not yet polled stay pollable: their batches are finished.
  bool close() {
    if (!tier_) return true;
    bool ok = true;
    {
      py::gil_scoped_release release;
      ok = tier_->close();
    }
    closed_ = true;
    primary_.reset();
    base_ = nullptr;
    return ok;
  }

 private:
  void check_open() const {
    if (closed_) throw Error(ErrorCode::kState, "kvoffload.vllm tier: the tier is shut down");
  }

  static py::tuple result(const TierJob& job) {
    const std::vector<TierItemResult> results = job.batch.wait();  // ready: does not wait
    const auto finished = job.batch.finished_at().value_or(job.submitted);
    const double seconds = std::chrono::duration<double>(finished - job.submitted).count();
    py::list ok;
    std::string detail;
    std::size_t n_ok = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (results[i].status == TierItemStatus::kOk) {
        ++n_ok;
        ok.append(i);
      } else if (detail.empty()) {
        detail = std::string(to_string(results[i].status)) +
                 (results[i].detail.empty() ? std::string() : ": " + results[i].detail);
      }
    }
    py::object succeeded = n_ok == results.size() ? py::object(py::none()) : py::object(ok);
    return py::make_tuple(job.id, job.load, succeeded, seconds, detail);
  }

  std::unique_ptr<py::buffer_info> primary_;  // before tier_: released after it
  std::unique_ptr<SecondaryTier> tier_;
  RemoteTier* remote_ = nullptr;
  std::byte* base_ = nullptr;
  std::uint64_t row_ = 0;
  std::uint64_t rows_ = 0;
  bool closed_ = false;
  std::vector<TierJob> jobs_;
  std::vector<BlockKey> asked_;
  std::unordered_set<BlockKey, BlockKeyHash> asked_set_;
};

FsyncPolicy fsync_from(const std::string& s) {
  if (s == "none") return FsyncPolicy::kNone;
  if (s == "data") return FsyncPolicy::kData;
  if (s == "full") return FsyncPolicy::kFull;
  throw Error(ErrorCode::kInvalidArgument,
              "fsync '" + s + "' is not one of 'none', 'data', 'full'");
}

}  // namespace

void bind_vllm_tiers(py::module_& m) {
  py::class_<VllmTierCore>(m, "VllmTierCore", R"(The C++ half of kvoffload.vllm's secondary tiers
(KvoffloadFileTier, KvoffloadRemoteTier): one FileTier or RemoteTier over vLLM's primary CPU KV
buffer, jobs submitted and polled without blocking the scheduler.)")
      .def_static(
          "open_file",
          [](const py::buffer& primary, std::uint64_t row_bytes, const std::string& root,
             unsigned io_threads, std::uint64_t capacity_bytes, unsigned read_threads,
             bool direct_io, const std::string& fsync, const std::string& name) {
            auto info = VllmTierCore::request_primary(primary, row_bytes);
            FileTierOptions o;
            o.root = root;
            o.io_threads = io_threads;
            o.read_threads = read_threads;
            o.capacity_bytes = capacity_bytes;
            o.direct_io = direct_io ? DirectIoMode::kAuto : DirectIoMode::kBuffered;
            o.fsync = fsync_from(fsync);
            o.name = name;
            // vLLM discards the primary slots of a failed promotion (complete_write(False)), so
            // records are read straight into the slots and verified there (no bounce copy).
            o.verify_in_destination = true;
            std::unique_ptr<FileTier> tier;
            {
              py::gil_scoped_release release;  // indexes the records a previous run left
              tier = FileTier::open(o);
            }
            return std::make_unique<VllmTierCore>(std::move(tier), nullptr, std::move(info),
                                                  row_bytes);
          },
          py::arg("primary"), py::arg("row_bytes"), py::arg("root"), py::arg("io_threads"),
          py::arg("capacity_bytes"), py::arg("read_threads") = 0, py::arg("direct_io") = true,
          py::arg("fsync") = "none", py::arg("name") = "file")
      .def_static(
          "open_remote",
          [](const py::buffer& primary, std::uint64_t row_bytes, const RemoteTierOptions& options) {
            auto info = VllmTierCore::request_primary(primary, row_bytes);
            if (options.geometry.copies() != 1 || options.geometry.stride() != row_bytes) {
              throw Error(ErrorCode::kInvalidArgument,
                          "kvoffload.vllm remote tier: the geometry must be one value per row of " +
                              std::to_string(row_bytes) + " bytes (" + options.geometry.describe() +
                              ")");
            }
            // As for the file tier: vLLM discards the primary slots of a failed promotion, so
            // values are received straight into the slots and verified there (Note [Gets into
            // the destination] in remote_tier.hpp).
            RemoteTierOptions o = options;
            o.verify_in_destination = true;
            std::unique_ptr<RemoteTier> tier;
            {
              py::gil_scoped_release release;  // probes the store (bounded by connect_timeout)
              tier = RemoteTier::open(o);
            }
            RemoteTier* remote = tier.get();
            return std::make_unique<VllmTierCore>(std::move(tier), remote, std::move(info),
                                                  row_bytes);
          },
          py::arg("primary"), py::arg("row_bytes"), py::arg("options"))
      .def("lookup", &VllmTierCore::lookup, py::arg("key"),
           "0 absent, 1 present, 2 pending (vLLM's RETRY: ask again next step).")
      .def("flush_lookups", &VllmTierCore::flush_lookups,
           "Remote tier: starts the existence checks lookup() collected, as one batch.")
      .def("submit", &VllmTierCore::submit, py::arg("job_id"), py::arg("load"), py::arg("keys"),
           py::arg("block_ids"))
      .def("poll", &VllmTierCore::poll,
           "Finished jobs: [(job_id, is_load, ok_indices or None when all succeeded, seconds, "
           "first failure)].")
      .def_property_readonly("pending", &VllmTierCore::pending)
      .def_property_readonly("row_bytes", &VllmTierCore::row_bytes)
      .def_property_readonly("rows", &VllmTierCore::rows)
      .def("drain", &VllmTierCore::drain, "Waits (GIL released) until every batch finished.")
      .def("stats", &VllmTierCore::stats)
      .def("remote_stats", &VllmTierCore::remote_stats)
      .def("store_key", &VllmTierCore::store_key, py::arg("key"))
      .def("record_path", &VllmTierCore::record_path, py::arg("key"))
      .def("close", &VllmTierCore::close,
           "Drains and closes the tier (GIL released), then releases the primary buffer.");
}

}  // namespace kvoffload::python
