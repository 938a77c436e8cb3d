#pragma once
// What `kvoffload top` draws: the engines of a node as lines of text, one frame at a time. Pure
// (no terminal I/O) so tests can check a frame; terminal.hpp puts frames on the screen.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <kvoffload/live_stats.hpp>

namespace kvoffload::cli {

// Transfer rates between two frames: bytes moved since the previous frame over its wall time.
class RateTracker {
 public:
  using Clock = std::chrono::steady_clock;
  // Records this frame's byte counts; call once per frame before rate().
  void update(const std::vector<EngineSnapshot>& engines, Clock::time_point now);
  // GB/s of (engine, rank, store?) over the last interval; negative when unknown (first frame, a
  // restarted rank).
  [[nodiscard]] double rate(const std::string& engine_id, std::uint32_t rank, bool store) const;

 private:
  struct Sample {
    std::uint64_t store_bytes = 0;
    std::uint64_t load_bytes = 0;
    Clock::time_point at;
  };
  std::map<std::pair<std::string, std::uint32_t>, Sample> last_;
  std::map<std::pair<std::string, std::uint32_t>, std::pair<double, double>> rates_;
};

struct TopHeader {
  std::filesystem::path shm_dir;
  double interval_seconds = 1.0;
  std::string clock;        // "12:00:01", local time of the frame
  bool interactive = true;  // "q quits" hint
};

// The frame's lines (no escape sequences, no newlines); callers cut them to the screen's width.
std::vector<std::string> render_top(const std::vector<EngineSnapshot>& engines,
                                    const RateTracker& rates, const TopHeader& header);

}  // namespace kvoffload::cli
