#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace kvoffload::run {

Progress::Progress(double duration_seconds, std::uint64_t requests)
    : duration_(duration_seconds), requests_(requests), tty_(::isatty(STDERR_FILENO) == 1) {}

void Progress::update(std::uint64_t requests, double elapsed, double hit_rate, double store_gbps,
                      double load_gbps, std::uint64_t evictions) {
  const double interval = tty_ ? 0.1 : 1.0;
  if (last_print_ >= 0 && elapsed - last_print_ < interval) return;
  last_print_ = elapsed;
  double fraction = 0;
  if (requests_ != 0) fraction = double(requests) / double(requests_);
  if (duration_ > 0) fraction = std::max(fraction, elapsed / duration_);
  fraction = std::clamp(fraction, 0.0, 1.0);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(kWidth - filled), '-');
    // Progress is best effort: a failed write to stderr must not stop the run.
    (void)std::fprintf(stderr,
                       "\r[%s] %3.0f%%  %llu requests  hit %.1f%%  store %.2f GB/s  load %.2f GB/s "
                       " %llu evictions ",
                       bar.c_str(), fraction * 100, static_cast<unsigned long long>(requests),
                       hit_rate * 100, store_gbps, load_gbps,
                       static_cast<unsigned long long>(evictions));
    drew_ = true;
  } else {
    (void)std::fprintf(stderr,
                       "run: %3.0f%% %llu requests, hit rate %.1f%%, store %.2f GB/s, load %.2f "
                       "GB/s, %llu evictions\n",
                       fraction * 100, static_cast<unsigned long long>(requests), hit_rate * 100,
                       store_gbps, load_gbps, static_cast<unsigned long long>(evictions));
  }
  (void)std::fflush(stderr);
}

void Progress::finish() {
  if (tty_ && drew_) (void)std::fputc('\n', stderr);
}

}  // namespace kvoffload::run
