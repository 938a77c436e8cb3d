// `kvoffload top`: without a terminal (one plain snapshot, JSON, bad options named), and under a
// real pseudo-terminal (frames drawn in place, q quits, signals, the terminal given back).
//
// Watching engines from outside, as an operator does; every test uses its own shm dir, and the
// engines are forked children of the test that publish a scripted state (or a real `kvoffload
// run`). The suite: region_list_test.cpp, top_test.cpp, exporter_test.cpp; its kit:
// monitor_test_util.hpp.

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "monitor_test_util.hpp"
#include "test_env.hpp"

namespace {

using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::occurrences;
using kvoffload::test::ScriptedEngine;
using kvoffload::test::spawn;
using kvoffload::test::TempDir;
using kvoffload::test::unique_id;
using Clock = std::chrono::steady_clock;

constexpr const char* kEnter = "\x1b[?1049h\x1b[?25l";
constexpr const char* kLeave = "\x1b[?25h\x1b[?1049l";

// ---- top ----

TEST(Top, WithoutATerminalPrintsOneSnapshotAsPlainText) {
  TempDir shm;
  TempDir work;
  ScriptedEngine engine(shm.path(), unique_id("plain"));
  auto p = spawn({"top", "--shm-dir", shm.path().string()}, work.path());
  ASSERT_EQ(p->wait(), 0) << p->err();
  const std::string out = p->out();
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << "no escape sequences into a pipe or file";
  EXPECT_NE(out.find(engine.id()), std::string::npos) << out;
  EXPECT_NE(out.find("used 5/8 (62.5 %)  write-pending 0  pinned 2  ready 8/8"), std::string::npos)
      << out;
  EXPECT_NE(out.find("1 engine"), std::string::npos) << out;
  // Each count of the scripted engine is distinct, so a count in the wrong place shows.
  EXPECT_NE(out.find("region     hits 3  pending 1  misses 5  (37.5 % hit)  evictions 0  cannot "
                     "store 0  stores failed 2"),
            std::string::npos)
      << out;
}

TEST(Top, JsonListsEveryEngine) {
  TempDir shm;
  TempDir work;
  ScriptedEngine engine(shm.path(), unique_id("json"));
  auto p = spawn({"top", "--shm-dir", shm.path().string(), "--json"}, work.path());
  ASSERT_EQ(p->wait(), 0) << p->err();
  const json j = json::parse(p->out());
  ASSERT_EQ(j["engines"].size(), 1U);
  EXPECT_EQ(j["engines"][0]["engine_id"], engine.id());
  EXPECT_EQ(j["engines"][0]["live"]["scheduler"]["used"], 5);
}

TEST(Top, RejectsBadOptionsNamingThem) {
  TempDir work;
  for (const std::vector<std::string>& args : {std::vector<std::string>{"top", "--interval", "0"},
                                               {"top", "--interval", "abc"},
                                               {"top", "--frames", "0"}}) {
    auto p = spawn(args, work.path());
    EXPECT_EQ(p->wait(), 2) << args[1] << " " << args[2];
    EXPECT_NE(p->err().find(args[1]), std::string::npos) << p->err();
  }
}

// `top` on a pseudo-terminal: the child gets the slave as its controlling terminal; the test
// reads the master (everything top wrote) and keeps the slave to check the terminal's settings
// after top has gone.
class PtyTop {
 public:
  PtyTop(const std::vector<std::string>& args) {
    winsize ws{};
    ws.ws_row = 40;
    ws.ws_col = 200;
    if (::openpty(&master_, &slave_, nullptr, nullptr, &ws) != 0)
      throw std::runtime_error("openpty");
    ::fcntl(master_, F_SETFD, FD_CLOEXEC);  // top holds the slave only
    termios t{};
    ::tcgetattr(slave_, &t);
    original_lflag_ = t.c_lflag;
    ChildSpec spec;
    spec.args = args;
    spec.terminal = slave_;
    child_ = std::make_unique<ChildProcess>(spec);
  }
  ~PtyTop() {
    child_.reset();  // killed when still running
    ::close(master_);
    ::close(slave_);
  }
  PtyTop(const PtyTop&) = delete;
  PtyTop& operator=(const PtyTop&) = delete;

