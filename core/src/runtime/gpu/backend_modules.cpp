// The cuda and hip backends are modules (libkvoffload_cuda.so, libkvoffload_hip.so) that export
// one vendor table; they are opened here on first use, so that libkvoffload itself links neither
// libcudart nor libamdhip64: one build starts on a machine with either runtime or neither, and a
// process that never asks for a GPU backend pays nothing for loading them.
//
// Search order for a module: $KVOFFLOAD_BACKEND_DIR, the directory libkvoffload was loaded from,
// then the dynamic linker's own search (LD_LIBRARY_PATH, rpath, system directories). Programs and
// test suites that link the objects instead of libkvoffload (the INTERNAL suites, the benchmark)
// are executables in bin/: the build gives every target a build RPATH to the modules' directory
// (core/, CMAKE_BUILD_RPATH in the top CMakeLists.txt), so the linker's search finds them there.
//
// Note [Not built vs not loadable]
// The build says which modules it made (KVOFFLOAD_BUILT_CUDA / KVOFFLOAD_BUILT_HIP, set on this
// file only). A backend that was not built reads "does not include it"; a backend that was built
// and whose module cannot be found or loaded (a missing libcudart, a stale copy) names every path
// tried and each dlerror(): it is a fault to fix, never a "not built" that suites skip over.
//
// Note [Driver floor]
// A module runs on drivers of its toolkit's major version and newer: CUDA's minor-version
// compatibility lets a 12.x runtime run on any R525+ driver, while a module built with CUDA 13
// needs an R580+ driver. On an older driver every CUDA call fails with "insufficient driver",
// which says nothing about what to do. So `kvoffload probe` and make_runtime first compare the
// driver's version (cudaDriverGetVersion works without a GPU, and reports 0 with no driver) with
// the module's floor, and say which driver was found, which the module needs, and what to do:
// update the driver, or rebuild kvoffload against the toolkit matching it.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>

#include <kvoffload/error.hpp>

#include "runtime/backend_factories.hpp"
#include "runtime/gpu/gpu_runtime.hpp"
#include "runtime/sim/sim_device.hpp"
#include "util/log.hpp"

namespace kvoffload::detail {

namespace {

struct Module {
  const gpu::VendorApi* api = nullptr;
  std::string why;     // when api is null
  bool built = false;  // this build made the module, or it was found anyway
};

std::string library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || info.dli_fname == nullptr)
    return {};
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

#ifndef KVOFFLOAD_BUILT_CUDA
#define KVOFFLOAD_BUILT_CUDA 0
#endif
#ifndef KVOFFLOAD_BUILT_HIP
#define KVOFFLOAD_BUILT_HIP 0
#endif

constexpr bool kBuiltCuda = KVOFFLOAD_BUILT_CUDA != 0;
constexpr bool kBuiltHip = KVOFFLOAD_BUILT_HIP != 0;

bool module_built(std::string_view name) {
  if (name == "cuda") return kBuiltCuda;
  return kBuiltHip;
}

Module open_module(std::string_view name) {
  Module m;
  const bool built = module_built(name);
  const std::string file = "libkvoffload_" + std::string(name) + ".so";
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("KVOFFLOAD_BACKEND_DIR"); dir != nullptr && *dir != '\0') {
    candidates.push_back(std::string(dir) + "/" + file);
  }
  if (std::string dir = library_dir(); !dir.empty()) candidates.push_back(dir + "/" + file);
  candidates.push_back(file);
  std::string errors;
  void* handle = nullptr;
  for (const std::string& path : candidates) {
    const bool bare = path.find('/') == std::string::npos;
    if (!bare && !std::filesystem::exists(path)) continue;
    // RTLD_LOCAL: the vendor runtime's symbols stay out of the global namespace (a Python
    // process may hold another copy of libcudart).
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char* err = ::dlerror();
    const std::string text = err != nullptr ? err : path;
    // Not built, and the bare name is not on the linker's path either: nothing to report. A
    // built module is always reported (Note [Not built vs not loadable]).
    if (!built && bare && text.find(file + ": cannot open shared object file") != std::string::npos)
      continue;
    if (!errors.empty()) errors += "; ";
    if (bare) errors.append("dlopen(").append(path).append("): ");
    errors += text;
  }
  if (handle == nullptr) {
    if (errors.empty()) {
      m.why = "this build of kvoffload does not include it (no " + file +
              "; configure with -DKVOFFLOAD_" + (name == "cuda" ? "CUDA" : "HIP") + "=ON)";
    } else {
      std::string tried;
      for (const std::string& path : candidates) tried += (tried.empty() ? "" : ", ") + path;
      m.why = "its module could not be loaded (tried " + tried + "): " + errors;
    }
    m.built = built || !errors.empty();  // a module that is there but does not load
    return m;
  }
  m.built = true;
  auto entry = reinterpret_cast<gpu::VendorApiEntry>(::dlsym(handle, gpu::kVendorApiEntrySymbol));
  if (entry == nullptr) {
    m.why = file + " exports no " + gpu::kVendorApiEntrySymbol;
    return m;  // the handle stays open: unloading a vendor runtime is never safe
  }
  char why[512] = {};
  const gpu::VendorApi* api = entry(why, sizeof why);
  if (api == nullptr) {
    m.why = why;
    return m;
  }
  if (api->version != gpu::kVendorApiVersion) {
    m.why = file + " implements vendor table version " + std::to_string(api->version) +
            ", this library needs " + std::to_string(gpu::kVendorApiVersion) +
            " (mixed installations?)";
    return m;
  }
  m.api = api;
  return m;
}

