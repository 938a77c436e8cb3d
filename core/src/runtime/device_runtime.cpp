// Owners of device-runtime handles and the runtime factory.
#include <algorithm>
#include <atomic>
#include <utility>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/error.hpp>

#include "runtime/backend_factories.hpp"
#include "util/log.hpp"

namespace kvoffload {

std::string_view to_string(CopyPath path) noexcept {
  return path == CopyPath::kKernel ? "kernel" : "dma";
}

std::string_view to_string(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "h2d";
    case CopyKind::kDeviceToHost:
      return "d2h";
    case CopyKind::kDeviceToDevice:
      return "d2d";
    case CopyKind::kHostToHost:
      return "h2h";
  }
  return "?";
}

// ---- owners ----

Stream::Stream(Stream&& other) noexcept
    : runtime_(std::exchange(other.runtime_, nullptr)), handle_(std::exchange(other.handle_, 0)) {}
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    runtime_ = std::exchange(other.runtime_, nullptr);
    handle_ = std::exchange(other.handle_, 0);
  }
  return *this;
}
Stream::~Stream() {
  reset();
}
void Stream::reset() noexcept {
  if (handle_ != 0 && runtime_ != nullptr) runtime_->do_destroy_stream(handle_);
  handle_ = 0;
  runtime_ = nullptr;
}

