// The copy kernel's own source compiled for the simulated device, and the CTA executor that runs
// it (Note [Simulated device] in sim_device.hpp, Note [CTA executor] in sim_kernel.hpp).
#include "runtime/sim/sim_kernel.hpp"

#include "runtime/sim/sim_device.hpp"

#define KVOFFLOAD_KERNELS_SIM 1
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include <kvoffload/error.hpp>

#include "copy_kernels.cu"  // NOLINT(bugprone-suspicious-include): the kernel body, written once

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define KVO_SIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define KVO_SIM_TSAN 1
#endif

namespace kvoffload::gpu::sim {
namespace {
thread_local CtaExecutor* g_executor = nullptr;  // the executor running on this host thread
constexpr int kMisalignedAddress = 716;          // cudaErrorMisalignedAddress
}  // namespace
}  // namespace kvoffload::gpu::sim

namespace kvoffload::kernels::sim {
namespace {
thread_local ThreadContext* g_current = nullptr;

void check_vector_address(const void* p) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 15u) != 0) {
    gpu::sim::g_executor->raise(gpu::sim::kMisalignedAddress, p);
  }
}
}  // namespace
ThreadContext& this_thread() noexcept {
  return *g_current;
}
void vector_load(const void* src, void* out16) {
  check_vector_address(src);
  std::memcpy(out16, src, 16);
}
void vector_store(void* dst, const void* in16) {
  check_vector_address(dst);
  std::memcpy(dst, in16, 16);
}
void note_group(unsigned bytes, unsigned capacity) {
  gpu::sim::g_executor->note_group(bytes, capacity);
}
void word_copy(void* dst, const void* src, std::size_t bytes) {
  // An 8-, 4- or 2-byte ld/st.global at an address that is not a multiple of its size faults too.
  for (const void* p : {src, static_cast<const void*>(dst)}) {
    if ((reinterpret_cast<std::uintptr_t>(p) & (bytes - 1)) != 0) {
      gpu::sim::g_executor->raise(gpu::sim::kMisalignedAddress, p, static_cast<unsigned>(bytes));
    }
  }
  std::memcpy(dst, src, bytes);
}
}  // namespace kvoffload::kernels::sim

namespace kvoffload::gpu::sim {

struct CtaExecutor::Fiber {
  ucontext_t context{};
  kernels::sim::ThreadContext thread;
  void* stack = nullptr;
  enum class State : std::uint8_t { kRunnable, kAtBarrier, kDone, kFaulted } state = State::kDone;
  void* tsan = nullptr;
};

namespace {
struct BatchArgs {
  const kernels::CopyDesc* descs;
  std::size_t count;
};
void batch_body(void* arg) {
  const auto* b = static_cast<const BatchArgs*>(arg);
  kernels::sim::run_batch_copy_thread(b->descs, b->count);
}
}  // namespace

CtaExecutor::CtaExecutor(unsigned threads_per_cta)
    : threads_(threads_per_cta),
#if defined(KVO_SIM_ASAN) || defined(KVO_SIM_TSAN)
      stack_bytes_(512 * 1024),  // sanitizer frames are larger
#else
      stack_bytes_(64 * 1024),
#endif
      shared_(std::make_unique<SharedArena>()) {
  stacks_ = ::mmap(nullptr, stack_bytes_ * threads_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks_ == MAP_FAILED) throw_system_error("mmap", errno, "simulated CTA thread stacks");
  for (unsigned t = 0; t < threads_; ++t) {
    auto f = std::make_unique<Fiber>();
    f->stack = static_cast<char*>(stacks_) + t * stack_bytes_;
    f->thread.thread_idx = {t, 0, 0};
    f->thread.shared = shared_->bytes;
    f->thread.sync = &CtaExecutor::barrier;
    f->thread.sync_arg = this;
#if defined(KVO_SIM_TSAN)
    f->tsan = __tsan_create_fiber(0);
#endif
    fibers_.push_back(std::move(f));
  }
}

CtaExecutor::~CtaExecutor() {
#if defined(KVO_SIM_TSAN)
  for (auto& f : fibers_) __tsan_destroy_fiber(f->tsan);
#endif
  ::munmap(stacks_, stack_bytes_ * threads_);
}

void CtaExecutor::fiber_main() {
  CtaExecutor* self = g_executor;
#if defined(KVO_SIM_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &self->home_stack_, &self->home_stack_bytes_);
#endif
  self->body_(self->arg_);
  self->current_->state = Fiber::State::kDone;
  self->leave();  // never resumed: the next CTA makes a new context on this stack
}

void CtaExecutor::raise(int code, const void* address, unsigned width) {
  fault_ = Fault{code, address, current_->thread.block_idx.x, current_->thread.thread_idx.x, width};
  current_->state = Fiber::State::kFaulted;
  leave();  // never resumed: the kernel stops here
  __builtin_unreachable();
}

void CtaExecutor::barrier(void* self) {
  auto* ex = static_cast<CtaExecutor*>(self);
  ex->current_->state = Fiber::State::kAtBarrier;
  ex->leave();
}

void CtaExecutor::enter(Fiber& f) {
  current_ = &f;
  kernels::sim::g_current = &f.thread;
#if defined(KVO_SIM_TSAN)
  __tsan_switch_to_fiber(f.tsan, 0);
#endif
#if defined(KVO_SIM_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, stack_bytes_);
#endif
  ::swapcontext(&home_, &f.context);
#if defined(KVO_SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void CtaExecutor::leave() {
  Fiber& f = *current_;
#if defined(KVO_SIM_TSAN)
  __tsan_switch_to_fiber(home_tsan_, 0);
#endif
#if defined(KVO_SIM_ASAN)
  void* fake = nullptr;
  const bool dying = f.state == Fiber::State::kDone || f.state == Fiber::State::kFaulted;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, home_stack_, home_stack_bytes_);
#endif
  ::swapcontext(&f.context, &home_);
#if defined(KVO_SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake, &home_stack_, &home_stack_bytes_);
#endif
}

