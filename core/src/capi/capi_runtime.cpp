// C API over DeviceRuntime: the runtime handle, its streams, events, host registrations and
// device memory (kvo_runtime_*, kvo_registration_*). The engine half is capi_transfer.cpp.
#include <memory>
#include <string>
#include <unordered_map>

#include <kvoffload/device_runtime.hpp>

#include "capi/capi_handles.hpp"
#include "capi/capi_internal.hpp"

using kvoffload::Error;
using kvoffload::ErrorCode;
using kvoffload::capi::guarded;
using kvoffload::capi::invalid_arg;
using kvoffload::capi::runtime_of;

namespace {

// Streams and events made through the C API live in the runtime handle's maps, named by their
// native handle. adopt() files a new owner; release() takes one out under the lock and destroys it
// after (finishing a stream's pending work may take a while).
template <typename Owner>
std::uint64_t adopt(kvo_runtime& rt, std::unordered_map<std::uint64_t, Owner>& map, Owner owner) {
  const std::uint64_t handle = owner.native();
  std::lock_guard lock(rt.mutex);
  map.emplace(handle, std::move(owner));
  return handle;
}

template <typename Owner>
void release(kvo_runtime& rt, std::unordered_map<std::uint64_t, Owner>& map, std::uint64_t handle,
             const char* fn, const char* what, const char* creator) {
  Owner victim;
  {
    std::lock_guard lock(rt.mutex);
    auto it = map.find(handle);
    if (it == map.end()) {
      throw Error(ErrorCode::kNotFound, std::string(fn) + ": " + what + " " +
                                            std::to_string(handle) + " was not made by " + creator +
                                            " on this runtime");
    }
    victim = std::move(it->second);
    map.erase(it);
  }
  victim.reset();
}

kvo_status status_of(bool ok) {
  return ok ? KVO_OK : KVO_DEVICE;
}

}  // namespace

extern "C" {

// ---- runtime -----------------------------------------------------------------------------------

kvo_status kvo_runtime_create(const char* backend, int device, kvo_runtime_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(backend);
    KVO_ARG(out);
    if (device < 0) invalid_arg(fn, "device", "is " + std::to_string(device) + "; must be >= 0");
    kvoffload::RuntimeOptions opts;
    opts.device = device;
    *out = std::make_unique<kvo_runtime>(kvoffload::make_runtime(backend, opts)).release();
  });
}

void kvo_runtime_destroy(kvo_runtime_t* runtime) {
  delete runtime;
}

kvo_status kvo_runtime_name(const kvo_runtime_t* runtime, const char** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(runtime);
    KVO_ARG(out);
    *out = runtime->name.c_str();
  });
}

kvo_status kvo_runtime_supports_kernel_path(const kvo_runtime_t* runtime, int* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(runtime);
    KVO_ARG(out);
    *out = runtime->runtime->supports_kernel_path() ? 1 : 0;
  });
}

kvo_status kvo_runtime_stream_create(kvo_runtime_t* runtime, uint64_t* out_stream) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    KVO_ARG(out_stream);
    *out_stream = adopt(rt, rt.streams, rt.runtime->create_stream());
  });
}

kvo_status kvo_runtime_stream_destroy(kvo_runtime_t* runtime, uint64_t stream) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    release(rt, rt.streams, stream, fn, "stream", "kvo_runtime_stream_create");
  });
}

kvo_status kvo_runtime_stream_synchronize(kvo_runtime_t* runtime, uint64_t stream) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    runtime_of(runtime, fn).runtime->synchronize_stream(kvoffload::StreamView::from_native(stream));
  });
}

kvo_status kvo_runtime_event_create(kvo_runtime_t* runtime, uint64_t* out_event) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    KVO_ARG(out_event);
    *out_event = adopt(rt, rt.events, rt.runtime->create_event());
  });
}

kvo_status kvo_runtime_event_destroy(kvo_runtime_t* runtime, uint64_t event) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    release(rt, rt.events, event, fn, "event", "kvo_runtime_event_create");
  });
}

