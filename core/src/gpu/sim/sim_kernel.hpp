#pragma once
// Runs the copy kernel (kernels/copy_kernels.cu, compiled for the host) CTA by CTA.
//
// Note [CTA executor]
// Each GPU thread of a CTA is a fiber (ucontext) on the calling host thread; __syncthreads
// switches back to the executor, which resumes the next thread, and releases the barrier once
// every thread of the CTA has reached it. So the block's threads really interleave at their
// barriers, shared memory is really shared, and a barrier costs a context switch of ~100 ns
// instead of waking 256 OS threads. The fibers tell ASan and TSan about each switch.
#include <kvoffload_kernels/copy_kernels.hpp>

#include <ucontext.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace kvoffload::gpu::sim {

class CtaExecutor {
 public:
  explicit CtaExecutor(unsigned threads_per_cta);
  ~CtaExecutor();
  CtaExecutor(const CtaExecutor&) = delete;
  CtaExecutor& operator=(const CtaExecutor&) = delete;

  // Runs the kernel over `descs` (host addresses) with `grid` CTAs, one after another, on the
  // calling thread; returns when every CTA finished.
  void run(const kernels::CopyDesc* descs, std::size_t count, unsigned grid);

  struct Fiber;

 private:
  void run_cta(unsigned block, unsigned grid);
  static void fiber_main();
  static void barrier(void* self);
  void enter(Fiber& f);  // executor -> fiber
  void leave();          // fiber -> executor

  unsigned threads_;
  std::size_t stack_bytes_;
  void* stacks_ = nullptr;  // one mapping, threads_ stacks
  std::vector<std::unique_ptr<Fiber>> fibers_;
  ucontext_t home_{};
  Fiber* current_ = nullptr;
  const void* home_stack_ = nullptr;  // the executor's own stack, for ASan
  std::size_t home_stack_bytes_ = 0;
  void* home_tsan_ = nullptr;
  // Shared memory of the CTA: more than the kernel's BatchShared needs, like a GPU's 48 KiB.
  struct SharedArena {
    alignas(64) unsigned char bytes[48 * 1024];
  };
  std::unique_ptr<SharedArena> shared_;
  const kernels::CopyDesc* descs_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace kvoffload::gpu::sim
