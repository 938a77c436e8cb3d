// The one GPU runtime (Note [One GPU runtime over a vendor table] in vendor_api.hpp).
//
// Note [Registration during capture]
// The engine may capture CUDA graphs on its compute stream while kvoffload registers the region
// or allocates on another thread. Host register/unregister and device malloc/free are "unsafe"
// calls during capture: in the default global capture mode they invalidate every capture in the
// process. Every such call here runs inside a RelaxedCapture scope (this thread's mode switched
// to relaxed, then restored), which the CUDA programming guide names for exactly this. A blocking
// stream capturing in the same context is different: registration synchronizes with the legacy
// default stream and would break that capture, so registration first asks whether the legacy
// stream is capturing and refuses (kState, nothing registered) when it is.
//
// Note [Descriptor rings]
// The copy kernel reads its descriptors from a pinned buffer (or, when staging, from a device
// copy of it made by one DMA right before the launch, so that every CTA reads them from device
// memory and not over PCIe). A slot is free again only when the event recorded after the work
// that reads it has completed. A launch is judged by its own status, never by the thread's last
// error (which may hold an earlier, unrelated error of the engine's other CUDA code): a good
// launch that looked failed would free a slot the running kernel still reads. Each stream has its
// own ring and lock, so a store lane waiting for a slot (its stream held by the model's compute)
// never blocks a load lane.
//
// Note [Batched DMA refusals]
// A refused batch is redone as a per-copy loop. Whether batched DMA stays in use depends on the
// cause: "not supported"/"not permitted" mean it never works in this process and switch it off;
// anything else (a bad descriptor, a thread without a current context) concerns that batch only.
// The driver-level batch call needs a current context on the calling thread, which the device
// guard guarantees (Note [Device guard]).
//
// Note [Device guard]
// Every call that reaches the device makes the runtime's device current on the calling thread
// for its scope (Guard) — query, synchronize, destroy and free included, because any runtime
// call on a thread without a current context binds, and creates, device 0's primary context
// there (hundreds of MiB, and refused outright on a GPU in EXCLUSIVE_PROCESS mode held by rank 0).
// The guard asks which context is current (current_device, -1 for none: cudaGetDevice cannot
// tell, it reports 0 for a thread that never chose a device), binds ours only when it differs,
// and afterwards restores only a device the thread had chosen. A thread that had none (the
// bring-up thread, an engine's or Python's worker threads) keeps ours: "restoring" device 0 there
// is what created GPU 0's context on every rank.
//
// Note [Freeing]
// Device memory is freed the way it was allocated. Memory that is freed in stream order
// (cudaFreeAsync) comes from cudaMallocAsync (device_malloc_async), never from cudaMalloc; the
// allocations made here remember which they were. A plain free of stream-ordered memory does not
// wait for the device (the CUDA runtime header says so), so such a free first synchronizes.
//
// Note [Retired slots]
// A descriptor slot whose closing event could not be recorded is retired: work that reads it may
// still run and nothing tells when it ends, except its stream. Destroying a stream synchronizes
// that stream first. The runtime's destructor cannot: a ring may belong to a caller's stream
// that is gone by then (its work may still run), and the legacy stream does not wait for the
// non-blocking streams the rings live on. So it synchronizes the device before it frees a retired
// slot.
//
// Note [Kernel architectures]
// A module's kernels exist for the architectures it was built for. CUDA can compile the embedded
// PTX for a newer GPU, so kernel_check (cudaFuncGetAttributes) decides there; HIP code objects
// are per architecture, and Debian's ROCm 5.2 hipcc does not know gfx942 (MI300), so a build
// there silently lacked it. A device whose architecture the module lacks (kernel_archs_exact) or
// whose kernel_check fails is refused when the runtime is made, naming both, unless DMA only is
// asked for (RuntimeOptions::allow_missing_kernel, KVOFFLOAD_ALLOW_MISSING_KERNEL=1).
#include "runtime/gpu/gpu_runtime.hpp"

#include <kvoffload/error.hpp>
#include <kvoffload/log.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <thread>

namespace kvoffload::gpu {

namespace {

static_assert(sizeof(CopyDescriptor) == sizeof(VendorCopyDesc));
static_assert(offsetof(CopyDescriptor, src) == offsetof(VendorCopyDesc, src));
static_assert(offsetof(CopyDescriptor, dst) == offsetof(VendorCopyDesc, dst));
static_assert(offsetof(CopyDescriptor, bytes) == offsetof(VendorCopyDesc, bytes));

void* to_ptr(std::uintptr_t handle) noexcept {
  return reinterpret_cast<void*>(handle);
}

int to_memcpy_kind(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return kMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return kMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return kMemcpyDeviceToDevice;
    case CopyKind::kHostToHost:
      return kMemcpyHostToHost;
  }
  return kMemcpyDefault;
}

std::string range_string(const void* ptr, std::size_t bytes) {
  return fmt::format("[{}, +{} bytes)", ptr, bytes);
}

std::string version_text(const VendorApi& api, int v) {
  char buf[32] = {};
  api.version_text(api.ctx, v, buf, sizeof buf);
  return buf;
}

// Logs without letting a logging failure escape (teardown and after-success paths).
template <typename... Args>
void log_noexcept(spdlog::level::level_enum level, fmt::format_string<Args...> fmt,
                  Args&&... args) noexcept {
  try {
    log().log(level, fmt, std::forward<Args>(args)...);
  } catch (...) {
    // logging must not undo or stop what it reports
  }
}

// Switches this thread to relaxed stream-capture mode for the scope (Note [Registration during
// capture]).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const VendorApi& api) noexcept : api_(api) {
    exchanged_ = api_.exchange_capture_mode(api_.ctx, &mode_, 1) == 0;
    if (!exchanged_) (void)api_.get_last_error(api_.ctx);
  }
  ~RelaxedCapture() {
    if (exchanged_) (void)api_.exchange_capture_mode(api_.ctx, &mode_, 0);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const VendorApi& api_;
  int mode_ = 0;
  bool exchanged_ = false;
};

}  // namespace

