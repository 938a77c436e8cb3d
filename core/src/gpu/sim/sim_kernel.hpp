#pragma once
// Runs the copy kernel (kernels/copy_kernels.cu, compiled for the host) CTA by CTA: one host
// thread per GPU thread of a CTA, the CTA's shared arena, and a barrier for __syncthreads.
#include <kvoffload_kernels/copy_kernels.hpp>

#include <barrier>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvoffload::gpu::sim {

class CtaExecutor {
 public:
  explicit CtaExecutor(unsigned threads_per_cta);
  ~CtaExecutor();
  CtaExecutor(const CtaExecutor&) = delete;
  CtaExecutor& operator=(const CtaExecutor&) = delete;

  // Runs the kernel over `descs` (host addresses) with `grid` CTAs, one after another; returns
  // when every CTA finished. Launches from several streams take turns.
  void run(const kernels::CopyDesc* descs, std::size_t count, unsigned grid);

 private:
  void thread_main(unsigned tid);

  unsigned threads_;
  std::mutex run_mu_;
  std::barrier<> start_;  // threads + the caller
  std::barrier<> end_;    // threads + the caller
  std::barrier<> cta_;    // the CTA's threads: __syncthreads and the step between CTAs
  // Shared memory of the CTA: more than the kernel's BatchShared needs, like a GPU's 48 KiB.
  struct SharedArena {
    alignas(64) unsigned char bytes[48 * 1024];
  };
  std::unique_ptr<SharedArena> shared_;
  // The job, written by run() before `start_` and read by the threads after it.
  const kernels::CopyDesc* descs_ = nullptr;
  std::size_t count_ = 0;
  unsigned grid_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: they start once everything above exists
};

}  // namespace kvoffload::gpu::sim
