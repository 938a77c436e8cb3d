// Watching engines from outside, as an operator does: `kvoffload region list` with occupancy,
// `kvoffload top` under a real pseudo-terminal (frames, q, signals, the terminal given back) and
// without one, and `kvoffload exporter` scraped over HTTP (its text checked by the Prometheus
// client's own parser and naming rules: check_prometheus.py), also while a `kvoffload run` goes,
// against that run's JSON. Every test uses its own shm dir; the engines are forked children of the
// test that publish a scripted state (or a real `kvoffload run`).
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <kvoffload/manager.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/region.hpp>

#include "child_process.hpp"
#include "test_env.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::read_text;
using kvoffload::test::TempDir;
using kvoffload::test::unique_id;
using Clock = std::chrono::steady_clock;

constexpr const char* kEnter = "\x1b[?1049h\x1b[?25l";
constexpr const char* kLeave = "\x1b[?25h\x1b[?1049l";

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The program in its own process group, stdout to a file in `dir` (or to a pipe, read with
// read_line), stderr to a file in `dir`.
std::unique_ptr<ChildProcess> spawn(const std::vector<std::string>& args, const fs::path& dir,
                                    bool pipe_stdout = false) {
  static int counter = 0;
  const std::string tag = std::to_string(counter++);
  ChildSpec spec;
  spec.args = args;
  spec.out_file = dir / ("out" + tag);
  spec.err_file = dir / ("err" + tag);
  spec.pipe_stdout = pipe_stdout;
  spec.own_process_group = true;
  return std::make_unique<ChildProcess>(spec);
}

// An engine's scheduler in a child process: an OffloadStack over a region of 8 chunks (2 ranks),
// which looks up 5 keys (misses), stores them and pins 2 for a load, then holds until released.
// With `tier_root`, a file tier named `tier_name` sits behind the region.
class ScriptedEngine {
 public:
  ScriptedEngine(const fs::path& shm_dir, std::string id, const fs::path& tier_root = {},
                 const std::string& tier_name = "file")
      : id_(std::move(id)) {
    int ready[2];
    int hold[2];
    if (::pipe(ready) != 0 || ::pipe(hold) != 0) throw std::runtime_error("pipe");
    pid_ = kvoffload::test::fork_child([&] {
      ::close(ready[0]);
      ::close(hold[1]);
      kvoffload::StackConfig config;
      config.region.engine_id = id_;
      config.region.layout = {.num_chunks = 8, .slot_bytes = 4096, .world_size = 2};
      config.region.shm_dir = shm_dir;
      if (!tier_root.empty()) {
        config.file_tiers.push_back(
            {.root = tier_root, .capacity_bytes = 1 << 20, .name = tier_name});
      }
      auto stack = kvoffload::OffloadStack::build(config);
      kvoffload::Manager& m = stack->manager();
      std::vector<kvoffload::BlockKey> keys;
      for (std::uint64_t i = 0; i < 5; ++i) keys.emplace_back(i + 1, i * 3);
      (void)stack->store().lookup(keys);
      const kvoffload::StorePlan plan = m.prepare_store(keys);
      stack->store().complete_store(plan.keys, true);
      (void)stack->store().drain();
      (void)m.prepare_load(std::span(keys).first(2));
      char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) return 2;
      (void)::read(hold[0], &byte, 1);  // EOF: released
      m.complete_load(std::span(keys).first(2));
      return stack->close() ? 0 : 3;
    });
    ::close(ready[1]);
    ::close(hold[0]);
    hold_ = hold[1];
    char byte = 0;
    if (::read(ready[0], &byte, 1) != 1) ADD_FAILURE() << "the scripted engine did not start";
    ::close(ready[0]);
  }
  ~ScriptedEngine() { release(); }
  ScriptedEngine(const ScriptedEngine&) = delete;
  ScriptedEngine& operator=(const ScriptedEngine&) = delete;

  void release() {
    if (hold_ < 0) return;
    ::close(hold_);
    hold_ = -1;
    const int status = kvoffload::test::wait_child(pid_);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  [[nodiscard]] const std::string& id() const { return id_; }
  [[nodiscard]] pid_t pid() const { return pid_; }

 private:
  std::string id_;
  pid_t pid_ = -1;
  int hold_ = -1;
};

// ---- region list ----

TEST(RegionList, ShowsEachEnginesOccupancyInTextAndJson) {
  TempDir shm;
  TempDir work;
  ScriptedEngine engine(shm.path(), unique_id("list"));
  auto p = spawn({"region", "list", "--shm-dir", shm.path().string(), "--json"}, work.path());
  ASSERT_EQ(p->wait(), 0) << p->err();
  const json j = json::parse(p->out());
  ASSERT_EQ(j["regions"].size(), 1U);
  const json& live = j["regions"][0]["live"];
  const json& s = live["scheduler"];
  EXPECT_TRUE(s["attached"].get<bool>());
  EXPECT_EQ(s["pid"], engine.pid());
  EXPECT_EQ(s["chunks"], 8);
  EXPECT_EQ(s["used"], 5);
  EXPECT_EQ(s["pinned"], 2);
  EXPECT_EQ(s["write_pending"], 0);
  EXPECT_EQ(s["misses"], 5);
  EXPECT_EQ(s["stores_completed"], 5);
  EXPECT_EQ(live["ranks"].size(), 2U);
  EXPECT_EQ(live["ranks"][0]["bringup"]["state"], "pending");

  auto text = spawn({"region", "list", "--shm-dir", shm.path().string()}, work.path());
  ASSERT_EQ(text->wait(), 0) << text->err();
  EXPECT_NE(text->out().find("used 5 of 8 chunks (62.5 %), 0 write-pending, 2 pinned, 8 "
                             "ready; hits 0, misses 5 (0.0 % hit); 0 evictions; bring-up "
                             "0 of 2 ranks ready"),
            std::string::npos)
      << text->out();
}

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

  // Reads what top wrote until `what` appears (true) or the time is up.
  bool read_until(const std::string& what,
                  std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = Clock::now() + timeout;
    while (output_.find(what) == std::string::npos) {
      if (Clock::now() > deadline) return false;
      if (!pump(100)) return output_.find(what) != std::string::npos;
    }
    return true;
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

// ---- exporter ----

std::string python() {
  return KVOFFLOAD_TEST_PYTHON;
}

// The exposition through check_prometheus.py: Prometheus' own parser and naming rules. Returns
// (name, labels) -> value.
std::map<std::string, double> parse_exposition(const std::string& text, const fs::path& dir) {
  const fs::path in = dir / "metrics.txt";
  const fs::path out = dir / "samples.json";
  const fs::path err = dir / "check.err";
  std::ofstream(in, std::ios::binary) << text;
  const std::string cmd = python() + " " + KVOFFLOAD_TEST_SOURCE_DIR + "/check_prometheus.py " +
                          in.string() + " > " + out.string() + " 2> " + err.string();
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "check_prometheus.py: " << read_text(err) << "\n" << text;
  std::map<std::string, double> samples;
  if (rc != 0) return samples;
  const json parsed = json::parse(read_text(out));
  for (const json& s : parsed["samples"]) {
    std::string key = s[0].get<std::string>() + "{";
    for (const auto& [k, v] : s[1].items()) key += k + "=" + v.get<std::string>() + ",";
    samples[key + "}"] = s[2].get<double>();
  }
  return samples;
}

// "name{a=1,b=2,}" as parse_exposition keys it (labels in sorted order).
std::string sample(const std::string& name, const std::map<std::string, std::string>& labels) {
  std::string key = name + "{";
  for (const auto& [k, v] : labels) key.append(k).append("=").append(v).append(",");
  return key + "}";
}

double value(const std::map<std::string, double>& samples, const std::string& key) {
  const auto it = samples.find(key);
  EXPECT_NE(it, samples.end()) << "no sample " << key << " among " << samples.size()
                               << (samples.empty() ? std::string()
                                                   : ", e.g. " + samples.begin()->first);
  return it == samples.end() ? -1 : it->second;
}

struct Exporter {
  std::unique_ptr<ChildProcess> proc;
  int port = 0;

  Exporter(const fs::path& shm, const fs::path& work, const std::string& listen = "127.0.0.1:0") {
    proc = spawn({"exporter", "--listen", listen, "--shm-dir", shm.string(), "--json"}, work, true);
    const auto line = proc->read_line();
    if (!line) {
      ADD_FAILURE() << "the exporter printed nothing: " << proc->err();
      return;
    }
    const json j = json::parse(*line);
    port = j["port"].get<int>();
    EXPECT_EQ(j["url"], "http://127.0.0.1:" + std::to_string(port) + "/metrics");
  }
  ~Exporter() {
    if (proc && !proc->ended()) {
      proc->signal(SIGTERM);
      EXPECT_EQ(proc->wait(), 0) << "SIGTERM stops the exporter cleanly: " << proc->err();
    }
  }
  httplib::Result get(const std::string& path) const {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(std::chrono::seconds(30));
    return client.Get(path);
  }
};

TEST(Exporter, RejectsBadListenValuesNamingThem) {
  TempDir shm;
  TempDir work;
  for (const std::string bad : {"9477", "localhost:", "127.0.0.1:99999", "127.0.0.1:http",
                                "::1:9477", "[::1", "[::1]9477", "bad host:9477"}) {
    auto p = spawn({"exporter", "--listen", bad, "--shm-dir", shm.path().string()}, work.path());
    EXPECT_EQ(p->wait(), 2) << bad;
    EXPECT_NE(p->err().find("'" + bad + "'"), std::string::npos) << p->err();
    EXPECT_NE(p->err().find("HOST:PORT"), std::string::npos) << p->err();
  }
  auto missing = spawn({"exporter", "--shm-dir", shm.path().string()}, work.path());
  EXPECT_EQ(missing->wait(), 2);
  EXPECT_NE(missing->err().find("--listen"), std::string::npos) << missing->err();
  auto unresolvable =
      spawn({"exporter", "--listen", "no-such-host.invalid:9477", "--shm-dir", shm.path().string()},
            work.path());
  EXPECT_EQ(unresolvable->wait(), 2);
  EXPECT_NE(unresolvable->err().find("cannot resolve"), std::string::npos) << unresolvable->err();
  auto no_dir =
      spawn({"exporter", "--listen", "127.0.0.1:0", "--shm-dir", (shm.path() / "missing").string()},
            work.path());
  EXPECT_EQ(no_dir->wait(), 2);
  EXPECT_NE(no_dir->err().find("does not exist"), std::string::npos) << no_dir->err();
}

TEST(Exporter, APortInUseIsAClearErrorAndTwoExportersNeverShareOne) {
  TempDir shm;
  TempDir work;
  const Exporter first(shm.path(), work.path());
  ASSERT_GT(first.port, 0);
  const std::string taken = "127.0.0.1:" + std::to_string(first.port);
  auto second =
      spawn({"exporter", "--listen", taken, "--shm-dir", shm.path().string()}, work.path());
  EXPECT_EQ(second->wait(), 1);
  EXPECT_NE(second->err().find("cannot listen on " + taken + ": the port is in use"),
            std::string::npos)
      << second->err();
}

TEST(Exporter, ServesEveryRegionOfTheNodeInPrometheusFormat) {
  TempDir shm;
  TempDir work;
  TempDir tier("/tmp");
  // A tier name with the characters the format escapes in label values.
  const std::string tier_name = "disk \"a\"\\b\nc";
  ScriptedEngine engine(shm.path(), unique_id("scrape"), tier.path() / "t", tier_name);
  // Beside it: a region nobody schedules (held by `region create`) and an entry that is no region.
  auto holder = spawn({"region", "create", "--engine-id", "idle", "--chunks", "4", "--slot-bytes",
                       "4096", "--world-size", "1", "--rank", "0", "--shm-dir", shm.path().string(),
                       "--hold", "600", "--json"},
                      work.path(), true);
  ASSERT_TRUE(holder->read_line()) << holder->err();
  ASSERT_EQ(::mkfifo((shm.path() / "kvoffload_fifo.region").c_str(), 0600), 0);

  const Exporter exporter(shm.path(), work.path());
  const httplib::Result res = exporter.get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const auto samples = parse_exposition(res->body, work.path());
  const std::string& id = engine.id();
  EXPECT_EQ(value(samples, sample("kvoffload_regions", {})), 3);
  EXPECT_EQ(value(samples, sample("kvoffload_region_chunks", {{"engine_id", id}})), 8);
  EXPECT_EQ(value(samples, sample("kvoffload_region_chunks_used", {{"engine_id", id}})), 5);
  EXPECT_EQ(value(samples, sample("kvoffload_region_chunks_pinned", {{"engine_id", id}})), 2);
  EXPECT_EQ(value(samples, sample("kvoffload_region_chunks_write_pending", {{"engine_id", id}})),
            0);
  EXPECT_EQ(value(samples, sample("kvoffload_region_attached_processes", {{"engine_id", id}})), 1);
  EXPECT_EQ(value(samples, sample("kvoffload_scheduler_attached", {{"engine_id", id}})), 1);
  EXPECT_EQ(value(samples, sample("kvoffload_lookup_keys_total",
                                  {{"engine_id", id}, {"tier", "region"}, {"result", "miss"}})),
            5);
  EXPECT_EQ(value(samples, sample("kvoffload_stores_completed_total", {{"engine_id", id}})), 5);
  EXPECT_EQ(value(samples, sample("kvoffload_tier_offloaded_total",
                                  {{"engine_id", id}, {"tier", tier_name}})),
            5);
  EXPECT_EQ(value(samples, sample("kvoffload_lookup_keys_total",
                                  {{"engine_id", id}, {"tier", tier_name}, {"result", "miss"}})),
            5);
  EXPECT_EQ(value(samples, sample("kvoffload_bringup_state",
                                  {{"engine_id", id}, {"rank", "1"}, {"state", "pending"}})),
            1);
  EXPECT_EQ(value(samples, sample("kvoffload_transfer_bytes_total",
                                  {{"engine_id", id}, {"rank", "0"}, {"direction", "store"}})),
            0);
  // The idle region: rank 0 brought up, no scheduler.
  EXPECT_EQ(value(samples, sample("kvoffload_scheduler_attached", {{"engine_id", "idle"}})), 0);
  EXPECT_EQ(value(samples, sample("kvoffload_bringup_state",
                                  {{"engine_id", "idle"}, {"rank", "0"}, {"state", "ready"}})),
            1);
  EXPECT_EQ(value(samples,
                  sample("kvoffload_bringup_ready_chunks", {{"engine_id", "idle"}, {"rank", "0"}})),
            4);
  // The FIFO is listed with its problem, and nothing else about it.
  bool fifo = false;
  for (const auto& [k, v] : samples) {
    if (k.rfind("kvoffload_region_info{engine_id=fifo,", 0) == 0) {
      fifo = true;
      EXPECT_NE(k.find("problem=a FIFO, not a region file"), std::string::npos) << k;
    }
  }
  EXPECT_TRUE(fifo);
  EXPECT_EQ(samples.count(sample("kvoffload_region_size_bytes", {{"engine_id", "fifo"}})), 0U);

  const httplib::Result root = exporter.get("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->status, 200);
  EXPECT_NE(root->body.find("/metrics"), std::string::npos);
  const httplib::Result missing = exporter.get("/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  holder->signal(SIGTERM);
  EXPECT_EQ(holder->wait(), 0) << holder->err();
}

// A real `kvoffload run` (scheduler, 2 rank processes, a file tier), scraped while it runs and
// once it has finished: the final scrape equals the run's own JSON report. The test holds the
// region's liveness lock as one more attached process would, so the file (and its page) outlive
// the run; the run then reports, truthfully, that the region was not removed.
TEST(Exporter, ScrapesARunningEngineAndAgreesWithItsReport) {
  TempDir shm;
  TempDir work;
  TempDir tier("/tmp");
  const std::string id = unique_id("run");
  const Exporter exporter(shm.path(), work.path());
  auto run = spawn({"run",
                    "--shm-dir",
                    shm.path().string(),
                    "--engine-id",
                    id,
                    "--backend",
                    "host",
                    "--world-size",
                    "2",
                    "--layers",
                    "2",
                    "--block-bytes",
                    "4K",
                    "--blocks-per-chunk",
                    "2",
                    "--gpu-blocks",
                    "64",
                    "--host-pool",
                    "256K",
                    "--prefixes",
                    "6",
                    "--prefix-chunks",
                    "4",
                    "--unique-chunks",
                    "1",
                    "--duration",
                    "3",
                    "--bringup",
                    "blocking",
                    "--file-tier",
                    (tier.path() / "t").string(),
                    "--json"},
                   work.path());
  const fs::path region = shm.path() / ("kvoffload_" + id + ".region");
  int keeper = -1;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (keeper < 0 && Clock::now() < deadline) {
    keeper = ::open(region.c_str(), O_RDONLY | O_CLOEXEC);
    if (keeper < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(keeper, 0) << "the run's region never appeared: " << run->err();
  ASSERT_EQ(::flock(keeper, LOCK_SH), 0);

  // While it runs: the scheduler and both ranks publish, counters only grow.
  double last_lookups = -1;
  int live_scrapes = 0;
  const std::map<std::string, std::string> e{{"engine_id", id}};
  const std::string lookups = sample("kvoffload_lookup_keys_total",
                                     {{"engine_id", id}, {"tier", "region"}, {"result", "miss"}});
  while (!run->poll()) {
    const httplib::Result res = exporter.get("/metrics");
    ASSERT_TRUE(res);
    const auto s = parse_exposition(res->body, work.path());
    if (s.count(lookups) != 0 && value(s, sample("kvoffload_scheduler_attached", e)) == 1 &&
        value(s, sample("kvoffload_rank_engine_attached", {{"engine_id", id}, {"rank", "1"}})) ==
            1) {
      EXPECT_GE(s.at(lookups), last_lookups);
      last_lookups = s.at(lookups);
      ++live_scrapes;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_GE(live_scrapes, 1) << "no scrape saw the run at work";

  const json report = json::parse(run->out());
  EXPECT_FALSE(report["region_removed"].get<bool>()) << "the test holds the region";
  EXPECT_TRUE(report["all_verified"].get<bool>()) << run->err();
  const httplib::Result res = exporter.get("/metrics");
  ASSERT_TRUE(res);
  const auto s = parse_exposition(res->body, work.path());
  EXPECT_EQ(value(s, sample("kvoffload_scheduler_attached", e)), 0) << "the scheduler has exited";
  EXPECT_EQ(value(s, sample("kvoffload_region_chunks", e)), report["chunks"].get<double>());
  EXPECT_EQ(value(s, sample("kvoffload_evictions_total", e)), report["evictions"].get<double>());
  // The run counts the requests whose prepare_store found no room; the Manager counts those same
  // calls and also the promotions from the file tier that found no room (TieredStore::promote
  // asks the Manager for slots too), which the run does not count per request.
  EXPECT_GE(value(s, sample("kvoffload_cannot_store_total", e)),
            report["cannot_store"].get<double>());
  double looked_up = 0;
  for (const char* result : {"hit", "pending", "miss"}) {
    looked_up += value(s, sample("kvoffload_lookup_keys_total",
                                 {{"engine_id", id}, {"tier", "region"}, {"result", result}}));
  }
  EXPECT_EQ(looked_up, report["chunks_looked_up"].get<double>());
  EXPECT_EQ(
      value(s, sample("kvoffload_tier_promoted_total", {{"engine_id", id}, {"tier", "file"}})),
      report["promoted"].get<double>());
  EXPECT_EQ(
      value(s, sample("kvoffload_tier_promoted_total", {{"engine_id", id}, {"tier", "file"}})),
      report["promoted_from"]["file"].get<double>());
  EXPECT_EQ(
      value(s, sample("kvoffload_tier_offloaded_total", {{"engine_id", id}, {"tier", "file"}})),
      report["tier_offloads"].get<double>());
  double store_bytes = 0;
  double load_bytes = 0;
  double failed = 0;
  for (const char* rank : {"0", "1"}) {
    const std::map<std::string, std::string> r{{"engine_id", id}, {"rank", rank}};
    EXPECT_EQ(value(s, sample("kvoffload_rank_engine_attached", r)), 0) << "rank " << rank;
    auto with = [&](const char* direction) {
      auto l = r;
      l["direction"] = direction;
      return l;
    };
    store_bytes += value(s, sample("kvoffload_transfer_bytes_total", with("store")));
    load_bytes += value(s, sample("kvoffload_transfer_bytes_total", with("load")));
    failed += value(s, sample("kvoffload_transfer_jobs_failed_total", with("store"))) +
              value(s, sample("kvoffload_transfer_jobs_failed_total", with("load")));
    EXPECT_EQ(value(s, sample("kvoffload_transfer_jobs_in_flight", with("store"))), 0);
    EXPECT_GT(value(s, sample("kvoffload_transfer_copy_seconds_total", with("store"))), 0);
    EXPECT_EQ(value(s, sample("kvoffload_bringup_state",
                              [&] {
                                auto l = r;
                                l["state"] = "stopped";
                                return l;
                              }())),
              1)
        << "rank " << rank << " detached";
  }
  EXPECT_EQ(store_bytes, report["store_bytes"].get<double>());
  EXPECT_EQ(load_bytes, report["load_bytes"].get<double>());
  EXPECT_EQ(failed, report["failed_jobs"].get<double>());
  EXPECT_GT(report["load_bytes"].get<double>(), 0);

  ::close(keeper);  // the region is stale now: clean removes it
  auto clean = spawn({"region", "clean", "--shm-dir", shm.path().string()}, work.path());
  EXPECT_EQ(clean->wait(), 0) << clean->err();
  EXPECT_FALSE(fs::exists(region));
}

}  // namespace