kvo_status kvo_runtime_event_record(kvo_runtime_t* runtime, uint64_t event, uint64_t stream) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    if (event == 0) invalid_arg(fn, "event", "is 0 (not an event)");
    runtime_of(runtime, fn)
        .runtime->record_event(kvoffload::EventView::from_native(event),
                               kvoffload::StreamView::from_native(stream));
  });
}

kvo_status kvo_runtime_event_query(kvo_runtime_t* runtime, uint64_t event, int* out_done) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    KVO_ARG(out_done);
    if (event == 0) invalid_arg(fn, "event", "is 0 (not an event)");
    *out_done = rt.runtime->query_event(kvoffload::EventView::from_native(event)) ? 1 : 0;
  });
}

kvo_status kvo_runtime_event_synchronize(kvo_runtime_t* runtime, uint64_t event) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    if (event == 0) invalid_arg(fn, "event", "is 0 (not an event)");
    runtime_of(runtime, fn).runtime->synchronize_event(kvoffload::EventView::from_native(event));
  });
}

kvo_status kvo_runtime_register_host(kvo_runtime_t* runtime, void* ptr, uint64_t bytes,
                                     uint64_t align, kvo_registration_t** out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    KVO_ARG(ptr);
    KVO_ARG(out);
    if (bytes == 0) invalid_arg(fn, "bytes", "is 0");
    auto reg = std::make_unique<kvo_registration>();
    reg->registration = rt.runtime->register_host(ptr, bytes, align);
    *out = reg.release();
  });
}

kvo_status kvo_registration_device_pointer(const kvo_registration_t* registration,
                                           const void* host_ptr, uint64_t* out) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    KVO_ARG(registration);
    KVO_ARG(out);
    *out = reinterpret_cast<uint64_t>(registration->registration.device_pointer(host_ptr));
  });
}

kvo_status kvo_registration_destroy(kvo_registration_t* registration) {
  if (registration == nullptr) return KVO_OK;
  const bool ok = registration->registration.reset();
  delete registration;
  if (!ok) {
    return kvoffload::capi::set_last_error(
        KVO_DEVICE,
        "kvo_registration_destroy: the backend failed to unregister (the log names "
        "the error); the handle is freed");
  }
  return status_of(ok);
}

kvo_status kvo_runtime_device_alloc(kvo_runtime_t* runtime, uint64_t bytes, uint64_t* out_ptr) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    KVO_ARG(out_ptr);
    if (bytes == 0) invalid_arg(fn, "bytes", "is 0");
    kvoffload::DeviceBuffer b = rt.runtime->allocate_device(bytes);
    const auto address = reinterpret_cast<uint64_t>(b.data());
    std::lock_guard lock(rt.mutex);
    rt.buffers.emplace(address, std::move(b));
    *out_ptr = address;
  });
}

kvo_status kvo_runtime_device_free(kvo_runtime_t* runtime, uint64_t ptr) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    std::lock_guard lock(rt.mutex);
    if (rt.buffers.erase(ptr) == 0) {
      throw Error(ErrorCode::kNotFound,
                  std::string(fn) + ": 0x" + std::to_string(ptr) +
                      " was not allocated by kvo_runtime_device_alloc on this runtime");
    }
  });
}

kvo_status kvo_runtime_memcpy(kvo_runtime_t* runtime, uint64_t dst, uint64_t src, uint64_t bytes) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    if (bytes != 0 && dst == 0) invalid_arg(fn, "dst", "is NULL");
    if (bytes != 0 && src == 0) invalid_arg(fn, "src", "is NULL");
    rt.runtime->memcpy_sync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
                            bytes);
  });
}

kvo_status kvo_runtime_memset(kvo_runtime_t* runtime, uint64_t dst, int value, uint64_t bytes) {
  const char* const fn = __func__;
  return guarded(fn, [&] {
    auto& rt = runtime_of(runtime, fn);
    if (bytes != 0 && dst == 0) invalid_arg(fn, "dst", "is NULL");
    rt.runtime->memset_sync(reinterpret_cast<void*>(dst), value, bytes);
  });
}

}  // extern "C"
