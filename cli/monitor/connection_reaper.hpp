#pragma once
// Note [Exporter connections]: cpp-httplib serves each connection on a pool thread and bounds only
// each single read (its read timeout), so a client that sends nothing, or one byte now and then,
// holds a thread as long as it likes: 16 idle connections stalled every scrape past Prometheus'
// 10 s timeout, and one idle connection delayed shutdown by its read timeout. The exporter
// (cmd_exporter.cpp) bounds them in five ways:
//   - a pool of kExporterThreads threads, so idle clients do not starve the scrapes;
//   - a listen backlog of SOMAXCONN (raise_listen_backlog), so a burst of connections does not
//     leave a scrape's SYN waiting for a retransmission;
//   - 2 s read and write timeouts and a 2 s keep-alive timeout: a silent client goes in 2 s;
//   - this reaper: a connection may live --request-timeout seconds from the moment it is first
//     seen; past that its socket is shut down (a client dribbling its request byte by byte);
//   - at stop, every connection is shut down, so the pool's threads end at once.
// shutdown(2), not close(2): it wakes the thread blocked on the socket, whose descriptor stays
// cpp-httplib's to close. cpp-httplib does not hand out its connections' descriptors, so the
// reaper finds them in /proc/self/fd: the TCP sockets whose local port is the exporter's and that
// have a peer (the listening socket has none). An exporter process holds no other such socket.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

namespace kvoffload::cli {

inline constexpr int kExporterThreads = 32;

// cpp-httplib 0.11 listens with a backlog of 5: a burst of connections (idle ones, or many
// scrapers) overflows it and a scrape's SYN waits for a retransmission, seconds later. listen(2)
// again on the bound socket (the one on local `port` without a peer) raises it to SOMAXCONN.
// Returns false when no such socket was found.
bool raise_listen_backlog(std::uint16_t port);

class ConnectionReaper {
 public:
  // Starts the sweeping thread for connections to local `port`, each allowed `limit`.
  ConnectionReaper(std::uint16_t port, std::chrono::milliseconds limit);
  ConnectionReaper(const ConnectionReaper&) = delete;
  ConnectionReaper& operator=(const ConnectionReaper&) = delete;
  ~ConnectionReaper();  // stops the thread

  // From now on every connection is shut down as soon as it is seen (the exporter is stopping).
  void close_all() noexcept;

  // Connections shut down so far for running past the limit.
  [[nodiscard]] std::uint64_t reaped() const noexcept;

 private:
  void run();
  void sweep();

  const std::uint16_t port_;
  const std::chrono::milliseconds limit_;
  struct Seen {
    std::chrono::steady_clock::time_point first;
    bool shut = false;
  };
  std::map<ino_t, Seen> seen_;  // by socket inode
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool closing_ = false;
  std::uint64_t reaped_ = 0;
  std::thread thread_;
};

}  // namespace kvoffload::cli
