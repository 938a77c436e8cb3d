#pragma once
// One child process running a program as a user runs it: by default the built `kvoffload`
// ($KVOFFLOAD_TEST_BIN_DIR/kvoffload). The CLI, monitor and run suites drive the program only
// through this class:
//   ChildSpec spec;
//   spec.args = {"region", "list", "--json"};
//   spec.out_file = dir / "out";  spec.err_file = dir / "err";
//   ChildProcess child(spec);
//   EXPECT_EQ(child.wait(), 0) << child.err();
// stdout goes to a file or a pipe (read_line), stderr to a file, or all three to a terminal; extra
// environment variables reach the child only. A child still running when the object goes (a test
// that failed half-way) is killed and reaped, with its process group when it has its own.
//
// Exit statuses are ints: the exit code, or -N when signal N ended the process, or kTimedOut when
// it did not end in time (it is killed then and the test fails).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX names it, no header does

namespace kvoffload::test {

// The program under test, as the build placed it.
inline std::string kvoffload_binary() {
  const char* dir = std::getenv("KVOFFLOAD_TEST_BIN_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/kvoffload";
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct ChildSpec {
  std::string program = kvoffload_binary();
  std::vector<std::string> args;           // after the program's name
  std::filesystem::path out_file;          // stdout, truncated (not with pipe_stdout / terminal)
  std::filesystem::path err_file;          // stderr, truncated (not with terminal)
  std::map<std::string, std::string> env;  // set, or replaced, in the child only
  bool pipe_stdout = false;                // stdout into a pipe, read with read_line()
  // setpgid(0, 0), as a terminal job: signal_group() then reaches the processes it forks too.
  bool own_process_group = false;
  // A terminal's slave side (a pty): the child's controlling terminal and its stdin, stdout and
  // stderr, in a session of its own. The caller keeps it open.
  int terminal = -1;
};

class ChildProcess {
 public:
  static constexpr int kTimedOut = -1000;

  explicit ChildProcess(const ChildSpec& spec)
      : group_(spec.own_process_group), program_(spec.program) {
    // Everything the child needs is built here: between fork and exec only async-signal-safe
    // calls run (the test process has threads).
    std::vector<std::string> args{spec.program};
    args.insert(args.end(), spec.args.begin(), spec.args.end());
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env = environment(spec.env);
    std::vector<char*> envp;
    envp.reserve(env.size() + 1);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    int fds[2] = {-1, -1};
    if (spec.pipe_stdout && ::pipe2(fds, O_CLOEXEC) != 0)
      throw std::system_error(errno, std::generic_category(), "pipe2");
    const std::string out_file = spec.out_file.string();
    const std::string err_file = spec.err_file.string();
    pid_ = ::fork();
    if (pid_ < 0) {
      const int e = errno;
      if (spec.pipe_stdout) {
        ::close(fds[0]);
        ::close(fds[1]);
      }
      throw std::system_error(e, std::generic_category(), "fork");
    }
    if (pid_ == 0) {
      if (spec.terminal >= 0) {
        if (::setsid() < 0 || ::ioctl(spec.terminal, TIOCSCTTY, 0) != 0) ::_exit(126);
        for (const int to : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO})
          if (::dup2(spec.terminal, to) < 0) ::_exit(126);
      } else {
        if (spec.own_process_group) ::setpgid(0, 0);
        const int o = spec.pipe_stdout ? fds[1]
                                       : ::open(out_file.c_str(),
                                                O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        const int e = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (o < 0 || e < 0 || ::dup2(o, STDOUT_FILENO) < 0 || ::dup2(e, STDERR_FILENO) < 0)
          ::_exit(126);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    if (spec.pipe_stdout) {
      ::close(fds[1]);
      out_pipe_ = fds[0];
    }
    out_file_ = spec.out_file;
    err_file_ = spec.err_file;
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (!status_) kill();
    if (out_pipe_ >= 0) ::close(out_pipe_);
  }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  // True once the child's end was seen (by poll, wait or kill).
  [[nodiscard]] bool ended() const noexcept { return status_.has_value(); }

  // Sends `signo` to the process / to its process group (own_process_group).
  void signal(int signo) const { ::kill(pid_, signo); }
  void signal_group(int signo) const { ::kill(-pid_, signo); }

  // The exit status when the child has ended, without waiting; nullopt while it runs.
  std::optional<int> poll() {
    if (!status_) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) status_ = decode(status);
      if (r < 0 && errno == ECHILD) {  // reaped behind this object's back: a bug in the test
        ADD_FAILURE() << "pid " << pid_ << " is not a child of the test any more";
        status_ = kTimedOut;
      }
    }
    return status_;
  }

  // Waits for the end; after `timeout` it kills the child, fails the test and returns kTimedOut.
  int wait(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!poll()) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill();
        ADD_FAILURE() << program_name() << " (pid " << pid_ << ") did not exit in "
                      << timeout.count() << " s";
        status_ = kTimedOut;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return *status_;
  }

  // SIGKILL (to its group too when it has one), then reaps it; returns the exit status.
  int kill() {
    if (status_) return *status_;
    if (group_) ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = decode(status);
    return *status_;
  }

  // The next line of the piped stdout (without its newline), waiting at most `timeout`; nullopt
  // when the time is up or stdout was closed first.
  std::optional<std::string> read_line(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (const auto nl = buffered_.find('\n'); nl != std::string::npos) {
        std::string line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || out_pipe_ < 0) return std::nullopt;
      pollfd p{out_pipe_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(out_pipe_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      buffered_.append(buf, static_cast<std::size_t>(n));
    }
  }

  // What the child wrote to its stdout / stderr file so far.
  [[nodiscard]] std::string out() const { return read_text(out_file_); }
  [[nodiscard]] std::string err() const { return read_text(err_file_); }

 private:
  static int decode(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

  // The test's environment with `extra` set on top.
  static std::vector<std::string> environment(const std::map<std::string, std::string>& extra) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (extra.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
    }
    for (const auto& [key, value] : extra) env.push_back(key + "=" + value);
    return env;
  }

  [[nodiscard]] std::string program_name() const {
    return std::filesystem::path(program_).filename().string();
  }

  pid_t pid_ = -1;
  bool group_ = false;
  std::string program_;
  int out_pipe_ = -1;
  std::string buffered_;
  std::filesystem::path out_file_;
  std::filesystem::path err_file_;
  std::optional<int> status_;
};

}  // namespace kvoffload::test
