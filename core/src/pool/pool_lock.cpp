// The node pool's index lock: a process-shared robust mutex, taken with a bounded wait.
//
// Note [Pool lock]: why a robust mutex and not the region's OFD locks. Every index operation is
// a critical section of a few hundred nanoseconds; a pthread mutex costs one atomic instruction
// uncontended, an fcntl lock two system calls. Robustness gives the liveness signal exactly where
// it matters: the kernel marks the mutex of a holder that died (any death, SIGKILL included)
// and the next locker gets EOWNERDEAD, repairs, and only then calls pthread_mutex_consistent, so
// a locker that dies while repairing leaves EOWNERDEAD for the next one. A stopped holder cannot
// be told from a slow one by the mutex, so the wait is bounded (pthread_mutex_clocklock on
// CLOCK_MONOTONIC) and the timeout names the holder's PID, which each holder writes into the
// header after locking, and its state from /proc (T: stopped).
//
// Note [Pool lock under TSan]: GCC 12's libtsan intercepts pthread_mutex_lock, _trylock,
// _timedlock and _unlock but not pthread_mutex_clocklock, so without help TSan never sees this
// lock taken: it reports every index access as a race and every unlock as "unlock of an unlocked
// mutex". In TSan builds lock() reports the acquisition by hand, as a try-lock (it can fail, on
// timeout), with the annotations of <sanitizer/tsan_interface.h>. The release is reported by the
// interceptor of pthread_mutex_unlock itself, so unlock() adds no __tsan_mutex_pre/post_unlock:
// with them TSan counts two releases and reports the second. No create/destroy either: TSan makes
// the sync object on first use and the munmap interceptor drops it with the mapping. The limit:
// TSan tracks memory by virtual address in one process, so it checks threads of one process
// (tests/pool/pool_thread_test.cpp) and cannot see races between tenants in different processes,
// nor between two mappings of the file at different addresses.
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include <kvoffload/error.hpp>

#include "pool/pool_impl.hpp"
#include "pool/proc_stat.hpp"

#if defined(__SANITIZE_THREAD__)
#define KVOFFLOAD_POOL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVOFFLOAD_POOL_TSAN 1
#endif
#endif
#ifdef KVOFFLOAD_POOL_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace kvoffload::pool::detail {

namespace {

std::uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

std::string describe_holder(pid_t pid) {
  if (pid <= 0) return "a process that has not recorded its PID yet";
  const auto st = read_proc_stat(pid);
  if (!st) return "PID " + std::to_string(pid) + " (no longer in /proc)";
  std::string s = "PID " + std::to_string(pid) + " (state " + std::string(1, st->state);
  if (st->state == 'T' || st->state == 't') s += ": stopped; SIGCONT or kill it";
  return s + ")";
}

}  // namespace

void PoolImpl::lock(Op op, bool hooked) {
  if (file_.base == nullptr) {
    throw Error(ErrorCode::kState, "node pool '" + file_.path.string() +
                                       "': " + std::string(to_string(op)) + " after detach()");
  }
  timespec deadline{};
  ::clock_gettime(CLOCK_MONOTONIC, &deadline);
  const auto ms = options_.lock_timeout.count();
  deadline.tv_sec += static_cast<time_t>(ms / 1000);
  deadline.tv_nsec += static_cast<long>(ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
#ifdef KVOFFLOAD_POOL_TSAN
  __tsan_mutex_pre_lock(&v_.h->mutex, __tsan_mutex_try_lock);  // Note [Pool lock under TSan]
#endif
  const int rc = pthread_mutex_clocklock(&v_.h->mutex, CLOCK_MONOTONIC, &deadline);
#ifdef KVOFFLOAD_POOL_TSAN
  __tsan_mutex_post_lock(&v_.h->mutex,
                         rc == 0 || rc == EOWNERDEAD
                             ? __tsan_mutex_try_lock
                             : __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed,
                         0);
#endif
  if (rc == ETIMEDOUT) {
    const pid_t holder = __atomic_load_n(&v_.h->holder_pid, __ATOMIC_RELAXED);
    char secs[32];
    (void)std::snprintf(secs, sizeof secs, "%.3f", static_cast<double>(ms) / 1000.0);
    throw Error(ErrorCode::kTimeout,
                "node pool '" + file_.path.string() + "': " + std::string(to_string(op)) +
                    " waited " + secs + " s for the index lock, held by " +
                    describe_holder(holder) +
                    "; the operation is refused (nothing changed), the pool serves again once "
                    "the holder runs or dies");
  }
  if (rc != 0 && rc != EOWNERDEAD) {
    throw_system_error("pthread_mutex_clocklock", rc,
                       "(the index lock of node pool '" + file_.path.string() + "')");
  }
  locked_ = true;
  hooked_ = hooked;
  __atomic_store_n(&v_.h->holder_pid, pid_, __ATOMIC_RELAXED);
  op_ = op;
  step_ = 0;
  if (rc == EOWNERDEAD) {
    // The holder died inside an operation: the derived structures may be half-changed. Repair
    // from the slot records, then mark the mutex consistent (Note [Pool lock]).
    op_ = Op::kRepair;
    repair(dead_tenants());
    pthread_mutex_consistent(&v_.h->mutex);
    op_ = op;
    step_ = 0;
  }
  step();
  if (op != Op::kAttach || tenant_ != kNone) sweep_if_due();
}

void PoolImpl::unlock() noexcept {
  if (!locked_) return;
  __atomic_store_n(&v_.h->holder_pid, 0, __ATOMIC_RELAXED);
  locked_ = false;
  // Intercepted under TSan: it reports the release (Note [Pool lock under TSan]).
  pthread_mutex_unlock(&v_.h->mutex);
}

void PoolImpl::sweep_if_due() {
  const std::uint64_t now = monotonic_ns();
  const auto interval = static_cast<std::uint64_t>(options_.sweep_interval.count()) * 1000000ULL;
  if (now - v_.h->last_sweep_ns < interval && v_.h->last_sweep_ns != 0) return;
  v_.h->last_sweep_ns = now;
  if (const std::uint64_t dead = dead_tenants(); dead != 0) {
    const Op was = op_;
    const std::uint32_t at = step_;
    op_ = Op::kRepair;
    step_ = 0;
    repair(dead);
    op_ = was;
    step_ = at;
  }
}

}  // namespace kvoffload::pool::detail