[[noreturn]] void throw_vendor(const VendorApi& api, int err, std::string_view call,
                               std::string_view context) {
  (void)api.get_last_error(api.ctx);
  std::string msg(call);
  if (!context.empty()) {
    msg += ' ';
    msg += context;
  }
  // A driver-level call's code is its own (a CUresult), said as such.
  msg += fmt::format(": {}: {} ({} {}error {})", api.error_name(api.ctx, err),
                     api.error_string(api.ctx, err), api.name,
                     is_driver_result(err) ? "driver " : "", driver_code(err));
  throw Error(ErrorCode::kDevice, std::move(msg), 0, std::string(call));
}

std::vector<std::pair<std::size_t, std::size_t>> plan_registration(std::uintptr_t base,
                                                                   std::size_t bytes,
                                                                   std::size_t align,
                                                                   std::size_t limit,
                                                                   std::size_t page) {
  std::vector<std::pair<std::size_t, std::size_t>> plan;
  if (bytes == 0) return plan;
  if (limit == 0 || bytes <= limit) {
    plan.emplace_back(0, bytes);
    return plan;
  }
  if (base % page != 0) {
    throw_invalid(fmt::format(
        "host registration of {} bytes needs more than one piece of at most {} bytes, and then the "
        "base address {} must be page-aligned ({} bytes)",
        bytes, limit, reinterpret_cast<const void*>(base), page));
  }
  std::size_t step = limit;
  if (align > 0 && align <= limit) step = limit / align * align;  // whole rows
  step = step / page * page;  // whole pages, even when a row is not a page multiple
  if (step == 0) step = page;
  for (std::size_t off = 0; off < bytes; off += step)
    plan.emplace_back(off, std::min(step, bytes - off));
  return plan;
}

// Makes the runtime's device current on this thread for the scope; restores the device the
// thread had chosen, if any (Note [Device guard]).
class GpuRuntime::Guard {
 public:
  Guard(const VendorApi& api, int device) : api_(api) {
    if (const int err = bind(device); err != 0) {
      throw_vendor(api_, err, "set_device", "device " + std::to_string(device));
    }
  }
  // For teardown paths: a failure is logged, and the call goes on (and reports its own error).
  Guard(const VendorApi& api, int device, std::nothrow_t /*unused*/) noexcept : api_(api) {
    if (const int err = bind(device); err != 0) {
      (void)api_.get_last_error(api_.ctx);
      log_noexcept(spdlog::level::warn, "{}: set_device({}) failed: {}", api_.name, device,
                   api_.error_name(api_.ctx, err));
    }
  }
  ~Guard() {
    if (previous_ >= 0) (void)api_.set_device(api_.ctx, previous_);
  }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  int bind(int device) noexcept {
    int current = -1;
    if (api_.current_device(api_.ctx, &current) != 0) {
      (void)api_.get_last_error(api_.ctx);
      current = -1;
    }
    if (current == device) return 0;  // already ours: nothing to bind or restore
    const int err = api_.set_device(api_.ctx, device);
    if (err == 0) previous_ = current;  // -1 (none) is never "restored"
    return err;
  }

  const VendorApi& api_;
  int previous_ = -1;
};