// Opened once per process and kept (a vendor runtime is never unloaded).
const Module& module(std::string_view name) {
  static std::once_flag cuda_once;
  static std::once_flag hip_once;
  static Module cuda;
  static Module hip;
  if (name == "cuda") {
    std::call_once(cuda_once, [] { cuda = open_module("cuda"); });
    return cuda;
  }
  std::call_once(hip_once, [] { hip = open_module("hip"); });
  return hip;
}

std::string visible_devices_hint(std::string_view name) {
  const char* var = name == "cuda" ? "CUDA_VISIBLE_DEVICES" : "HIP_VISIBLE_DEVICES";
  const char* env = std::getenv(var);
  return env != nullptr ? std::string(" (") + var + "=" + env + ")" : std::string();
}

// Device count, or -1 with the reason.
int device_count(const gpu::VendorApi& api, std::string& why) {
  int count = 0;
  if (const int err = api.get_device_count(api.ctx, &count); err != 0) {
    (void)api.get_last_error(api.ctx);
    why = std::string("get_device_count: ") + api.error_name(api.ctx, err) + ": " +
          api.error_string(api.ctx, err);
    return -1;
  }
  return count;
}

std::string version_string(const gpu::VendorApi& api, int version) {
  char text[32] = {};
  api.version_text(api.ctx, version, text, sizeof text);
  return text;
}

// Empty when the driver is new enough for the module; else what is wrong and what to do.
std::string driver_floor_problem(const gpu::VendorApi& api) {
  if (api.min_driver_version <= 0) return {};
  int driver = 0;
  int runtime = 0;
  if (api.driver_version(api.ctx, &driver) != 0) (void)api.get_last_error(api.ctx);
  if (api.runtime_version(api.ctx, &runtime) != 0) (void)api.get_last_error(api.ctx);
  if (driver >= api.min_driver_version) return {};
  const std::string vendor = std::string_view(api.name) == "cuda" ? "CUDA" : api.name;
  const std::string needs = fmt::format(
      "this {} module was built with {} {} and needs a driver for {} {} or newer ({})", api.name,
      vendor, version_string(api, runtime), vendor, version_string(api, api.min_driver_version),
      api.min_driver_text != nullptr ? api.min_driver_text : "");
  if (driver == 0) {
    return "no driver is installed (the driver reports version 0); " + needs + ": install one";
  }
  const std::string have = version_string(api, driver);
  return fmt::format(
      "the installed driver supports {} {} at most; {}. Update the driver, or rebuild kvoffload "
      "against a toolkit the driver supports ({} {} or older, e.g. cmake "
      "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-{}/bin/nvcc)",
      vendor, have, needs, vendor, have, have);
}

