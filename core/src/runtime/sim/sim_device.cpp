// The simulated device itself (Note [Simulated device] in sim_device.hpp): its construction (the
// reserved address ranges, the vendor table filled from the entry files), per-thread state and
// per-device contexts, its options from the environment, and its test-facing accessors.
//
// Note [Simulated contexts]
// CUDA keeps one primary context per device and process. cudaSetDevice creates it (since CUDA
// 12.0) and binds it to the calling thread; a thread that never chose a device binds device 0's on
// its first runtime call that needs a context (cudaFree(0) is the idiom), and cudaGetDevice
// reports 0 for it either way. A context, once created, lives until the process exits. The
// simulator keeps that state per thread (ThreadState::bound) and per device (DeviceState): every
// call that needs a context goes through Impl::context(), which binds device 0 where nothing is
// bound, creates the context on first use and counts the call for the device. In
// EXCLUSIVE_PROCESS compute mode a context is a lock that one process holds per device
// (ContextLocks: a lock file per device, held until exit, as the GPU holds the context), so a
// second process asking for that device is refused, like a real GPU in that mode.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <kvoffload/error.hpp>

#include "runtime/sim/sim_device_internal.hpp"

namespace kvoffload::gpu::sim {

ThreadState& thread_state(std::uint64_t uid) {
  constexpr int kSlots = 32;
  thread_local ThreadState states[kSlots];
  thread_local int next = 0;
  for (ThreadState& s : states) {
    if (s.device == uid) return s;
  }
  ThreadState& slot = states[next];  // a new device on this thread (round robin past kSlots)
  next = (next + 1) % kSlots;
  slot = ThreadState{uid};
  return slot;
}

namespace {

// Note [Simulated contexts]: the EXCLUSIVE_PROCESS lock of each device, held until exit.
class ContextLocks {
 public:
  // 0, or kDevicesUnavailable when another process holds the device.
  static int acquire(const std::string& dir, int device) {
    static std::mutex mu;
    static std::map<std::string, int> held;  // path -> fd, never closed: the context lives on
    const std::string path = (dir.empty() ? std::string("/tmp") : dir) + "/kvoffload-sim-device-" +
                             std::to_string(device) + ".lock";
    std::lock_guard lock(mu);
    if (held.contains(path)) return kSuccess;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return kDevicesUnavailable;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return kDevicesUnavailable;
    }
    held.emplace(path, fd);
    return kSuccess;
  }
};

int env_int(const char* name, int lo, int hi, int fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    throw_invalid(std::string(name) + "='" + env + "' is not a number from " + std::to_string(lo) +
                  " to " + std::to_string(hi));
  }
  return static_cast<int>(n);
}

std::string env_string(const char* name, const std::string& fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? std::string(env) : fallback;
}

}  // namespace

void append_log_line(const std::string& path, const std::string& text) {
  const std::string line = text + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd >= 0) {
    (void)!::write(fd, line.data(), line.size());
    ::close(fd);
  }
}

// ---- the device ----