GpuRuntime::GpuRuntime(const VendorApi& api, const RuntimeOptions& options,
                       std::shared_ptr<void> keep)
    : api_(api), ctx_(api.ctx), keep_(std::move(keep)), options_(options), device_(options.device) {
  Guard guard(api_, device_);
  char name[256] = {};
  char arch[64] = {};
  check_vendor(api_, api_.device_describe(ctx_, device_, name, sizeof name, arch, sizeof arch),
               "device_describe", "device " + std::to_string(device_));
  device_name_ = name;
  arch_ = arch;
  int driver = 0;
  int runtime = 0;
  check_vendor(api_, api_.driver_version(ctx_, &driver), "driver_version");
  check_vendor(api_, api_.runtime_version(ctx_, &runtime), "runtime_version");
  versions_ = "driver " + version_text(api_, driver) + ", runtime " + version_text(api_, runtime);

  if (options_.register_chunk_bytes != 0) register_chunk_bytes_ = options_.register_chunk_bytes;
  kernel_max_ctas_ = options_.kernel_max_blocks != 0
                         ? static_cast<int>(std::min<unsigned>(options_.kernel_max_blocks, 65535u))
                         : 16;
  if (options_.kernel_ring_slots != 0) ring_slots_ = options_.kernel_ring_slots;
  if (options_.kernel_ring_slot_descriptors != 0)
    slot_descs_ = options_.kernel_ring_slot_descriptors;
  if (options_.kernel_threads_per_block != 0 &&
      options_.kernel_threads_per_block != static_cast<unsigned>(api_.kernel_threads)) {
    log().warn("{}: kernel_threads_per_block={} ignored: the batch copy kernel is built for {}",
               api_.name, options_.kernel_threads_per_block, api_.kernel_threads);
  }

  batch_enabled_.store(api_.memcpy_batch_async != nullptr, std::memory_order_relaxed);
  if (std::string why = kernel_unavailable_reason(); why.empty()) {
    kernel_ok_ = true;
    kernel_detail_ = fmt::format("batch copy kernel, up to {} CTAs x {} threads{}",
                                 kernel_max_ctas_, api_.kernel_threads,
                                 options_.kernel_stage_descriptors ? ", descriptors staged" : "");
  } else {
    const char* env = std::getenv("KVOFFLOAD_ALLOW_MISSING_KERNEL");
    const bool allowed =
        options_.allow_missing_kernel || (env != nullptr && std::string_view(env) == "1");
    const std::string message = fmt::format(
        "{}: device {} ({}, {}) cannot run this build's copy kernel: {}. Rebuild kvoffload for "
        "{} (KVOFFLOAD_{}_ARCHITECTURES, with a toolkit that knows it), or allow DMA only with "
        "RuntimeOptions::allow_missing_kernel or KVOFFLOAD_ALLOW_MISSING_KERNEL=1",
        api_.name, device_, device_name_, arch_, why, arch_,
        api_.kernel_archs_exact != 0 ? "HIP" : "CUDA");  // exact: code objects per arch (HIP)
    if (!allowed) throw Error(ErrorCode::kNotAvailable, message, 0, "kernel_check");
    log().warn("{}; running with DMA only, as allowed", message);
    kernel_detail_ = "unavailable: " + why;
  }
  check_vendor(api_, api_.stream_create(ctx_, &sync_stream_), "stream_create");
  log().info("{}: device {} {} ({}), {}; dma: {}; kernel: {}", api_.name, device_, device_name_,
             arch_, versions_, api_.batch_detail, kernel_detail_);
}

GpuRuntime::~GpuRuntime() {
  // Teardown keeps going: every step is attempted and failures are only logged. Errors such as
  // "runtime unloading" at process exit are expected and harmless.
  Guard guard(api_, device_, std::nothrow);
  RelaxedCapture relaxed(api_);
  {
    std::lock_guard lock(rings_mu_);
    for (auto& [stream, ring] : rings_)
      destroy_ring(*ring, stream, /*stream_alive=*/false);  // foreign streams may be gone
    rings_.clear();
  }
  for (auto& [handle, reg] : registrations_) {
    log_noexcept(spdlog::level::warn,
                 "{}: runtime destroyed with {} still registered; unregistering it", api_.name,
                 range_string(reg->base, reg->bytes));
    (void)unregister_pieces(*reg);
  }
  registrations_.clear();
  if (sync_stream_ != nullptr) (void)api_.stream_destroy(ctx_, sync_stream_);
  (void)api_.get_last_error(ctx_);
}

BackendInfo GpuRuntime::info() const {
  int count = 0;
  if (api_.get_device_count(ctx_, &count) != 0) (void)api_.get_last_error(ctx_);
  return BackendInfo{
      api_.name, true, count,
      fmt::format(
          "device {} {} ({}), {}; dma: {}; kernel: {}", device_, device_name_, arch_, versions_,
          batch_enabled_.load(std::memory_order_relaxed) ? api_.batch_detail : "per-copy loop",
          kernel_detail_)};
}

RuntimeCounters GpuRuntime::counters() const noexcept {
  RuntimeCounters c;
  c.dma_batched_calls = dma_batched_calls_.load();
  c.dma_batch_refusals = dma_batch_refusals_.load();
  c.dma_loop_copies = dma_loop_copies_.load();
  c.kernel_launches = kernel_launches_.load();
  c.kernel_descriptors = kernel_descriptors_.load();
  c.ring_waits = ring_waits_.load();
  c.batched_dma_enabled = batch_enabled_.load();
  return c;
}

namespace {

// "gfx942" of "gfx942:sramecc+:xnack-".
std::string_view arch_base(std::string_view arch) {
  return arch.substr(0, arch.find(':'));
}

bool arch_listed(std::string_view arch, std::string_view list) {
  const std::string_view want = arch_base(arch);
  while (!list.empty()) {
    const std::size_t cut = list.find_first_of(";, ");
    if (arch_base(list.substr(0, cut)) == want) return true;
    if (cut == std::string_view::npos) break;
    list.remove_prefix(cut + 1);
  }
  return false;
}

}  // namespace

std::string GpuRuntime::kernel_unavailable_reason() {
  const char* built = api_.kernel_archs != nullptr ? api_.kernel_archs : "";
  if (api_.kernel_archs_exact != 0 && !arch_listed(arch_, built)) {
    return fmt::format("its kernels were built for {} only, not {}", *built != 0 ? built : "none",
                       arch_base(arch_));
  }
  if (const int rc = api_.kernel_check(ctx_); rc != 0) {
    (void)api_.get_last_error(ctx_);
    return fmt::format("{}: {} (kernels built for {})", api_.error_name(ctx_, rc),
                       api_.error_string(ctx_, rc), *built != 0 ? built : "unknown architectures");
  }
  return {};
}

// ---- host registration ----

void GpuRuntime::register_pieces(Registration& reg,
                                 const std::vector<std::pair<std::size_t, std::size_t>>& plan) {
  auto* base = static_cast<std::byte*>(reg.base);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    void* p = base + plan[i].first;
    const int err = api_.host_register(ctx_, p, plan[i].second);
    if (err != 0) {
      (void)api_.get_last_error(ctx_);  // the error must not surface from a later call
      (void)unregister_pieces(reg);
      throw_vendor(
          api_, err, "host_register",
          fmt::format(
              "{} (piece {} of {} of {}); the engine continues on the slower unregistered path",
              range_string(p, plan[i].second), i + 1, plan.size(),
              range_string(reg.base, reg.bytes)));
    }
    reg.pieces.push_back(Piece{p, plan[i].second});
  }
}

