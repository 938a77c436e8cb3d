#pragma once
// A full-screen session on a terminal for `kvoffload top`: the alternate screen with the cursor
// hidden, keys read one at a time without echo, frames drawn without flicker, and the terminal
// given back as it was on every way out (return, exception, q, SIGINT/SIGTERM/SIGHUP/SIGQUIT;
// Ctrl-Z gives it back while the program is stopped and takes it again on fg).
//
// Frames: cursor home, every line cut to the screen's width and followed by clear-to-end-of-line,
// then clear-to-end-of-screen, all in one write: nothing is ever cleared before it is redrawn, so
// the screen does not flicker.

#include <termios.h>

#include <chrono>
#include <string>
#include <vector>

namespace kvoffload::cli {

class TerminalScreen {
 public:
  enum class Event {
    kTimeout,  // nothing happened within the wait
    kQuit,     // 'q' or 'Q' was pressed
    kSignal,   // a terminating signal arrived: signal_number()
    kRedraw,   // the window was resized, or the program came back from Ctrl-Z
  };

  // `out_fd` must be a terminal; `in_fd` is read for keys when it is one. Only one session may
  // exist at a time (it owns the signal handlers). Throws Error(kSystem) when the terminal
  // cannot be set up (nothing is left changed).
  TerminalScreen(int in_fd, int out_fd);
  ~TerminalScreen();
  TerminalScreen(const TerminalScreen&) = delete;
  TerminalScreen& operator=(const TerminalScreen&) = delete;

  void draw(const std::vector<std::string>& lines);
  // Waits at most `timeout` for a key, a signal or a resize.
  Event wait(std::chrono::milliseconds timeout);
  [[nodiscard]] int signal_number() const noexcept { return signal_; }

  // The bytes a frame is made of (exposed for tests): `lines` cut to `columns`, at most `rows`.
  static std::string frame(const std::vector<std::string>& lines, unsigned rows, unsigned columns);

  static constexpr const char* kEnter = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";
  static constexpr const char* kLeave = "\x1b[?25h\x1b[?1049l";

 private:
  void enter();
  void leave() noexcept;
  void suspend();

  int in_fd_;
  int out_fd_;
  bool termios_saved_ = false;  // in_fd_ is a terminal: cbreak while active, restored after
  bool keys_ = false;           // keys are read from in_fd_ (until it reports end of input)
  bool active_ = false;
  struct termios saved_ {};
  int signal_ = 0;
};

}  // namespace kvoffload::cli