  // Reads what top wrote until `what` appears (`times` times in all: true) or the time is up.
  bool read_until(const std::string& what, std::chrono::seconds timeout = std::chrono::seconds(60),
                  std::size_t times = 1) {
    const auto deadline = Clock::now() + timeout;
    while (occurrences(output_, what) < times) {
      if (Clock::now() > deadline) return false;
      if (!pump(100)) return occurrences(output_, what) >= times;
    }
    return true;
  }
  // Resizes the terminal: the kernel sends SIGWINCH to its foreground process group (top).
  void resize(unsigned short rows, unsigned short columns) {
    winsize ws{};
    ws.ws_row = rows;
    ws.ws_col = columns;
    ASSERT_EQ(::ioctl(master_, TIOCSWINSZ, &ws), 0);
  }
  void send(const std::string& keys) {
    ASSERT_EQ(::write(master_, keys.data(), keys.size()), static_cast<ssize_t>(keys.size()));
  }
  void signal(int signo) { child_->signal(signo); }

  // Exit status (code, or -signal), draining the output meanwhile.
  int wait(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = Clock::now() + timeout;
    std::optional<int> status;
    for (;;) {
      (void)pump(20);
      status = child_->poll();
      if (status) break;
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "top did not exit; output so far: " << printable();
        status = child_->kill();
        break;
      }
    }
    while (pump(50)) {
    }
    return *status;
  }

  [[nodiscard]] const std::string& output() const { return output_; }
  [[nodiscard]] std::string printable() const {
    std::string s;
    for (const char c : output_) s += c == '\x1b' ? std::string("\\e") : std::string(1, c);
    return s;
  }
  // The terminal's local modes now, and as they were before top started.
  [[nodiscard]] tcflag_t lflag() const {
    termios t{};
    ::tcgetattr(slave_, &t);
    return t.c_lflag;
  }
  [[nodiscard]] tcflag_t original_lflag() const { return original_lflag_; }