void vector_copy16(void* dst, const void* src) {
  unsigned char v[16];
  kernels::sim::vector_load(src, v);
  kernels::sim::vector_store(dst, v);
}
void word_copy(void* dst, const void* src, std::size_t bytes) {
  kernels::sim::word_copy(dst, src, bytes);
}

void CtaExecutor::run(const kernels::CopyDesc* descs, std::size_t count, unsigned grid) {
  BatchArgs args{descs, count};
  run_body(&batch_body, &args, grid);
}

void CtaExecutor::run_body(void (*body)(void*), void* arg, unsigned grid) {
  body_ = body;
  arg_ = arg;
  run_grid(grid);
}

void CtaExecutor::run_grid(unsigned grid) {
  g_executor = this;
  fault_ = Fault{};
#if defined(KVO_SIM_TSAN)
  home_tsan_ = __tsan_get_current_fiber();
#endif
  for (unsigned b = 0; b < grid && fault_.code == 0; ++b) run_cta(b, grid);
  kernels::sim::g_current = nullptr;
  g_executor = nullptr;
}

// Its own function: locals that live across swapcontext (which returns twice, like setjmp) in the
// caller would be at the compiler's mercy.
void CtaExecutor::run_cta(unsigned block, unsigned grid) {
  for (auto& f : fibers_) {
    f->thread.block_idx = {block, 0, 0};
    f->thread.grid_dim = {grid, 1, 1};
    f->state = Fiber::State::kRunnable;
    ::getcontext(&f->context);
    f->context.uc_stack.ss_sp = f->stack;
    f->context.uc_stack.ss_size = stack_bytes_;
    f->context.uc_link = nullptr;
    ::makecontext(&f->context, &CtaExecutor::fiber_main, 0);
  }
  // Round robin: each thread runs to its next barrier (or its end); a barrier opens when every
  // thread that has not finished is waiting at it.
  for (;;) {
    for (auto& f : fibers_) {
      if (f->state == Fiber::State::kRunnable) enter(*f);
      if (fault_.code != 0) return;  // the kernel stopped at the fault
    }
    bool waiting = false;
    for (auto& f : fibers_) {
      if (f->state == Fiber::State::kAtBarrier) {
        f->state = Fiber::State::kRunnable;
        waiting = true;
      }
    }
    if (!waiting) return;  // every thread of the CTA finished
  }
}

}  // namespace kvoffload::gpu::sim