bool GpuRuntime::unregister_pieces(Registration& reg) noexcept {
  bool ok = true;
  RelaxedCapture relaxed(api_);
  for (auto it = reg.pieces.rbegin(); it != reg.pieces.rend(); ++it) {
    if (const int err = api_.host_unregister(ctx_, it->ptr); err != 0) {
      (void)api_.get_last_error(ctx_);
      ok = false;
      log_noexcept(spdlog::level::err, "{}: host_unregister {} failed: {}", api_.name,
                   range_string(it->ptr, it->bytes), api_.error_name(ctx_, err));
    }
  }
  reg.pieces.clear();
  if (reg.mlocked) {
    if (::munlock(reg.base, reg.bytes) != 0) {
      ok = false;
      log_noexcept(spdlog::level::err, "{}: munlock {} failed: {}", api_.name,
                   range_string(reg.base, reg.bytes), errno_name(errno));
    }
    reg.mlocked = false;
  }
  return ok;
}

// The device address of every piece. With unified addressing they are the host addresses;
// without it (ROCm) each piece may sit anywhere on the device, so the registration carries one
// segment per piece, merged where the device side happens to be contiguous, and the kernel path
// translates each copy through its own piece (TransferEngine, HostRegistration::device_pointer).
std::vector<DeviceSegment> GpuRuntime::device_segments_of(Registration& reg) {
  std::vector<DeviceSegment> segments;
  for (const Piece& piece : reg.pieces) {
    void* dev = nullptr;
    if (const int err = api_.host_device_pointer(ctx_, &dev, piece.ptr); err != 0) {
      throw_vendor(api_, err, "host_device_pointer", range_string(piece.ptr, piece.bytes));
    }
    const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(piece.ptr) -
                                                 static_cast<std::byte*>(reg.base));
    if (!segments.empty()) {
      DeviceSegment& last = segments.back();
      if (static_cast<std::byte*>(last.device) + last.bytes == static_cast<std::byte*>(dev)) {
        last.bytes += piece.bytes;
        continue;
      }
    }
    segments.push_back(DeviceSegment{offset, piece.bytes, dev});
  }
  return segments;
}

DeviceRuntime::RegistrationRecord GpuRuntime::do_register_host(void* ptr, std::size_t bytes,
                                                               std::size_t align) {
  Guard guard(api_, device_);
  RelaxedCapture relaxed(api_);
  int capturing = 0;
  if (const int err = api_.stream_capturing(ctx_, api_.legacy_stream, &capturing); err != 0) {
    (void)api_.get_last_error(ctx_);
    if (err == api_.err_capture_implicit) capturing = 1;
  }
  if (capturing != 0) {
    throw Error(
        ErrorCode::kState,
        fmt::format(
            "{}: cannot register host memory {} while a blocking stream on device {} is capturing "
            "a graph; register before or after the capture",
            api_.name, range_string(ptr, bytes), device_),
        0, "stream_capturing");
  }

  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto reg = std::make_unique<Registration>();
  reg->base = ptr;
  reg->bytes = bytes;
  const auto start = std::chrono::steady_clock::now();
  register_pieces(*reg, plan_registration(reinterpret_cast<std::uintptr_t>(ptr), bytes, align,
                                          register_chunk_bytes_, page));
  // From here on every failure must undo the pieces: nothing registered may leak.
  std::vector<DeviceSegment> segments;
  const auto handle = reinterpret_cast<std::uintptr_t>(reg.get());
  try {
    segments = device_segments_of(*reg);
    if ((api_.caps & kCapRegistrationMayMigrate) != 0 && options_.hip_mlock_registered) {
      if (::mlock(ptr, bytes) == 0) {
        reg->mlocked = true;
      } else {
        const int err = errno;
        log().warn(
            "{}: mlock of the registered range {} failed: {}; the range stays registered but its "
            "pages "
            "may migrate (raise RLIMIT_MEMLOCK, e.g. `ulimit -l unlimited` or docker run --ulimit "
            "memlock=-1)",
            api_.name, range_string(ptr, bytes), errno_name(err));
      }
    }
    std::lock_guard lock(reg_mu_);
    registrations_.emplace(handle, std::move(reg));
  } catch (...) {
    if (reg) (void)unregister_pieces(*reg);
    throw;
  }
  // The registration is owned by the map now; a failure to log it must not lose it.
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_noexcept(spdlog::level::info, "{}: registered {} in {} piece(s) in {:.3f} s ({:.3f} s/GB)",
               api_.name, range_string(ptr, bytes),
               (bytes + register_chunk_bytes_ - 1) / register_chunk_bytes_, secs,
               secs / (static_cast<double>(bytes) / 1e9));
  void* device_base = segments.front().device;
  return RegistrationRecord{handle, device_base, std::move(segments)};
}

bool GpuRuntime::do_unregister_host(std::uintptr_t handle) noexcept {
  std::unique_ptr<Registration> reg;
  {
    std::lock_guard lock(reg_mu_);
    if (auto it = registrations_.find(handle); it != registrations_.end()) {
      reg = std::move(it->second);
      registrations_.erase(it);
    }
  }
  if (!reg) {
    log_noexcept(spdlog::level::err, "{}: unregister of an unknown registration handle {:#x}",
                 api_.name, handle);
    return false;
  }
  Guard guard(api_, device_, std::nothrow);
  return unregister_pieces(*reg);
}

