#pragma once
// The rank processes of `kvoffload run`: started as `kvoffload run-worker` over a socketpair each,
// asked and answered over their Channel, stopped (gracefully, or by SIGKILL after 30 s).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "channel.hpp"

namespace kvoffload::run {

struct RankProcess {
  pid_t pid = -1;
  std::unique_ptr<Channel> channel;
};

// Starts `kvoffload run-worker --fd N` for each rank over a socketpair. The child execs at once,
// so fork() in a process that already has threads (tier I/O) is safe.
std::vector<RankProcess> spawn_ranks(std::uint32_t world_size);

// Ends every rank: `graceful` asks each to exit and collects its "bye" into `byes`; then the
// channels close (EOF ends a rank that did not get "exit") and each process is reaped, killed
// when it has not exited within 30 s.
void stop_ranks(std::vector<RankProcess>& ranks, bool graceful, nlohmann::json* byes = nullptr);

// The next message of rank `index`; throws naming the rank when it reports an error, its channel
// fails, or nothing comes within `timeout`.
nlohmann::json receive_from(RankProcess& rank, std::uint32_t index, std::chrono::seconds timeout);

}  // namespace kvoffload::run
