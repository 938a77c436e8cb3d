// The copy kernel's own source compiled for the simulated device, and the CTA executor that runs
// it (Note [Simulated device] in sim_device.hpp).
#include "gpu/sim/sim_kernel.hpp"

#define KVOFFLOAD_KERNELS_SIM 1
#include "copy_kernels.cu"  // NOLINT(bugprone-suspicious-include): the kernel body, written once

namespace kvoffload::kernels::sim {

ThreadContext& this_thread() noexcept {
  thread_local ThreadContext context;
  return context;
}

}  // namespace kvoffload::kernels::sim

namespace kvoffload::gpu::sim {

CtaExecutor::CtaExecutor(unsigned threads_per_cta)
    : threads_(threads_per_cta),
      start_(static_cast<std::ptrdiff_t>(threads_per_cta) + 1),
      end_(static_cast<std::ptrdiff_t>(threads_per_cta) + 1),
      cta_(static_cast<std::ptrdiff_t>(threads_per_cta)),
      shared_(std::make_unique<SharedArena>()) {
  workers_.reserve(threads_);
  for (unsigned t = 0; t < threads_; ++t) workers_.emplace_back([this, t] { thread_main(t); });
}

CtaExecutor::~CtaExecutor() {
  {
    std::lock_guard lock(run_mu_);
    stop_ = true;
    start_.arrive_and_wait();
  }
  for (auto& w : workers_) w.join();
}

void CtaExecutor::run(const kernels::CopyDesc* descs, std::size_t count, unsigned grid) {
  std::lock_guard lock(run_mu_);
  descs_ = descs;
  count_ = count;
  grid_ = grid;
  start_.arrive_and_wait();
  end_.arrive_and_wait();
}

void CtaExecutor::thread_main(unsigned tid) {
  kernels::sim::ThreadContext& ctx = kernels::sim::this_thread();
  ctx.thread_idx = {tid, 0, 0};
  ctx.shared = shared_->bytes;
  ctx.barrier = &cta_;
  for (;;) {
    start_.arrive_and_wait();
    if (stop_) return;
    ctx.grid_dim = {grid_, 1, 1};
    for (unsigned b = 0; b < grid_; ++b) {
      ctx.block_idx = {b, 0, 0};
      kernels::sim::run_batch_copy_thread(descs_, count_);
      cta_.arrive_and_wait();  // the next CTA reuses the shared arena
    }
    end_.arrive_and_wait();
  }
}

}  // namespace kvoffload::gpu::sim
