#pragma once
// Progress of `kvoffload run` on stderr: a redrawn bar on a terminal, a plain line a second
// otherwise (logs, CI), so stdout stays clean for --json.
#include <cstdint>

namespace kvoffload::run {

class Progress {
 public:
  // duration_seconds or requests (whichever is set) gives the fraction done.
  Progress(double duration_seconds, std::uint64_t requests);
  void update(std::uint64_t requests, double elapsed, double hit_rate, double store_gbps,
              double load_gbps, std::uint64_t evictions);
  void finish();

 private:
  double duration_;
  std::uint64_t requests_;
  bool tty_;
  double last_print_ = -1.0;
  bool drew_ = false;
};

}  // namespace kvoffload::run