// ---- streams and events ----

std::uintptr_t GpuRuntime::do_create_stream() {
  Guard guard(api_, device_);
  void* stream = nullptr;
  check_vendor(api_, api_.stream_create(ctx_, &stream), "stream_create");
  return reinterpret_cast<std::uintptr_t>(stream);
}

void GpuRuntime::do_destroy_stream(std::uintptr_t stream) noexcept {
  Guard guard(api_, device_, std::nothrow);
  // Pending work finishes first, so descriptors and buffers it reads stay valid until then.
  if (api_.stream_synchronize(ctx_, to_ptr(stream)) != 0) (void)api_.get_last_error(ctx_);
  std::unique_ptr<Ring> ring;
  {
    std::lock_guard lock(rings_mu_);
    if (auto it = rings_.find(to_ptr(stream)); it != rings_.end()) {
      ring = std::move(it->second);
      rings_.erase(it);
    }
  }
  if (ring) {
    RelaxedCapture relaxed(api_);
    destroy_ring(*ring, to_ptr(stream), /*stream_alive=*/true);
    // The stream-ordered frees of the ring's device buffers run before the stream goes away.
    if (api_.stream_synchronize(ctx_, to_ptr(stream)) != 0) (void)api_.get_last_error(ctx_);
  }
  if (api_.stream_destroy(ctx_, to_ptr(stream)) != 0) (void)api_.get_last_error(ctx_);
}

std::uintptr_t GpuRuntime::do_create_event(bool timing) {
  Guard guard(api_, device_);
  void* event = nullptr;
  check_vendor(api_, api_.event_create(ctx_, &event, timing ? 1 : 0), "event_create");
  return reinterpret_cast<std::uintptr_t>(event);
}

void GpuRuntime::do_destroy_event(std::uintptr_t event) noexcept {
  Guard guard(api_, device_, std::nothrow);
  if (api_.event_destroy(ctx_, to_ptr(event)) != 0) (void)api_.get_last_error(ctx_);
}

void GpuRuntime::do_record_event(std::uintptr_t event, std::uintptr_t stream) {
  Guard guard(api_, device_);  // stream 0 means the current device's legacy stream
  check_vendor(api_, api_.event_record(ctx_, to_ptr(event), to_ptr(stream)), "event_record");
}

void GpuRuntime::do_wait_event(std::uintptr_t stream, std::uintptr_t event) {
  Guard guard(api_, device_);
  check_vendor(api_, api_.stream_wait_event(ctx_, to_ptr(stream), to_ptr(event)),
               "stream_wait_event");
}

bool GpuRuntime::do_query_event(std::uintptr_t event) {
  Guard guard(api_, device_);
  const int err = api_.event_query(ctx_, to_ptr(event));
  if (err == 0) return true;
  if (err == api_.err_not_ready) {
    (void)api_.get_last_error(ctx_);
    return false;
  }
  throw_vendor(api_, err, "event_query", "(work before the event failed)");
}

void GpuRuntime::do_synchronize_event(std::uintptr_t event) {
  Guard guard(api_, device_);
  check_vendor(api_, api_.event_synchronize(ctx_, to_ptr(event)), "event_synchronize");
}

void GpuRuntime::do_synchronize_stream(std::uintptr_t stream) {
  Guard guard(api_, device_);
  check_vendor(api_, api_.stream_synchronize(ctx_, to_ptr(stream)), "stream_synchronize");
}

bool GpuRuntime::do_stream_capturing(std::uintptr_t stream) {
  Guard guard(api_, device_);
  int capturing = 0;
  const int err = api_.stream_capturing(ctx_, to_ptr(stream), &capturing);
  if (err == 0) return capturing != 0;
  if (err == api_.err_capture_implicit) {  // the legacy stream, with a blocking stream capturing
    (void)api_.get_last_error(ctx_);
    return true;
  }
  throw_vendor(api_, err, "stream_capturing");
}

double GpuRuntime::do_elapsed_seconds(std::uintptr_t start, std::uintptr_t end) {
  Guard guard(api_, device_);
  float ms = 0.0F;
  check_vendor(api_, api_.event_elapsed_ms(ctx_, &ms, to_ptr(start), to_ptr(end)),
               "event_elapsed_ms");
  return static_cast<double>(ms) / 1e3;
}

void GpuRuntime::do_launch_host_func(std::uintptr_t stream, void (*fn)(void*), void* arg) {
  Guard guard(api_, device_);
  check_vendor(api_, api_.launch_host_func(ctx_, to_ptr(stream), fn, arg), "launch_host_func");
}

void GpuRuntime::do_wait_host_flag(std::uintptr_t stream, const std::uint32_t* flag,
                                   std::uint32_t value) {
  Guard guard(api_, device_);
  check_vendor(
      api_, api_.stream_wait_value32(ctx_, to_ptr(stream), const_cast<std::uint32_t*>(flag), value),
      "stream_wait_value32");
}

std::uint32_t* GpuRuntime::do_create_host_flag() {
  Guard guard(api_, device_);
  RelaxedCapture relaxed(api_);
  std::uint32_t* flag = nullptr;
  check_vendor(api_, api_.flag_alloc(ctx_, &flag), "flag_alloc");
  std::atomic_ref<std::uint32_t>(*flag).store(0, std::memory_order_release);
  return flag;
}

