// The one GPU runtime (Note [One GPU runtime over a vendor table] in vendor_api.hpp).
//
// This file: the runtime's construction and teardown, the device guard, the kernel's
// architecture check, and what it reports (info, counters). Registration, streams and events,
// device memory, the DMA path and the kernel path are in their own gpu_*.cpp files.
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
// A thread whose current context is not a primary one (another library's cuCtxCreate) is bound
// too, even when that context is our device's: CUDA's runtime API then "operates on that
// CUcontext" (cuda_runtime_api.h, Context Interoperability), where our streams, events and pool
// memory do not exist, while cudaSetDevice "will bind the primary context of the specified
// device to the calling thread" (cuda_runtime_api.h, cudaSetDevice). The guard binds ours with
// set_device and gives the thread its own context back afterwards (set_context).
//
// Note [Kernel architectures]
// A module's kernels exist for the architectures it was built for. CUDA can compile the embedded
// PTX for a newer GPU, so kernel_check (cudaFuncGetAttributes) decides there; HIP code objects
// are per architecture, and Debian's ROCm 5.2 hipcc does not know gfx942 (MI300), so a build
// there silently lacked it. A device whose architecture the module lacks (kernel_archs_exact) or
// whose kernel_check fails is refused when the runtime is made, naming both, unless DMA only is
// asked for (RuntimeOptions::allow_missing_kernel, KVOFFLOAD_ALLOW_MISSING_KERNEL=1).
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <string_view>

#include <kvoffload/error.hpp>

#include "runtime/gpu/gpu_runtime_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu {

namespace {

std::string version_text(const VendorApi& api, int v) {
  char buf[32] = {};
  api.version_text(api.ctx, v, buf, sizeof buf);
  return buf;
}

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

GpuRuntime::Guard::Guard(const VendorApi& api, int device) : api_(api) {
  if (const int err = bind(device); err != 0) {
    throw_vendor(api_, err, "set_device", "device " + std::to_string(device));
  }
}

GpuRuntime::Guard::Guard(const VendorApi& api, int device, std::nothrow_t /*unused*/) noexcept
    : api_(api) {
  if (const int err = bind(device); err != 0) {
    (void)api_.get_last_error(api_.ctx);
    log_noexcept(spdlog::level::warn, "{}: set_device({}) failed: {}", api_.name, device,
                 api_.error_name(api_.ctx, err));
  }
}

GpuRuntime::Guard::~Guard() {
  if (foreign_ != nullptr) {
    (void)api_.set_context(api_.ctx, foreign_);
  } else if (previous_ >= 0) {
    (void)api_.set_device(api_.ctx, previous_);
  }
}

int GpuRuntime::Guard::bind(int device) noexcept {
  int current = -1;
  if (api_.current_device(api_.ctx, &current) != 0) {
    (void)api_.get_last_error(api_.ctx);
    current = -1;
  }
  void* foreign = nullptr;
  if (current >= 0 && api_.foreign_context(api_.ctx, &foreign) != 0) {
    (void)api_.get_last_error(api_.ctx);
    foreign = nullptr;  // cannot tell: treat it as primary, as before the check existed
  }
  if (current == device && foreign == nullptr) return 0;  // ours: nothing to bind or restore
  const int err = api_.set_device(api_.ctx, device);
  if (err == 0) {
    foreign_ = foreign;
    previous_ = current;  // -1 (none) is never "restored"
  }
  return err;
}

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
  if (api_.device_malloc_async != nullptr && api_.device_free_async != nullptr) {
    int pools = 0;
    if (api_.memory_pools_supported == nullptr ||
        api_.memory_pools_supported(ctx_, device_, &pools) != 0) {
      (void)api_.get_last_error(ctx_);
      pools = 0;
    }
    async_alloc_ = pools != 0;
    if (!async_alloc_) {
      log().info(
          "{}: device {} has no memory pools (stream-ordered allocation unsupported): "
          "device buffers and staged descriptors use plain allocation",
          api_.name, device_);
    }
  }
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
  for (void* host : spare_host_) (void)api_.host_free(ctx_, host);
  spare_host_.clear();
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

}  // namespace kvoffload::gpu
