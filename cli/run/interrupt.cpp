// Ctrl-C and SIGTERM during `kvoffload run` (see interrupt.hpp).
#include "interrupt.hpp"

#include <atomic>

namespace kvoffload::run {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int /*signal*/) {
  g_interrupted.store(true);
}

}  // namespace

InterruptGuard::InterruptGuard() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  g_interrupted.store(false);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

bool interrupted() noexcept {
  return g_interrupted.load();
}

}  // namespace kvoffload::run