void GpuRuntime::do_destroy_host_flag(std::uint32_t* flag) noexcept {
  Guard guard(api_, device_, std::nothrow);
  RelaxedCapture relaxed(api_);
  if (const int err = api_.flag_free(ctx_, flag); err != 0) {
    (void)api_.get_last_error(ctx_);
    log_noexcept(spdlog::level::err, "{}: flag_free({}) failed: {}", api_.name,
                 static_cast<void*>(flag), api_.error_name(ctx_, err));
  }
}

// ---- device memory (tests, benchmarks, calibration): Note [Freeing] ----

void* GpuRuntime::do_allocate_device(std::size_t bytes) {
  Guard guard(api_, device_);
  RelaxedCapture relaxed(api_);
  void* ptr = nullptr;
  if (api_.device_malloc_async != nullptr) {
    // Stream-ordered, so that release_async can free it in stream order; synchronized here so
    // that it is usable on every stream, as cudaMalloc memory is.
    check_vendor(api_, api_.device_malloc_async(ctx_, &ptr, bytes, sync_stream_),
                 "device_malloc_async", std::to_string(bytes) + " bytes");
    if (const int err = api_.stream_synchronize(ctx_, sync_stream_); err != 0) {
      (void)api_.device_free(ctx_, ptr);
      throw_vendor(api_, err, "stream_synchronize", "(after device_malloc_async)");
    }
    std::lock_guard lock(alloc_mu_);
    async_allocations_.insert(ptr);
    return ptr;
  }
  check_vendor(api_, api_.device_malloc(ctx_, &ptr, bytes), "device_malloc",
               std::to_string(bytes) + " bytes");
  return ptr;
}

void GpuRuntime::do_free_device(void* ptr) noexcept {
  Guard guard(api_, device_, std::nothrow);
  RelaxedCapture relaxed(api_);
  bool async = false;
  {
    std::lock_guard lock(alloc_mu_);
    async = async_allocations_.erase(ptr) != 0;
  }
  // A plain free of stream-ordered memory does not wait for work that may still use it.
  if (async && api_.device_synchronize(ctx_) != 0) (void)api_.get_last_error(ctx_);
  if (const int err = api_.device_free(ctx_, ptr); err != 0) {
    (void)api_.get_last_error(ctx_);
    log_noexcept(spdlog::level::err, "{}: device_free({}) failed: {}", api_.name, ptr,
                 api_.error_name(ctx_, err));
  }
}

void GpuRuntime::do_free_device_async(void* ptr, std::uintptr_t stream) noexcept {
  bool async = false;
  {
    std::lock_guard lock(alloc_mu_);
    async = async_allocations_.contains(ptr);
  }
  if (!async || api_.device_free_async == nullptr || stream == 0) {
    DeviceRuntime::do_free_device_async(ptr, stream);  // synchronize the stream, then free
    return;
  }
  Guard guard(api_, device_, std::nothrow);
  if (const int err = api_.device_free_async(ctx_, ptr, to_ptr(stream)); err != 0) {
    (void)api_.get_last_error(ctx_);
    log_noexcept(spdlog::level::warn, "{}: device_free_async({}) failed: {}; freeing synchronously",
                 api_.name, ptr, api_.error_name(ctx_, err));
    DeviceRuntime::do_free_device_async(ptr, stream);
    return;
  }
  std::lock_guard lock(alloc_mu_);
  async_allocations_.erase(ptr);
}

void GpuRuntime::do_memcpy_sync(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  Guard guard(api_, device_);
  // Default kind: with unified addressing the runtime tells host from device memory itself.
  check_vendor(api_, api_.memcpy_async(ctx_, dst, src, bytes, kMemcpyDefault, sync_stream_),
               "memcpy_async", std::to_string(bytes) + " bytes");
  check_vendor(api_, api_.stream_synchronize(ctx_, sync_stream_), "stream_synchronize");
}

void GpuRuntime::do_memset_sync(void* dst, int value, std::size_t bytes) {
  if (bytes == 0) return;
  Guard guard(api_, device_);
  int is_device = 0;
  if (api_.pointer_is_device(ctx_, dst, &is_device) != 0) {
    (void)api_.get_last_error(ctx_);
    is_device = 0;
  }
  if (is_device == 0) {
    std::memset(dst, value, bytes);  // host memory, registered or not
    return;
  }
  check_vendor(api_, api_.memset_async(ctx_, dst, value, bytes, sync_stream_), "memset_async",
               std::to_string(bytes) + " bytes");
  check_vendor(api_, api_.stream_synchronize(ctx_, sync_stream_), "stream_synchronize");
}

// ---- copies ----

void GpuRuntime::do_enqueue_copies(std::uintptr_t stream, std::span<const CopyDescriptor> batch,
                                   CopyKind kind, CopyPath path) {
  if (batch.empty()) return;
  Guard guard(api_, device_);
  if (path == CopyPath::kKernel) {
    enqueue_kernel(to_ptr(stream), batch);
  } else {
    enqueue_dma(to_ptr(stream), batch, kind);
  }
}

