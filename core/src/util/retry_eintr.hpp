#pragma once
// EINTR handling shared by the platform layer (the region's Syscalls table) and the file tier.

#include <cerrno>

namespace kvoffload::detail {

// Runs `call` again while it fails with EINTR (for calls where a retry is correct; never close,
// whose descriptor is gone on Linux whatever it returns).
template <typename F>
auto retry_eintr(F&& call) {
  for (;;) {
    auto result = call();
    if (!(result == -1 && errno == EINTR)) return result;
  }
}

}  // namespace kvoffload::detail
