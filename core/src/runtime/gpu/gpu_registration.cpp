// The GPU runtime's host registration: planning the pieces of a large registration, registering
// and unregistering them, and the device address of each piece.
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
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <kvoffload/error.hpp>

#include "runtime/gpu/gpu_runtime_internal.hpp"
#include "util/log.hpp"

namespace kvoffload::gpu {

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

}  // namespace kvoffload::gpu