void GpuRuntime::enqueue_dma(void* stream, std::span<const CopyDescriptor> batch, CopyKind kind) {
  // The driver refuses the legacy default stream for batched copies; one copy gains nothing.
  const bool legacy = stream == nullptr || stream == api_.legacy_stream;
  if (legacy || batch.size() < 2 || !batch_enabled_.load(std::memory_order_relaxed)) {
    enqueue_dma_loop(stream, batch, kind);
    return;
  }
  // Per-thread scratch: no allocation per batch once warm, and the store and load threads of the
  // engine never share it.
  thread_local std::vector<void*> dsts;
  thread_local std::vector<const void*> srcs;
  thread_local std::vector<std::size_t> sizes;
  dsts.clear();
  srcs.clear();
  sizes.clear();
  for (const CopyDescriptor& d : batch) {
    if (d.bytes == 0) continue;  // the driver rejects empty copies
    dsts.push_back(d.dst);
    srcs.push_back(d.src);
    sizes.push_back(static_cast<std::size_t>(d.bytes));
  }
  if (sizes.empty()) return;
  // Source access order STREAM in both directions: ANY lets the copy engine read the source
  // before earlier work in the stream has run, which is allowed only when no such work can touch
  // it, and a load's host slot is written by whatever the stream waited for (a store, a
  // promotion) as surely as a store's device block is written by the model.
  std::size_t fail_index = SIZE_MAX;
  const int result =
      api_.memcpy_batch_async(ctx_, dsts.data(), srcs.data(), sizes.data(), sizes.size(),
                              /*source_in_stream_order=*/1, stream, &fail_index);
  if (result == 0) {
    dma_batched_calls_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Redo the refused batch copy by copy (reporting a bad descriptor with the runtime's own error).
  // Copies the batch may already have enqueued are written again with the same bytes, which is
  // harmless: copies of one batch never overlap. Note [Batched DMA refusals].
  const std::uint64_t refusals = dma_batch_refusals_.fetch_add(1, std::memory_order_relaxed) + 1;
  const bool permanent = api_.batch_error_is_permanent(ctx_, result) != 0;
  const std::string where =
      fail_index != SIZE_MAX ? fmt::format(", at copy {}", fail_index) : std::string();
  if (permanent) {
    if (batch_enabled_.exchange(false)) {
      log().warn(
          "{}: batched DMA refused a batch of {} {} copies ({}{}); it is not usable in this "
          "process, "
          "using the per-copy loop from now on",
          api_.name, sizes.size(), to_string(kind), api_.batch_error_text(ctx_, result), where);
    }
  } else if ((refusals & (refusals - 1)) == 0) {  // 1st, 2nd, 4th, 8th ...: rate-limited
    log().warn(
        "{}: batched DMA refused a batch of {} {} copies ({}{}); this batch goes copy by copy "
        "({} refusal(s) so far)",
        api_.name, sizes.size(), to_string(kind), api_.batch_error_text(ctx_, result), where,
        refusals);
  }
  enqueue_dma_loop(stream, batch, kind);
}

void GpuRuntime::enqueue_dma_loop(void* stream, std::span<const CopyDescriptor> batch,
                                  CopyKind kind) {
  const int memcpy_kind = to_memcpy_kind(kind);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const CopyDescriptor& d = batch[i];
    if (d.bytes == 0) continue;
    if (const int err = api_.memcpy_async(ctx_, d.dst, d.src, static_cast<std::size_t>(d.bytes),
                                          memcpy_kind, stream);
        err != 0) {
      throw_vendor(api_, err, "memcpy_async",
                   fmt::format("copy {} of {} ({}, {} bytes, {} -> {})", i, batch.size(),
                               to_string(kind), d.bytes, d.src, static_cast<void*>(d.dst)));
    }
    dma_loop_copies_.fetch_add(1, std::memory_order_relaxed);
  }
}

GpuRuntime::DescSlot GpuRuntime::make_slot(void* stream) {
  RelaxedCapture relaxed(api_);
  DescSlot slot;
  const std::size_t bytes = slot_descs_ * sizeof(VendorCopyDesc);
  void* host = nullptr;
  check_vendor(api_, api_.host_alloc_mapped(ctx_, &host, bytes), "host_alloc_mapped",
               "kernel descriptor buffer");
  slot.host = static_cast<VendorCopyDesc*>(host);
  void* view = nullptr;
  int err = api_.host_device_pointer(ctx_, &view, host);
  const char* call = "host_device_pointer";
  if (err == 0 && options_.kernel_stage_descriptors) {
    // Used on this stream only, and freed on it in stream order: so allocated on it in stream
    // order too (Note [Freeing]).
    void* staged = nullptr;
    if (api_.device_malloc_async != nullptr) {
      err = api_.device_malloc_async(ctx_, &staged, bytes, stream);
      call = "device_malloc_async";
      slot.staged_async = err == 0;
    } else {
      err = api_.device_malloc(ctx_, &staged, bytes);
      call = "device_malloc";
    }
    slot.staged = static_cast<VendorCopyDesc*>(staged);
  }
  if (err == 0) {
    err = api_.event_create(ctx_, &slot.done, 0);
    call = "event_create";
  }
  if (err != 0) {
    (void)api_.get_last_error(ctx_);
    free_slot(slot, stream, /*stream_alive=*/true);
    throw_vendor(api_, err, call, "kernel descriptor buffer");
  }
  slot.host_device_view = static_cast<const VendorCopyDesc*>(view);
  return slot;
}

void GpuRuntime::free_slot(DescSlot& slot, void* stream, bool stream_alive) noexcept {
  if (slot.done != nullptr) (void)api_.event_destroy(ctx_, slot.done);
  if (slot.staged != nullptr) {
    // Stream-ordered memory in stream order (a plain free of it needs no device-wide wait once
    // its readers are known to be done); cudaMalloc memory with a plain free, which waits for
    // the device. Note [Freeing].
    const bool in_order =
        slot.staged_async && stream_alive && api_.device_free_async(ctx_, slot.staged, stream) == 0;
    if (!in_order) (void)api_.device_free(ctx_, slot.staged);
  }
  if (slot.host != nullptr) (void)api_.host_free(ctx_, slot.host);
  (void)api_.get_last_error(ctx_);
  slot = DescSlot{};
}

void GpuRuntime::destroy_ring(Ring& ring, void* stream, bool stream_alive) noexcept {
  std::lock_guard lock(ring.mu);
  bool retired = false;
  for (DescSlot& slot : ring.slots) {
    if (slot.retired) retired = true;
    if (slot.recorded) (void)api_.event_synchronize(ctx_, slot.done);
  }
  // No event tells when the work reading a retired slot ended; only its stream knows, and when
  // the stream may be gone, only the device does (Note [Retired slots]).
  if (retired) {
    if (stream_alive) {
      (void)api_.stream_synchronize(ctx_, stream);
    } else {
      (void)api_.device_synchronize(ctx_);
    }
  }
  for (DescSlot& slot : ring.slots) free_slot(slot, stream, stream_alive);
  ring.slots.clear();
}

GpuRuntime::Ring& GpuRuntime::ring_of(void* stream) {
  std::lock_guard lock(rings_mu_);
  auto& ring = rings_[stream];
  if (!ring) ring = std::make_unique<Ring>();
  return *ring;
}

GpuRuntime::DescSlot& GpuRuntime::acquire_slot(Ring& ring, void* stream) {
  const std::size_t n = ring.slots.size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = (ring.next + i) % n;
    DescSlot& slot = ring.slots[idx];
    if (slot.retired) continue;
    bool free = !slot.recorded;
    if (!free) {
      const int err = api_.event_query(ctx_, slot.done);
      if (err == 0) {
        free = true;
      } else if (err == api_.err_not_ready) {
        (void)api_.get_last_error(ctx_);
      } else {
        throw_vendor(api_, err, "event_query", "(an earlier kernel copy failed)");
      }
    }
    if (free) {
      ring.next = idx + 1;
      slot.recorded = false;
      return slot;
    }
  }
  if (n < ring_slots_) {
    ring.slots.push_back(make_slot(stream));
    ring.next = ring.slots.size();
    return ring.slots.back();
  }
  // Every slot is in flight: wait for the oldest (the next in ring order). Only this stream's
  // lane waits here.
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = (ring.next + i) % n;
    DescSlot& slot = ring.slots[idx];
    if (slot.retired) continue;
    ring_waits_.fetch_add(1, std::memory_order_relaxed);
    check_vendor(api_, api_.event_synchronize(ctx_, slot.done), "event_synchronize",
                 "(waiting for a kernel descriptor buffer)");
    ring.next = idx + 1;
    slot.recorded = false;
    return slot;
  }
  throw Error(ErrorCode::kInternal,
              std::string(api_.name) + ": every kernel descriptor buffer is retired");
}

