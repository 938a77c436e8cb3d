// `kvoffload exporter` scraped over HTTP: bad --listen values named, a port in use, every region of
// the node in Prometheus format (checked by the Prometheus client's own parser and naming rules:
// check_prometheus.py), and a real `kvoffload run` scraped while it goes and against its JSON.
//
// Watching engines from outside, as an operator does; every test uses its own shm dir, and the
// engines are forked children of the test that publish a scripted state (or a real `kvoffload
// run`). The suite: region_list_test.cpp, top_test.cpp, exporter_test.cpp; its kit:
// monitor_test_util.hpp.

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "monitor_test_util.hpp"
#include "test_env.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::read_text;
using kvoffload::test::ScriptedEngine;
using kvoffload::test::spawn;
using kvoffload::test::TempDir;
using kvoffload::test::unique_id;
using Clock = std::chrono::steady_clock;

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

  json listening;  // the line it printed once listening

  Exporter(const fs::path& shm, const fs::path& work, const std::string& listen = "127.0.0.1:0",
           const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"exporter",  "--listen",   listen,
                                  "--shm-dir", shm.string(), "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc = spawn(args, work, true);
    const auto line = proc->read_line();
    if (!line) {
      ADD_FAILURE() << "the exporter printed nothing: " << proc->err();
      return;
    }
    const json j = json::parse(*line);
    listening = j;
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
  for (const std::string bad :
       {"9477", "localhost:", "127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:http", "::1:9477",
        "[::1", "[::1]9477", "bad host:9477"}) {
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

// A loopback TCP connection to `port` that has sent nothing; -1 on failure.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the exporter has closed (or reset) connection `fd`, without waiting.
bool closed_by_server(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char c = 0;
  const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// A client that sends a request one byte at a time, forever, until stopped or closed.
class Dribbler {
 public:
  explicit Dribbler(int port) : fd_(connect_to(port)) {
    thread_ = std::thread([this] {
      const std::string request = "GET /metrics HTTP/1.1\r\nX-Slow: ";
      for (std::size_t i = 0; !stop_.load(); ++i) {
        const char c = i < request.size() ? request[i] : 'a';
        if (::send(fd_, &c, 1, MSG_NOSIGNAL) != 1) {
          closed_.store(true);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
    });
  }
  Dribbler(const Dribbler&) = delete;
  Dribbler& operator=(const Dribbler&) = delete;
  ~Dribbler() {
    stop_.store(true);
    thread_.join();
    ::close(fd_);
  }
  [[nodiscard]] bool connected() const { return fd_ >= 0; }
  // Closed by the server: its sends fail, or it reads EOF.
  [[nodiscard]] bool closed() const { return closed_.load() || closed_by_server(fd_); }

 private:
  int fd_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> closed_{false};
  std::thread thread_;
};

// Note [Exporter connections]: 24 idle connections (three times the 8 threads cpp-httplib serves
// on by default) do not hold back a scrape: it is answered while every one of them is still open
// (it used to be answered only after the first ones had timed out). A client that dribbles its
// request is closed once --request-timeout has passed, and the others are still served.
TEST(Exporter, IdleAndSlowClientsDoNotStallScrapes) {
  TempDir shm;
  TempDir work;
  const Exporter e(shm.path(), work.path(), "127.0.0.1:0", {"--request-timeout", "2"});
  ASSERT_GT(e.port, 0);
  std::vector<int> idle(24);
  for (int& fd : idle) fd = connect_to(e.port);
  for (const int fd : idle) ASSERT_GE(fd, 0);
  const auto scrape = e.get("/metrics");
  ASSERT_TRUE(scrape) << "no answer with idle clients connected";
  EXPECT_EQ(scrape->status, 200);
  int still_open = 0;
  for (const int fd : idle) still_open += closed_by_server(fd) ? 0 : 1;
  EXPECT_EQ(still_open, 24) << "the scrape waited for idle connections to time out";
  for (const int fd : idle) ::close(fd);

  const Dribbler slow(e.port);
  ASSERT_TRUE(slow.connected());
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!slow.closed() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(slow.closed()) << "a client dribbling its request is never closed";
  const auto after = e.get("/metrics");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

// SIGTERM with a client connected that keeps sending (so no read timeout ever fires, and the
// request timeout is an hour): the exporter still stops at once, exit 0.
TEST(Exporter, StopsPromptlyWithClientsConnected) {
  TempDir shm;
  TempDir work;
  Exporter e(shm.path(), work.path(), "127.0.0.1:0", {"--request-timeout", "3600"});
  ASSERT_GT(e.port, 0);
  const Dribbler slow(e.port);
  ASSERT_TRUE(slow.connected());
  const int idle = connect_to(e.port);
  ASSERT_GE(idle, 0);
  ASSERT_TRUE(e.get("/metrics")) << "serving";
  e.proc->signal(SIGTERM);
  EXPECT_EQ(e.proc->wait(std::chrono::seconds(30)), 0) << e.proc->err();
  ::close(idle);
}

// Listening beyond loopback is warned about on stderr; loopback is not.
TEST(Exporter, ListeningBeyondLoopbackIsWarnedAbout) {
  TempDir shm;
  TempDir work;
  {
    const Exporter local(shm.path(), work.path(), "127.0.0.1:0");
    EXPECT_TRUE(local.listening["loopback_only"].get<bool>());
    EXPECT_EQ(local.proc->err().find("beyond loopback"), std::string::npos) << local.proc->err();
  }
  for (const std::string every : {":0", "0.0.0.0:0"}) {
    const Exporter wide(shm.path(), work.path(), every);
    EXPECT_FALSE(wide.listening["loopback_only"].get<bool>()) << every;
    EXPECT_NE(wide.proc->err().find("beyond loopback: anyone who can reach this machine"),
              std::string::npos)
        << every << ": " << wide.proc->err();
  }
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
  // Each result and each store outcome has its own count in the scripted engine.
  for (const auto& [result, n] : {std::pair{"hit", 3}, {"pending", 1}, {"miss", 5}}) {
    EXPECT_EQ(value(samples, sample("kvoffload_lookup_keys_total",
                                    {{"engine_id", id}, {"tier", "region"}, {"result", result}})),
              n)
        << result;
  }
  EXPECT_EQ(value(samples, sample("kvoffload_stores_prepared_total", {{"engine_id", id}})), 7);
  EXPECT_EQ(value(samples, sample("kvoffload_stores_completed_total", {{"engine_id", id}})), 5);
  EXPECT_EQ(value(samples, sample("kvoffload_stores_failed_total", {{"engine_id", id}})), 2);
  // Pins: the 5 offloads' (released when the tier's writes finished) and the load's 2.
  EXPECT_EQ(value(samples, sample("kvoffload_loads_prepared_total", {{"engine_id", id}})), 7);
  EXPECT_EQ(value(samples, sample("kvoffload_loads_completed_total", {{"engine_id", id}})), 5);
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