SimDevice::Impl::Impl(SimOptions o) : options(std::move(o)) {
  if (options.device_count < 1 || options.device_count > 64) {
    throw_invalid("simulated device: device_count " + std::to_string(options.device_count) +
                  " is not from 1 to 64");
  }
  devices = std::make_unique<DeviceState[]>(static_cast<std::size_t>(options.device_count));
  legacy.resize(static_cast<std::size_t>(options.device_count));
  faults.fail_register_at = options.fail_register_at;
  faults.fail_register_device = options.fail_register_device;
  faults.register_delay_ms = options.register_delay_ms;
  reservation_bytes = options.device_memory_bytes;
  device_reservation = ::mmap(nullptr, reservation_bytes, PROT_NONE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (device_reservation == MAP_FAILED)
    throw_system_error("mmap", errno, "simulated device address space");
  alias = ::mmap(nullptr, reservation_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (alias == MAP_FAILED) {
    const int err = errno;
    ::munmap(device_reservation, reservation_bytes);
    throw_system_error("mmap", err, "simulated device memory alias");
  }
  device_range =
      AddressRange(reinterpret_cast<std::uintptr_t>(device_reservation), reservation_bytes);
  if (!options.unified_addressing) {
    window_reservation = ::mmap(nullptr, reservation_bytes, PROT_NONE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (window_reservation == MAP_FAILED) {
      const int err = errno;
      ::munmap(alias, reservation_bytes);
      ::munmap(device_reservation, reservation_bytes);
      throw_system_error("mmap", err, "simulated device window for host memory");
    }
    window_range =
        AddressRange(reinterpret_cast<std::uintptr_t>(window_reservation), reservation_bytes);
  }
}

SimDevice::Impl::~Impl() {
  wait_retired();
  legacy.clear();
  for (auto& [host, m] : host_maps) {
    if (m.kind != HostMapping::Kind::kRegistered) std::free(reinterpret_cast<void*>(host));
  }
  for (void* p : freed_pinned) std::free(p);
  if (window_reservation != nullptr) ::munmap(window_reservation, reservation_bytes);
  ::munmap(alias, reservation_bytes);
  ::munmap(device_reservation, reservation_bytes);
}

int SimDevice::Impl::create_context(int device) {
  DeviceState& state = devices[static_cast<std::size_t>(device)];
  if (state.context.load(std::memory_order_acquire)) return kSuccess;
  std::lock_guard lock(mu);
  if (state.context.load(std::memory_order_relaxed)) return kSuccess;
  if (options.exclusive_process) {
    if (const int err = ContextLocks::acquire(options.lock_dir, device); err != kSuccess) {
      return err;
    }
  }
  if (!options.context_log.empty()) {
    append_log_line(options.context_log,
                    "pid " + std::to_string(::getpid()) + " device " + std::to_string(device));
  }
  state.context.store(true, std::memory_order_release);
  return kSuccess;
}

int SimDevice::Impl::context(int& device) {
  ThreadState& t = thread_state(uid);
  // Every object the runtime made lives in a primary context; in another one, the calls that
  // use them fail as a GPU's do (invalid resource handle), and the sim refuses every call there.
  if (t.foreign != nullptr) return kInvalidHandle;
  const int want = t.bound < 0 ? 0 : t.bound;  // no context bound: device 0's, as CUDA does
  if (const int err = create_context(want); err != kSuccess) return err;
  t.bound = want;
  devices[static_cast<std::size_t>(want)].calls.fetch_add(1, std::memory_order_relaxed);
  device = want;
  return kSuccess;
}

SimOptions SimOptions::from_env() {
  SimOptions o;
  o.device_count = env_int("KVOFFLOAD_SIM_DEVICES", 1, 64, o.device_count);
  o.driver_version = env_int("KVOFFLOAD_SIM_DRIVER_VERSION", 0, 99000, o.driver_version);
  o.device_arch = env_string("KVOFFLOAD_SIM_ARCH", o.device_arch);
  o.kernel_archs = env_string("KVOFFLOAD_SIM_KERNEL_ARCHS", o.kernel_archs);
  o.context_log = env_string("KVOFFLOAD_SIM_CONTEXT_LOG", "");
  o.register_log = env_string("KVOFFLOAD_SIM_REGISTER_LOG", "");
  const std::string mode = env_string("KVOFFLOAD_SIM_COMPUTE_MODE", "default");
  if (mode == "exclusive_process") {
    o.exclusive_process = true;
    o.lock_dir = env_string("KVOFFLOAD_SIM_LOCK_DIR", "/tmp");
  } else if (mode != "default") {
    throw_invalid("KVOFFLOAD_SIM_COMPUTE_MODE='" + mode +
                  "' is not a compute mode (default or exclusive_process)");
  }
  o.fail_register_at = env_int("KVOFFLOAD_SIM_FAIL_REGISTER_AT", 0, 1'000'000, o.fail_register_at);
  o.fail_register_device =
      env_int("KVOFFLOAD_SIM_FAIL_REGISTER_DEVICE", -1, 63, o.fail_register_device);
  o.register_delay_ms = env_int("KVOFFLOAD_SIM_REGISTER_DELAY_MS", 0, 60'000, o.register_delay_ms);
  return o;
}

SimOptions SimOptions::hip_semantics() {
  SimOptions o;
  o.host_funcs_after_error = true;
  o.wait_value_needs_signal_memory = true;
  return o;
}

SimDevice::SimDevice(SimOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& im = *impl_;
  im.kernel_archs = im.options.kernel_archs;
  VendorApi& a = im.api;
  a.version = kVendorApiVersion;
  a.name = "sim";
  a.ctx = impl_.get();
  a.caps = im.options.unified_addressing ? kCapUnifiedAddressing : 0u;
  a.err_not_ready = kNotReady;
  a.err_capture_implicit = kCaptureImplicit;
  a.legacy_stream = nullptr;
  a.kernel_archs = im.kernel_archs.c_str();
  a.kernel_archs_exact = 1;
  a.min_driver_version = im.options.runtime_version / 1000 * 1000;
  a.min_driver_text = "a simulated driver of the same major version";
  a.kernel_threads = kernels::kBatchCopyThreads;
  install_api_entries(a, im.options);
  install_memory_entries(a, im.options);
  install_copy_entries(a, im.options);
}

SimDevice::~SimDevice() = default;

const VendorApi& SimDevice::api() const noexcept {
  return impl_->api;
}
SimFaults& SimDevice::faults() noexcept {
  return impl_->faults;
}
const SimCounters& SimDevice::counters() const noexcept {
  return impl_->counters;
}
int SimDevice::sticky_error() const noexcept {
  return impl_->sticky();
}
std::string SimDevice::sticky_reason() const {
  std::lock_guard lock(impl_->mu);
  return impl_->sticky_reason;
}
bool SimDevice::is_device_address(const void* ptr) const noexcept {
  return impl_->device_range.contains(reinterpret_cast<std::uintptr_t>(ptr));
}
bool SimDevice::context_created(int device) const noexcept {
  if (device < 0 || device >= impl_->options.device_count) return false;
  return impl_->devices[static_cast<std::size_t>(device)].context.load();
}
int SimDevice::make_foreign_context(int device) {
  if (device < 0 || device >= impl_->options.device_count) return kInvalidDevice;
  if (const int err = impl_->create_context(device); err != kSuccess) return err;
  impl_->foreign_device = device;
  ThreadState& t = thread_state(impl_->uid);
  t.bound = device;
  t.foreign = &impl_->foreign;
  return kSuccess;
}
bool SimDevice::foreign_context_current() const noexcept {
  return thread_state(impl_->uid).foreign != nullptr;
}
std::uint64_t SimDevice::device_calls(int device) const noexcept {
  if (device < 0 || device >= impl_->options.device_count) return 0;
  return impl_->devices[static_cast<std::size_t>(device)].calls.load();
}

std::shared_ptr<SimDevice> default_device() {
  static std::mutex mu;
  static std::weak_ptr<SimDevice> current;
  std::lock_guard lock(mu);
  std::shared_ptr<SimDevice> d = current.lock();
  if (!d) {
    d = std::make_shared<SimDevice>(SimOptions::from_env());
    current = d;
  }
  return d;
}

}  // namespace kvoffload::gpu::sim