Event::Event(Event&& other) noexcept
    : runtime_(std::exchange(other.runtime_, nullptr)), handle_(std::exchange(other.handle_, 0)) {}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    runtime_ = std::exchange(other.runtime_, nullptr);
    handle_ = std::exchange(other.handle_, 0);
  }
  return *this;
}
Event::~Event() {
  reset();
}
void Event::reset() noexcept {
  if (handle_ != 0 && runtime_ != nullptr) runtime_->do_destroy_event(handle_);
  handle_ = 0;
  runtime_ = nullptr;
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : runtime_(std::exchange(other.runtime_, nullptr)),
      handle_(std::exchange(other.handle_, 0)),
      host_(std::exchange(other.host_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(std::exchange(other.device_, nullptr)),
      segments_(std::exchange(other.segments_, {})) {}
HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    reset();
    runtime_ = std::exchange(other.runtime_, nullptr);
    handle_ = std::exchange(other.handle_, 0);
    host_ = std::exchange(other.host_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = std::exchange(other.device_, nullptr);
    segments_ = std::exchange(other.segments_, {});
  }
  return *this;
}
HostRegistration::~HostRegistration() {
  reset();
}
bool HostRegistration::reset() noexcept {
  bool ok = true;
  if (handle_ != 0 && runtime_ != nullptr) ok = runtime_->do_unregister_host(handle_);
  runtime_ = nullptr;
  handle_ = 0;
  host_ = nullptr;
  bytes_ = 0;
  device_ = nullptr;
  segments_.clear();
  return ok;
}
void* HostRegistration::device_pointer(const void* host_ptr) const {
  const auto* p = static_cast<const std::byte*>(host_ptr);
  const auto* base = static_cast<const std::byte*>(host_);
  if (handle_ == 0 || p < base || p > base + bytes_) {
    throw_invalid("HostRegistration::device_pointer: pointer is outside the registered range");
  }
  const auto off = static_cast<std::size_t>(p - base);
  // The segment holding `off` (the one-past-the-end address maps through the last segment).
  auto it = std::upper_bound(segments_.begin(), segments_.end(), off,
                             [](std::size_t o, const DeviceSegment& s) { return o < s.offset; });
  if (it != segments_.begin()) --it;
  return static_cast<std::byte*>(it->device) + (off - it->offset);
}

HostFlag::HostFlag(HostFlag&& other) noexcept
    : runtime_(std::exchange(other.runtime_, nullptr)),
      word_(std::exchange(other.word_, nullptr)) {}
HostFlag& HostFlag::operator=(HostFlag&& other) noexcept {
  if (this != &other) {
    reset();
    runtime_ = std::exchange(other.runtime_, nullptr);
    word_ = std::exchange(other.word_, nullptr);
  }
  return *this;
}
HostFlag::~HostFlag() {
  reset();
}
void HostFlag::set(std::uint32_t value) noexcept {
  std::atomic_ref<std::uint32_t>(*word_).store(value, std::memory_order_release);
}
std::uint32_t HostFlag::value() const noexcept {
  return std::atomic_ref<std::uint32_t>(*word_).load(std::memory_order_acquire);
}
void HostFlag::reset() noexcept {
  if (word_ != nullptr && runtime_ != nullptr) runtime_->do_destroy_host_flag(word_);
  runtime_ = nullptr;
  word_ = nullptr;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : runtime_(std::exchange(other.runtime_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    runtime_ = std::exchange(other.runtime_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  reset();
}
void DeviceBuffer::reset() noexcept {
  if (ptr_ != nullptr && runtime_ != nullptr) runtime_->do_free_device(ptr_);
  runtime_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

void DeviceBuffer::release_async(StreamView stream) noexcept {
  if (ptr_ != nullptr && runtime_ != nullptr) runtime_->do_free_device_async(ptr_, stream.native());
  runtime_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

// ---- DeviceRuntime ----

DeviceRuntime::~DeviceRuntime() = default;
ForwardingRuntime::~ForwardingRuntime() = default;

void DeviceRuntime::do_free_device_async(void* ptr, std::uintptr_t stream) noexcept {
  try {
    do_synchronize_stream(stream);
  } catch (const std::exception& e) {
    try {
      log().warn("free_device_async: synchronizing the stream failed ({}); freeing anyway",
                 e.what());
    } catch (...) {
    }
  }
  do_free_device(ptr);
}

std::uint32_t* DeviceRuntime::do_create_host_flag() {
  return new std::uint32_t(0);
}
void DeviceRuntime::do_destroy_host_flag(std::uint32_t* flag) noexcept {
  delete flag;
}
bool DeviceRuntime::do_stream_capturing(std::uintptr_t /*stream*/) {
  return false;
}

HostRegistration DeviceRuntime::register_host(void* ptr, std::size_t bytes, std::size_t align) {
  if (ptr == nullptr || bytes == 0) {
    throw_invalid("register_host: empty range");
  }
  RegistrationRecord rec = do_register_host(ptr, bytes, align);
  if (rec.segments.empty()) rec.segments.push_back(DeviceSegment{0, bytes, rec.device_base});
  return HostRegistration(this, rec.handle, ptr, bytes, std::move(rec.segments));
}

Stream DeviceRuntime::create_stream() {
  return Stream(this, do_create_stream());
}

Event DeviceRuntime::create_event(bool timing) {
  return Event(this, do_create_event(timing));
}

DeviceBuffer DeviceRuntime::allocate_device(std::size_t bytes) {
  if (bytes == 0) throw_invalid("allocate_device: zero bytes");
  return DeviceBuffer(this, do_allocate_device(bytes), bytes);
}

HostFlag DeviceRuntime::create_host_flag() {
  return HostFlag(this, do_create_host_flag());
}

// ---- factory ----

std::vector<BackendInfo> list_backends() {
  return {detail::probe_vendor("cuda"), detail::probe_vendor("hip"), detail::probe_host(),
          detail::probe_sim()};
}

BackendInfo probe_backend(std::string_view name) {
  if (name == "host") return detail::probe_host();
  if (name == "sim") return detail::probe_sim();
  if (name == "cuda" || name == "hip") return detail::probe_vendor(name);
  if (name == "auto") {
    for (std::string_view gpu : {"cuda", "hip"}) {
      if (BackendInfo info = detail::probe_vendor(gpu); info.device_count > 0) return info;
    }
    return detail::probe_host();
  }
  throw_invalid("unknown device runtime '" + std::string(name) +
                "' (expected host, sim, cuda, hip or auto)");
}

std::unique_ptr<DeviceRuntime> make_runtime(std::string_view name, const RuntimeOptions& options) {
  if (name == "host") return detail::make_host_runtime(options);
  if (name == "sim") return detail::make_sim_runtime(options);
  if (name == "cuda" || name == "hip") return detail::make_vendor_runtime(name, options);
  if (name == "auto") {
    // cuda if its module loads and sees a device, else hip, else host (never sim); the reason
    // for each skip is logged.
    for (std::string_view gpu : {"cuda", "hip"}) {
      if (BackendInfo info = detail::probe_vendor(gpu); info.device_count > 0) {
        return detail::make_vendor_runtime(gpu, options);
      } else {
        log().info("runtime auto: {} skipped ({})", gpu, info.detail);
      }
    }
    return detail::make_host_runtime(options);
  }
  throw_invalid("unknown device runtime '" + std::string(name) +
                "' (expected host, sim, cuda, hip or auto)");
}

}  // namespace kvoffload
