#include "monitor/terminal.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <kvoffload/error.hpp>

namespace kvoffload::cli {
namespace {

// The self-pipe the signal handlers write to, so that poll() wakes up for them.
int g_signal_pipe[2] = {-1, -1};

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGTSTP, SIGCONT};
struct sigaction g_previous[std::size(kHandled)];

extern "C" void on_terminal_signal(int signo) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(signo);
  (void)!::write(g_signal_pipe[1], &byte, 1);  // a full pipe already holds a wake-up
  errno = saved;
}

void write_all(int fd, const std::string& bytes) noexcept {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the terminal went away: nothing left to draw on
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

TerminalScreen::TerminalScreen(int in_fd, int out_fd) : in_fd_(in_fd), out_fd_(out_fd) {
  if (::isatty(out_fd_) == 0)
    throw Error(ErrorCode::kState, "top: standard output is not a terminal");
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw_system_error("pipe2", errno, "(the signal pipe of top)");
  }
  struct sigaction sa {};
  sa.sa_handler = on_terminal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < std::size(kHandled); ++i) {
    (void)::sigaction(kHandled[i], &sa, &g_previous[i]);
  }
  termios_saved_ = ::isatty(in_fd_) != 0 && ::tcgetattr(in_fd_, &saved_) == 0;
  keys_ = termios_saved_;
  enter();
}

TerminalScreen::~TerminalScreen() {
  leave();
  for (std::size_t i = 0; i < std::size(kHandled); ++i) {
    (void)::sigaction(kHandled[i], &g_previous[i], nullptr);
  }
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

void TerminalScreen::enter() {
  if (termios_saved_) {
    struct termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    (void)::tcsetattr(in_fd_, TCSANOW, &raw);
  }
  write_all(out_fd_, kEnter);
  active_ = true;
}

void TerminalScreen::leave() noexcept {
  if (!active_) return;
  write_all(out_fd_, kLeave);
  if (termios_saved_) (void)::tcsetattr(in_fd_, TCSANOW, &saved_);
  active_ = false;
}

void TerminalScreen::suspend() {
  // Give the terminal back, stop as the default action would, and take it again on SIGCONT.
  leave();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  struct sigaction mine {};
  (void)::sigaction(SIGTSTP, &dfl, &mine);
  (void)::raise(SIGTSTP);  // stops here until fg
  (void)::sigaction(SIGTSTP, &mine, nullptr);
  if (termios_saved_)
    (void)::tcgetattr(in_fd_, &saved_);  // the shell may have changed it meanwhile
  enter();
}

std::string TerminalScreen::frame(const std::vector<std::string>& lines, unsigned rows,
                                  unsigned columns) {
  std::string out = "\x1b[H";
  const std::size_t n = std::min<std::size_t>(lines.size(), rows);
  for (std::size_t i = 0; i < n; ++i) {
    out.append(lines[i], 0, columns);
    out += "\x1b[K";
    if (i + 1 < n) out += "\r\n";  // never a newline on the last row: it would scroll
  }
  out += "\x1b[J";
  return out;
}

void TerminalScreen::draw(const std::vector<std::string>& lines) {
  struct winsize ws {};
  unsigned rows = 24;
  unsigned columns = 80;
  if (::ioctl(out_fd_, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
    rows = ws.ws_row;
    columns = ws.ws_col;
  }
  write_all(out_fd_, frame(lines, rows, columns));
}

TerminalScreen::Event TerminalScreen::wait(std::chrono::milliseconds timeout) {
  struct pollfd fds[2] = {{g_signal_pipe[0], POLLIN, 0}, {keys_ ? in_fd_ : -1, POLLIN, 0}};
  const int n = ::poll(fds, 2, static_cast<int>(std::max<std::int64_t>(0, timeout.count())));
  if (n < 0) {
    if (errno == EINTR) return Event::kTimeout;
    throw_system_error("poll", errno, "(top waiting for a key)");
  }
  if ((fds[0].revents & POLLIN) != 0) {
    unsigned char signo = 0;
    while (::read(g_signal_pipe[0], &signo, 1) == 1) {
      if (signo == SIGWINCH || signo == SIGCONT) continue;
      if (signo == SIGTSTP) {
        suspend();
        continue;
      }
      signal_ = signo;
      return Event::kSignal;
    }
    return Event::kRedraw;
  }
  if ((fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
    char key = 0;
    const ssize_t got = ::read(in_fd_, &key, 1);
    if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
      keys_ = false;  // the input went away: keep showing frames, Ctrl-C still ends it
      return Event::kTimeout;
    }
    if (key == 'q' || key == 'Q') return Event::kQuit;
    return Event::kRedraw;  // any other key refreshes now
  }
  return Event::kTimeout;
}

}  // namespace kvoffload::cli
