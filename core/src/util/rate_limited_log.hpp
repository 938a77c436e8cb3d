#pragma once
// Note [Rate-limited warnings]: a failure that repeats per item (every put to a full disk, every
// read of an unreachable store) must not flood the log: a full 8 MiB disk once produced ~750
// identical lines in 4 seconds. RateLimitedLog lets one line per cause out per interval; the
// lines held back are counted and the next line of that cause says how many there were, so no
// event goes unreported. flush() reports what is still held back (call it at close).
//
//   detail::RateLimitedLog warnings(std::chrono::seconds(10));
//   warnings.warn(errno_name(e), "file tier '{}': put failed: {}", name, detail);
//
// A "cause" is a short, stable key (an errno name, "checksum"), not the message: messages carry
// paths and keys and would never repeat. Thread-safe. The clock is injectable for tests.

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "util/log.hpp"

namespace kvoffload::detail {

class RateLimitedLog {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = std::function<Clock::time_point()>;

  explicit RateLimitedLog(Clock::duration interval = std::chrono::seconds(10),
                          Now now = &Clock::now)
      : interval_(interval), now_(std::move(now)) {}

  // nullopt: hold this event back (counted). Otherwise the number held back for `cause` since its
  // previous line; the caller writes one line now.
  std::optional<std::uint64_t> admit(std::string_view cause) {
    const Clock::time_point t = now_();
    std::lock_guard lock(mutex_);
    auto [it, fresh] = causes_.try_emplace(std::string(cause));
    State& s = it->second;
    if (!fresh && t - s.last < interval_) {
      ++s.held;
      return std::nullopt;
    }
    s.last = t;
    return std::exchange(s.held, 0);
  }

  // Logs at `level` unless held back; the message is formatted only when it goes out. Returns
  // whether a line was written.
  template <typename... Args>
  bool log(spdlog::level::level_enum level, std::string_view cause, fmt::format_string<Args...> fmt,
           Args&&... args) {
    const auto held = admit(cause);
    if (!held) return false;
    std::string line = fmt::format(fmt, std::forward<Args>(args)...);
    if (*held > 0)
      line += fmt::format(" ({} more like this held back since the last such line)", *held);
    kvoffload::log().log(level, "{}", line);
    return true;
  }
  template <typename... Args>
  bool warn(std::string_view cause, fmt::format_string<Args...> fmt, Args&&... args) {
    return log(spdlog::level::warn, cause, fmt, std::forward<Args>(args)...);
  }

  // One line per cause with events still held back ("<what>: N more '<cause>' events held back"),
  // then forgets them. Returns the number of lines written.
  std::size_t flush(std::string_view what) {
    std::unordered_map<std::string, std::uint64_t> held;
    {
      std::lock_guard lock(mutex_);
      for (auto& [cause, s] : causes_) {
        if (s.held > 0) held.emplace(cause, std::exchange(s.held, 0));
      }
    }
    for (const auto& [cause, n] : held) {
      kvoffload::log().warn("{}: {} more '{}' events held back since the last such line", what, n,
                            cause);
    }
    return held.size();
  }

 private:
  struct State {
    Clock::time_point last{};
    std::uint64_t held = 0;
  };
  const Clock::duration interval_;
  const Now now_;
  std::mutex mutex_;
  std::unordered_map<std::string, State> causes_;
};

}  // namespace kvoffload::detail
