#pragma once
// Ctrl-C (SIGINT) and SIGTERM during `kvoffload run`: they end the run cleanly (the ranks stop,
// the report says "interrupted") instead of killing the scheduler.

#include <csignal>

namespace kvoffload::run {

// Catches SIGINT and SIGTERM while it lives and restores the previous handlers on scope exit. A
// new guard starts uninterrupted.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// Whether SIGINT or SIGTERM arrived since the last guard was made.
bool interrupted() noexcept;

}  // namespace kvoffload::run
