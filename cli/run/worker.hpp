#pragma once
// One rank of `kvoffload run`: joins the region for its rank, owns device KV caches on the chosen
// backend, and runs the store/load jobs the scheduler sends, verifying every byte it loads.
namespace kvoffload::run {

// Serves the scheduler on `fd` until told to exit, the channel closes, or SIGTERM/SIGINT.
// Returns the process exit code.
int run_worker(int fd);

}  // namespace kvoffload::run