 private:
  // One read of the master; false when nothing more can come.
  bool pump(int timeout_ms) {
    pollfd p{master_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return !child_->ended();
    char buf[8192];
    const ssize_t n = ::read(master_, buf, sizeof buf);
    if (n <= 0) return false;
    output_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  int master_ = -1;
  int slave_ = -1;
  std::unique_ptr<ChildProcess> child_;
  tcflag_t original_lflag_ = 0;
  std::string output_;
};

TEST(Top, DrawsFramesInPlaceOnATerminalAndGivesItBack) {
  TempDir shm;
  ScriptedEngine engine(shm.path(), unique_id("pty"));
  PtyTop top({"top", "--shm-dir", shm.path().string(), "--interval", "0.1", "--frames", "3"});
  ASSERT_EQ(top.wait(), 0) << top.printable();
  const std::string& out = top.output();
  ASSERT_EQ(out.rfind(kEnter, 0), 0U) << "the alternate screen first: " << top.printable();
  EXPECT_EQ(occurrences(out, "\x1b[2J"), 1U) << "the screen is cleared once, never per frame";
  EXPECT_EQ(occurrences(out, "\x1b[H\x1b[2J"), 1U);
  EXPECT_EQ(occurrences(out, "\x1b[J"), 3U) << "three frames, each ending in clear-to-end";
  EXPECT_GE(occurrences(out, "\x1b[K"), 3U * 8U) << "every line clears its own tail";
  EXPECT_NE(out.find("used 5/8 (62.5 %)  write-pending 0  pinned 2  ready 8/8"), std::string::npos)
      << top.printable();
  EXPECT_NE(out.find("(q quits)"), std::string::npos);
  ASSERT_GE(out.size(), std::string(kLeave).size());
  EXPECT_EQ(out.substr(out.size() - std::string(kLeave).size()), kLeave)
      << "the terminal is given back last: " << top.printable();
  EXPECT_EQ(top.lflag() & (ICANON | ECHO), top.original_lflag() & (ICANON | ECHO))
      << "line mode and echo restored";
}

TEST(Top, QuitsOnQ) {
  TempDir shm;
  ScriptedEngine engine(shm.path(), unique_id("q"));
  PtyTop top({"top", "--shm-dir", shm.path().string(), "--interval", "30"});
  ASSERT_TRUE(top.read_until("\x1b[J")) << top.printable();
  EXPECT_EQ(top.lflag() & (ICANON | ECHO), 0U) << "keys are read one at a time, unechoed";
  top.send("q");
  EXPECT_EQ(top.wait(), 0) << top.printable();
  const std::string& out = top.output();
  EXPECT_EQ(out.substr(out.size() - std::string(kLeave).size()), kLeave) << top.printable();
  EXPECT_EQ(top.lflag() & (ICANON | ECHO), top.original_lflag() & (ICANON | ECHO));
}

// A resize (SIGWINCH) redraws at once, at the new width, and never ends top. The interval is
// longer than the test waits, so the second frame can only come from the resize.
TEST(Top, RedrawsAtTheNewWidthWhenTheTerminalIsResized) {
  TempDir shm;
  ScriptedEngine engine(shm.path(), unique_id("winch"));
  PtyTop top({"top", "--shm-dir", shm.path().string(), "--interval", "600"});
  ASSERT_TRUE(top.read_until("\x1b[J")) << top.printable();
  const std::string first = top.output();
  ASSERT_NE(first.find("(q quits)"), std::string::npos) << "200 columns hold the whole header";
  top.resize(40, 30);
  ASSERT_TRUE(top.read_until("\x1b[J", std::chrono::seconds(60), 2))
      << "no frame after the resize: " << top.printable();
  // The second frame: every line cut to 30 columns, the header's first 30 characters first.
  std::string second = top.output().substr(first.size());
  second = second.substr(0, second.find("\x1b[J"));
  ASSERT_EQ(second.rfind("\x1b[H", 0), 0U) << top.printable();
  second.erase(0, 3);
  std::vector<std::string> lines;
  for (std::size_t at = 0; at <= second.size();) {
    const std::size_t end = std::min(second.find('\n', at), second.size());
    std::string line = second.substr(at, end - at);
    while (!line.empty() && line.back() == '\r') line.pop_back();  // the terminal adds one too
    ASSERT_GE(line.size(), 3U) << "each line ends in clear-to-end-of-line";
    EXPECT_EQ(line.substr(line.size() - 3), "\x1b[K");
    lines.push_back(line.substr(0, line.size() - 3));
    at = end + 1;
  }
  ASSERT_GE(lines.size(), 2U);
  const std::size_t header_start = first.find("kvoffload top");
  ASSERT_NE(header_start, std::string::npos);
  EXPECT_EQ(lines[0], first.substr(header_start, 30));
  for (const std::string& line : lines) EXPECT_LE(line.size(), 30U) << line;
  top.send("q");
  EXPECT_EQ(top.wait(), 0) << "a resize is not a signal to end: " << top.printable();
}

TEST(Top, GivesTheTerminalBackOnSignals) {
  for (const int signo : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(signo);
    TempDir shm;
    PtyTop top({"top", "--shm-dir", shm.path().string(), "--interval", "30"});
    ASSERT_TRUE(top.read_until("no engines")) << top.printable();
    top.signal(signo);
    EXPECT_EQ(top.wait(), 128 + signo) << top.printable();
    const std::string& out = top.output();
    ASSERT_GE(out.size(), std::string(kLeave).size());
    EXPECT_EQ(out.substr(out.size() - std::string(kLeave).size()), kLeave) << top.printable();
    EXPECT_EQ(top.lflag() & (ICANON | ECHO), top.original_lflag() & (ICANON | ECHO));
  }
}

}  // namespace
