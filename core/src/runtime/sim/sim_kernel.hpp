#pragma once
// Runs the copy kernel (kernels/copy_kernels.cu, compiled for the host) CTA by CTA.
//
// Note [CTA executor]
// Each GPU thread of a CTA is a fiber (ucontext) on the calling host thread; __syncthreads
// switches back to the executor, which resumes the next thread, and releases the barrier once
// every thread of the CTA has reached it. So the block's threads really interleave at their
// barriers, shared memory is really shared, and a barrier costs a context switch of ~100 ns
// instead of waking 256 OS threads. The fibers tell ASan and TSan about each switch.
// A fault in a GPU thread (a misaligned vector access) stops the kernel as on a GPU: the faulting
// thread is never resumed, no later thread or CTA runs, and the executor reports the fault.
#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <kvoffload_kernels/copy_kernels.hpp>

namespace kvoffload::gpu::sim {

class CtaExecutor {
 public:
  explicit CtaExecutor(unsigned threads_per_cta);
  ~CtaExecutor();
  CtaExecutor(const CtaExecutor&) = delete;
  CtaExecutor& operator=(const CtaExecutor&) = delete;

  // Runs the kernel over `descs` (host addresses) with `grid` CTAs, one after another, on the
  // calling thread; returns when every CTA finished, or at the first fault (fault()).
  void run(const kernels::CopyDesc* descs, std::size_t count, unsigned grid);
  // Runs body(arg) as every GPU thread of `grid` CTAs (tests: a kernel of their own).
  void run_body(void (*body)(void*), void* arg, unsigned grid);

  struct Fault {
    int code = 0;  // 0: none; else the CUDA error (716: misaligned address)
    const void* address = nullptr;
    unsigned block = 0;
    unsigned thread = 0;
    unsigned width = 16;  // bytes of the access that faulted
  };
  // The fault that stopped the last run, if any.
  [[nodiscard]] const Fault& fault() const noexcept { return fault_; }
  // Called by a GPU thread of this executor: stops the kernel (never returns to the thread).
  [[noreturn]] void raise(int code, const void* address, unsigned width = 16);
  // Called by a GPU thread of the copy kernel per group of loads (kvo_note_group): the bytes it
  // moved and could have moved. Summed over the runs; taken (and zeroed) by take_group_bytes.
  void note_group(unsigned bytes, unsigned capacity) noexcept {
    group_bytes_ += bytes;
    group_capacity_ += capacity;
  }
  struct GroupBytes {
    std::uint64_t moved = 0;
    std::uint64_t capacity = 0;
  };
  GroupBytes take_group_bytes() noexcept {
    const GroupBytes g{group_bytes_, group_capacity_};
    group_bytes_ = group_capacity_ = 0;
    return g;
  }

  struct Fiber;

 private:
  void run_cta(unsigned block, unsigned grid);
  void run_grid(unsigned grid);
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
  void (*body_)(void*) = nullptr;
  void* arg_ = nullptr;
  Fault fault_;
  // Fibers of one executor run on one host thread, one at a time: plain counters.
  std::uint64_t group_bytes_ = 0;
  std::uint64_t group_capacity_ = 0;
};

}  // namespace kvoffload::gpu::sim