BackendInfo probe_api(const gpu::VendorApi& api) {
  BackendInfo info{api.name, true, 0, {}};
  if (std::string problem = driver_floor_problem(api); !problem.empty()) {
    info.detail = "unusable: " + problem;
    return info;
  }
  std::string why;
  const int count = device_count(api, why);
  if (count < 0) {
    info.detail = "no usable device: " + why;
    return info;
  }
  int driver = 0;
  int runtime = 0;
  (void)api.driver_version(api.ctx, &driver);
  (void)api.runtime_version(api.ctx, &runtime);
  char dv[32] = {};
  char rv[32] = {};
  api.version_text(api.ctx, driver, dv, sizeof dv);
  api.version_text(api.ctx, runtime, rv, sizeof rv);
  info.device_count = count;
  info.detail = std::string("driver ") + dv + ", runtime " + rv;
  if (count == 0) info.detail += "; no device visible" + visible_devices_hint(api.name);
  for (int i = 0; i < count; ++i) {
    char name[256] = {};
    char arch[64] = {};
    if (api.device_describe(api.ctx, i, name, sizeof name, arch, sizeof arch) == 0) {
      info.detail += "; " + std::to_string(i) + ": " + name + " (" + arch + ")";
    }
  }
  (void)api.get_last_error(api.ctx);
  return info;
}

std::unique_ptr<DeviceRuntime> make_on(const gpu::VendorApi& api, const RuntimeOptions& options,
                                       std::shared_ptr<void> keep) {
  if (std::string problem = driver_floor_problem(api); !problem.empty()) {
    throw Error(ErrorCode::kNotAvailable,
                "device runtime '" + std::string(api.name) + "' is not available: " + problem);
  }
  std::string why;
  const int count = device_count(api, why);
  if (count < 0) {
    throw Error(ErrorCode::kNotAvailable, "device runtime '" + std::string(api.name) +
                                              "' is not available: no usable device: " + why);
  }
  if (count == 0) {
    throw Error(ErrorCode::kNotAvailable, "device runtime '" + std::string(api.name) +
                                              "' is not available: no device visible" +
                                              visible_devices_hint(api.name));
  }
  if (options.device < 0 || options.device >= count) {
    throw_invalid(std::string(api.name) + ": device " + std::to_string(options.device) +
                  " does not exist (" + std::to_string(count) + " visible, 0 to " +
                  std::to_string(count - 1) + ")" + visible_devices_hint(api.name));
  }
  return std::make_unique<gpu::GpuRuntime>(api, options, std::move(keep));
}

}  // namespace

std::unique_ptr<DeviceRuntime> make_vendor_runtime(std::string_view name,
                                                   const RuntimeOptions& options) {
  const Module& m = module(name);
  if (m.api == nullptr) {
    throw Error(ErrorCode::kNotAvailable,
                "device runtime '" + std::string(name) + "' is not available: " + m.why);
  }
  return make_on(*m.api, options, {});
}

BackendInfo probe_vendor(std::string_view name) {
  try {
    const Module& m = module(name);
    if (m.api == nullptr) return BackendInfo{std::string(name), m.built, 0, m.why};
    return probe_api(*m.api);
  } catch (...) {
    return BackendInfo{std::string(name), false, 0, "probe failed"};
  }
}

std::unique_ptr<DeviceRuntime> make_sim_runtime(const RuntimeOptions& options,
                                                std::shared_ptr<gpu::sim::SimDevice> device) {
  if (!device) device = gpu::sim::default_device();
  const gpu::VendorApi& api = device->api();
  return make_on(api, options, std::move(device));
}

BackendInfo probe_sim() {
  try {
    BackendInfo info = probe_api(gpu::sim::default_device()->api());
    info.detail += "; the GPU runtime on a CPU simulation (never chosen by auto)";
    return info;
  } catch (const std::exception& e) {
    return BackendInfo{"sim", true, 0, e.what()};
  }
}

}  // namespace kvoffload::detail