void GpuRuntime::enqueue_kernel(void* stream, std::span<const CopyDescriptor> batch) {
  if (!kernel_ok_)
    throw Error(ErrorCode::kNotAvailable,
                std::string(api_.name) + ": the kernel copy path is " + kernel_detail_);
  Ring& ring = ring_of(stream);
  std::lock_guard lock(ring.mu);
  for (std::size_t first = 0; first < batch.size(); first += slot_descs_) {
    const std::size_t count = std::min(slot_descs_, batch.size() - first);
    DescSlot& slot = acquire_slot(ring, stream);
    std::memcpy(slot.host, batch.data() + first, count * sizeof(VendorCopyDesc));
    std::uint64_t total = 0;
    for (std::size_t i = first; i < first + count; ++i) total += batch[i].bytes;
    const std::uint64_t group =
        16ull * static_cast<std::uint64_t>(api_.kernel_threads) * 4;  // chunk x loads in flight
    const int ctas = static_cast<int>(std::clamp<std::uint64_t>(
        (total + group - 1) / group, 1, static_cast<std::uint64_t>(kernel_max_ctas_)));
    const VendorCopyDesc* descs = slot.host_device_view;
    int rc = 0;
    const char* call = "kernel_launch";
    if (slot.staged != nullptr) {
      rc = api_.memcpy_async(ctx_, slot.staged, slot.host, count * sizeof(VendorCopyDesc),
                             kMemcpyHostToDevice, stream);
      call = "memcpy_async";
      descs = slot.staged;
    }
    if (rc == 0) {
      rc = api_.kernel_launch(ctx_, descs, count, ctas, stream);  // the launch's own status
      call = "kernel_launch";
    }
    // Whatever was enqueued may read the slot: it is released only through the event.
    const int rec = api_.event_record(ctx_, slot.done, stream);
    if (rec == 0) {
      slot.recorded = true;
    } else {
      slot.retired = true;
      (void)api_.get_last_error(ctx_);
    }
    if (rc != 0) {
      throw_vendor(api_, rc, call,
                   fmt::format("({} copies, {} bytes, {} CTAs)", count, total, ctas));
    }
    if (rec != 0) throw_vendor(api_, rec, "event_record", "(after the batch copy kernel)");
    kernel_launches_.fetch_add(1, std::memory_order_relaxed);
    kernel_descriptors_.fetch_add(count, std::memory_order_relaxed);
  }
}

}  // namespace kvoffload::gpu
