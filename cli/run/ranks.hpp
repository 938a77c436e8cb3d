#pragma once
// The rank processes of `kvoffload run`: started as `kvoffload run-worker` over a socketpair each,
// asked and answered over their Channel, stopped (gracefully, or by SIGKILL after 30 s).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "channel.hpp"

namespace kvoffload::run {

struct RankProcess {
  pid_t pid = -1;
  std::unique_ptr<Channel> channel;
  bool lost = false;               // its channel failed (EOF, reset) while the run needed it
  std::optional<int> wait_status;  // from waitpid, once stop_ranks reaped it
};

// Starts `kvoffload run-worker --fd N` for each rank over a socketpair. The child execs at once,
// so fork() in a process that already has threads (tier I/O) is safe.
std::vector<RankProcess> spawn_ranks(std::uint32_t world_size);

// Ends every rank: `graceful` asks each to exit and collects its "bye" into `byes`; then the
// channels close (EOF ends a rank that did not get "exit") and each process is reaped, killed
// when it has not exited within 30 s.
void stop_ranks(std::vector<RankProcess>& ranks, bool graceful, nlohmann::json* byes = nullptr);

// The next message of rank `index`; throws naming the rank when it reports an error, its channel
// fails (then `lost` is set), or nothing comes within `timeout`.
nlohmann::json receive_from(RankProcess& rank, std::uint32_t index, std::chrono::seconds timeout);

// Sends to rank `index`; a failed channel sets `lost` and throws naming the rank.
void send_to(RankProcess& rank, std::uint32_t index, const nlohmann::json& message);

// How a process ended, from its wait status: "was killed by signal 9 (SIGKILL)", "exited with
// status 3".
std::string describe_wait_status(int status);

// The ranks whose channel failed, each named with its PID and how it ended (after stop_ranks
// reaped them): "rank 1 (PID 4242) was killed by signal 9 (SIGKILL)"; "" when none was lost.
std::string describe_lost_ranks(const std::vector<RankProcess>& ranks);

}  // namespace kvoffload::run
