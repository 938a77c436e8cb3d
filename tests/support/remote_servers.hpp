#pragma once
// Real store servers for the remote-tier tests, started by the tests themselves:
//   ServerProcess   one redis-server or memcached child on an ephemeral loopback port, in its own
//                   temporary directory; stopped (SIGKILL, then reaped) by its destructor, so a
//                   failing test never leaves a server behind. kill9(), stop()/cont() (SIGSTOP,
//                   SIGCONT) and restart() (same port, empty) drive the failure tests.
//   RedisCluster    three cluster-enabled redis-servers joined by `redis-cli --cluster create`
//                   (optionally with more server arguments, e.g. a password, and the redis-cli
//                   arguments that go with them).
//   FakeResp        a scriptable RESP server in a thread, for protocol faults and for cluster
//                   redirects (its script sees each command's connection and the command before
//                   it on that connection, and every command is logged).
// missing_binary() names a server binary that is not installed, so a test can GTEST_SKIP with it;
// SKIP_WITHOUT("redis-server", ...) skips the test (reason no-servers) naming the first one.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "skip.hpp"

namespace kvoffload::test {

inline std::string which(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin", "/bin"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

// "" when all are installed, else the first missing binary's name.
inline std::string missing_binary(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (which(n).empty()) return n;
  }
  return {};
}

// Skips the calling test when a server binary it needs is missing, naming it and the Debian
// packages to install.
#define SKIP_WITHOUT(...)                                                       \
  do {                                                                          \
    const std::string missing = kvoffload::test::missing_binary({__VA_ARGS__}); \
    if (!missing.empty())                                                       \
      KVO_SKIP("no-servers") << missing << " is not installed (Debian: "        \
                             << "redis-server, redis-tools, memcached)";        \
  } while (0)

// A free loopback TCP port (bound, read back, closed; the kernel does not hand it out again soon).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    throw std::runtime_error("bind for a free port failed");
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline bool port_bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A cluster node listens on port and port + 10000 (its bus): both must be free and <= 65535, so
// pick from 20000..29999 (below the kernel's ephemeral range) at random.
inline int free_cluster_port() {
  static std::atomic<unsigned> salt{0};
  unsigned x = static_cast<unsigned>(::getpid()) * 2654435761u + salt.fetch_add(7919);
  for (int i = 0; i < 1000; ++i) {
    x = x * 1103515245u + 12345u;
    const int p = 20000 + static_cast<int>((x >> 8) % 10000);
    if (port_bindable(p) && port_bindable(p + 10000)) return p;
  }
  throw std::runtime_error("no free port pair for a cluster node");
}

inline bool port_accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// Runs a command, returns its exit status and output (stdout+stderr).
inline int run_command(const std::vector<std::string>& argv, std::string* output = nullptr) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ServerProcess {
 public:
  enum class Kind { kRedis, kMemcached };

  // extra: more arguments (e.g. {"--maxmemory", "2mb"}).
  // port 0: a free ephemeral port.
  ServerProcess(Kind kind, std::vector<std::string> extra = {}, int port = 0)
      : kind_(kind), extra_(std::move(extra)) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvo-remote-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    port_ = port != 0 ? port : free_port();
    try {
      start();
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      throw;
    }
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() {
    kill9();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] const std::filesystem::path& dir() const { return dir_; }
  [[nodiscard]] std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] std::string url() const {
    return (kind_ == Kind::kRedis ? "redis://" : "memcached://") + endpoint();
  }

  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);  // a stopped process still dies of SIGKILL, but be tidy
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  void stop() { ::kill(pid_, SIGSTOP); }
  void cont() { ::kill(pid_, SIGCONT); }
  // The same port, empty (no persistence is configured).
  void restart() {
    kill9();
    start();
  }

  // Arguments every later cli() call adds (credentials, TLS), e.g. {"--pass", "pw",
  // "--no-auth-warning"}.
  void set_cli_args(std::vector<std::string> args) { cli_args_ = std::move(args); }

  // redis-cli against this server; returns the output (trimmed).
  std::string cli(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {which("redis-cli"), "-h", "127.0.0.1", "-p",
                                     std::to_string(port_)};
    argv.insert(argv.end(), cli_args_.begin(), cli_args_.end());
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out;
    run_command(argv, &out);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
  }

 private:
  void start() {
    std::vector<std::string> argv;
    if (kind_ == Kind::kRedis) {
      argv = {which("redis-server"),
              "--port",
              std::to_string(port_),
              "--bind",
              "127.0.0.1",
              "--save",
              "",
              "--appendonly",
              "no",
              "--dir",
              dir_.string(),
              "--daemonize",
              "no",
              "--protected-mode",
              "no",
              "--logfile",
              (dir_ / "server.log").string()};
    } else {
      argv = {which("memcached"),
              "-p",
              std::to_string(port_),
              "-l",
              "127.0.0.1",
              "-U",
              "0",
              "-m",
              "64",
              "-I",
              "4m",
              "-t",
              "2"};
      if (::getuid() == 0) {
        argv.emplace_back("-u");
        argv.emplace_back("root");
      }
    }
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      // Dies with the test process, even when that one crashes before its destructors run.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int log = ::open((dir_ / "stdout.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (log >= 0) {
        ::dup2(log, 1);
        ::dup2(log, 2);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pid_ = pid;
    for (int i = 0; i < 500; ++i) {  // up to 5 s
      if (port_accepts(port_)) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("server exited at start; see " + dir_.string());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill9();
    throw std::runtime_error("server did not listen on port " + std::to_string(port_));
  }

  Kind kind_;
  std::vector<std::string> extra_;
  std::vector<std::string> cli_args_;
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

class RedisCluster {
 public:
  // server_extra: more redis-server arguments for every node; cli_args: what redis-cli needs to
  // talk to them (ServerProcess::set_cli_args); port_args: more server arguments that depend on
  // the node's port (a TLS port).
  explicit RedisCluster(int masters = 3, const std::vector<std::string>& server_extra = {},
                        const std::vector<std::string>& cli_args = {},
                        const std::function<std::vector<std::string>(int)>& port_args = {}) {
    for (int i = 0; i < masters; ++i) {
      std::vector<std::string> extra = {"--cluster-enabled",      "yes",
                                        "--cluster-config-file",  "nodes.conf",
                                        "--cluster-node-timeout", "5000"};
      extra.insert(extra.end(), server_extra.begin(), server_extra.end());
      const int port = free_cluster_port();
      if (port_args) {
        const std::vector<std::string> more = port_args(port);
        extra.insert(extra.end(), more.begin(), more.end());
      }
      nodes_.push_back(std::make_unique<ServerProcess>(ServerProcess::Kind::kRedis, extra, port));
      nodes_.back()->set_cli_args(cli_args);
    }
    std::vector<std::string> argv = {which("redis-cli")};
    argv.insert(argv.end(), cli_args.begin(), cli_args.end());
    argv.insert(argv.end(), {"--cluster", "create"});
    for (const auto& n : nodes_) argv.push_back(n->endpoint());
    argv.insert(argv.end(), {"--cluster-replicas", "0", "--cluster-yes"});
    std::string out;
    if (run_command(argv, &out) != 0)
      throw std::runtime_error("redis-cli --cluster create: " + out);
    for (int i = 0; i < 1000; ++i) {  // up to 10 s for every node to agree
      bool ok = true;
      for (const auto& n : nodes_)
        ok = ok && n->cli({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
      if (ok) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    throw std::runtime_error("the cluster did not reach cluster_state:ok");
  }
  ServerProcess& node(std::size_t i) { return *nodes_.at(i); }
  [[nodiscard]] std::size_t size() const { return nodes_.size(); }
  [[nodiscard]] std::string url() const {
    std::string u = "redis-cluster://";
    for (std::size_t i = 0; i < nodes_.size(); ++i) u += (i ? "," : "") + nodes_[i]->endpoint();
    return u;
  }
  [[nodiscard]] std::string node_id(std::size_t i) const {
    return nodes_.at(i)->cli({"CLUSTER", "MYID"});
  }

 private:
  std::vector<std::unique_ptr<ServerProcess>> nodes_;
};

// A RESP server in a thread. For each command it calls the script with the command's arguments
// (and, for a SessionScript, the connection it came on and the command before it there); the
// reply says what to send and whether to then close the connection or stop answering (stall)
// until the server is destroyed. log() lists every command with its connection, in order.
class FakeResp {
 public:
  struct Reply {
    std::string bytes;
    bool close_after = false;
    bool stall = false;
  };
  struct Session {
    int connection = 0;                                  // 1, 2, ... in accept order
    const std::vector<std::string>* previous = nullptr;  // the previous command there (empty: none)
  };
  struct Logged {
    int connection = 0;
    std::vector<std::string> argv;
  };
  using Script = std::function<Reply(const std::vector<std::string>& argv)>;
  using SessionScript =
      std::function<Reply(const std::vector<std::string>& argv, const Session& session)>;

  explicit FakeResp(Script script)
      : FakeResp(SessionScript([s = std::move(script)](const std::vector<std::string>& argv,
                                                       const Session&) { return s(argv); })) {}
  explicit FakeResp(SessionScript script) : script_(std::move(script)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 16) != 0) {
      throw std::runtime_error("fake server: bind/listen failed");
    }
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  FakeResp(const FakeResp&) = delete;
  FakeResp& operator=(const FakeResp&) = delete;
  ~FakeResp() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] int connections() const { return connections_; }
  [[nodiscard]] int commands() const { return commands_; }
  [[nodiscard]] std::vector<Logged> log() const {
    const std::lock_guard lock(log_mutex_);
    return log_;
  }
  // How many logged commands are `name` (e.g. "GET").
  [[nodiscard]] int count(const std::string& name) const {
    const std::lock_guard lock(log_mutex_);
    return static_cast<int>(std::count_if(log_.begin(), log_.end(), [&](const Logged& l) {
      return !l.argv.empty() && l.argv[0] == name;
    }));
  }

  static std::string bulk(const std::string& s) {
    return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
  }

 private:
  struct Conn {
    int fd;
    std::string in;
    bool stalled = false;
    int id = 0;
    std::vector<std::string> previous;
  };

  void serve() {
    std::vector<Conn> conns;
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      for (const auto& c : conns)
        fds.push_back({c.fd, static_cast<short>(c.stalled ? 0 : POLLIN), 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if ((fds[0].revents & POLLIN) != 0) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          conns.push_back({fd, {}, false, ++connections_, {}});
        }
      }
      for (std::size_t i = 0; i < conns.size(); ++i) {
        if ((fds.size() <= i + 1) || (fds[i + 1].revents & (POLLIN | POLLHUP)) == 0) continue;
        char buf[65536];
        const ssize_t n = ::recv(conns[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          ::close(conns[i].fd);
          conns[i].fd = -1;
          continue;
        }
        conns[i].in.append(buf, static_cast<std::size_t>(n));
        std::vector<std::string> argv;
        while (!conns[i].stalled && conns[i].fd >= 0 && parse(conns[i].in, argv)) {
          ++commands_;
          {
            const std::lock_guard lock(log_mutex_);
            log_.push_back({conns[i].id, argv});
          }
          const Reply r = script_(argv, Session{conns[i].id, &conns[i].previous});
          conns[i].previous = argv;
          std::size_t off = 0;
          while (off < r.bytes.size()) {
            const ssize_t w =
                ::send(conns[i].fd, r.bytes.data() + off, r.bytes.size() - off, MSG_NOSIGNAL);
            if (w <= 0) break;
            off += static_cast<std::size_t>(w);
          }
          if (r.close_after) {
            ::close(conns[i].fd);
            conns[i].fd = -1;
          }
          if (r.stall) conns[i].stalled = true;
        }
      }
      std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    }
    for (const auto& c : conns) ::close(c.fd);
  }

  // One RESP array of bulk strings from the front of `in`; false when incomplete.
  static bool parse(std::string& in, std::vector<std::string>& argv) {
    argv.clear();
    if (in.empty() || in[0] != '*') return false;
    std::size_t pos = in.find("\r\n");
    if (pos == std::string::npos) return false;
    const long n = std::strtol(in.c_str() + 1, nullptr, 10);
    std::size_t at = pos + 2;
    for (long k = 0; k < n; ++k) {
      if (at >= in.size() || in[at] != '$') return false;
      const std::size_t e = in.find("\r\n", at);
      if (e == std::string::npos) return false;
      const std::size_t len = std::strtoul(in.c_str() + at + 1, nullptr, 10);
      if (in.size() < e + 2 + len + 2) return false;
      argv.push_back(in.substr(e + 2, len));
      at = e + 2 + len + 2;
    }
    in.erase(0, at);
    return true;
  }

  SessionScript script_;
  mutable std::mutex log_mutex_;
  std::vector<Logged> log_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> commands_{0};
  std::thread thread_;
};

}  // namespace kvoffload::test
