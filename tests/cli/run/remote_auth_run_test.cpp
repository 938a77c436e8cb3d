// `kvoffload run --remote-tier` and `kvoffload remote check` against stores that want
// credentials, driven as a user runs them: a refusal says "authentication failed" (never
// "unreachable"), a run whose store refuses its requests fails, and the password never appears
// on any channel -- stdout, stderr with every log line (KVOFFLOAD_LOG_LEVEL=trace), the --json
// report or error, `region list`, `top`, the process list, and the exporter's /metrics and page
// while the run is live.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "remote_servers.hpp"
#include "skip.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvoffload::test::ChildProcess;
using kvoffload::test::ChildSpec;
using kvoffload::test::read_text;
using kvoffload::test::ServerProcess;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kSecret = "Hunter2-kvo-9Qx";

// One HTTP GET on loopback; the whole response (headers and body).
std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

class RemoteAuthRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT("redis-server", "redis-cli");
    std::string tmpl = (fs::path(::testing::TempDir()) / "kvoffload_auth_run_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    shm_ = dir_ / "shm";
    fs::create_directory(shm_);
  }
  void TearDown() override {
    children_.clear();
    fs::remove_all(dir_);
  }

  // `kvoffload <args>` with every log line on stderr; stdout and stderr to files named `tag`.
  ChildProcess& start(std::vector<std::string> args, const std::string& tag,
                      bool pipe_stdout = false) {
    ChildSpec spec;
    spec.args = std::move(args);
    if (!pipe_stdout) spec.out_file = dir_ / (tag + ".out");
    spec.pipe_stdout = pipe_stdout;
    spec.err_file = dir_ / (tag + ".err");
    spec.env["KVOFFLOAD_LOG_LEVEL"] = "trace";
    spec.own_process_group = true;
    tags_.push_back(tag);
    return *children_.emplace_back(std::make_unique<ChildProcess>(spec));
  }
  int exec(std::vector<std::string> args, const std::string& tag) {
    return start(std::move(args), tag).wait();
  }
  std::string out(const std::string& tag) const { return read_text(dir_ / (tag + ".out")); }
  std::string err(const std::string& tag) const { return read_text(dir_ / (tag + ".err")); }

  std::vector<std::string> run_args(const std::string& url, const std::string& engine,
                                    std::vector<std::string> more = {"--requests", "60",
                                                                     "--duration", "0"}) {
    std::vector<std::string> a = {
        "run",  "--shm-dir",          shm_.string(), "--engine-id",     engine, "--backend",
        "host", "--world-size",       "2",           "--layers",        "2",    "--block-bytes",
        "4K",   "--blocks-per-chunk", "2",           "--gpu-blocks",    "64",   "--host-pool",
        "256K", "--prefixes",         "4",           "--prefix-chunks", "4",    "--remote-tier",
        url,    "--bringup",          "blocking"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }

  // Every file a command wrote (and `extra` texts) holds no trace of the secret.
  void expect_no_secret(const std::vector<std::string>& extra = {}) const {
    for (const auto& tag : tags_) {
      for (const char* ext : {".out", ".err"}) {
        const fs::path p = dir_ / (tag + ext);
        if (!fs::exists(p)) continue;
        EXPECT_THAT(read_text(p), Not(HasSubstr(kSecret))) << p;
        EXPECT_THAT(read_text(p), Not(HasSubstr("Hunter2"))) << p;
      }
    }
    for (const auto& text : extra) EXPECT_THAT(text, Not(HasSubstr(kSecret)));
  }

  fs::path dir_, shm_;
  std::vector<std::string> tags_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

TEST_F(RemoteAuthRunTest, RemoteCheckSaysAuthenticationFailedNotUnreachable) {
  ServerProcess redis(ServerProcess::Kind::kRedis, {"--requirepass", kSecret});
  const std::string at = "127.0.0.1:" + std::to_string(redis.port());

  EXPECT_EQ(exec({"remote", "check", "redis://" + at}, "none"), 1);
  EXPECT_THAT(err("none"), HasSubstr("authentication failed"));
  EXPECT_THAT(err("none"), HasSubstr("NOAUTH"));
  EXPECT_THAT(out("none") + err("none"), Not(HasSubstr("unreachable")));
  EXPECT_THAT(out("none"), HasSubstr("authentication failed"));

  EXPECT_EQ(exec({"remote", "check", "redis://:wrong-" + std::string(kSecret) + "@" + at, "--json"},
                 "wrong"),
            1);
  const json j = json::parse(out("wrong"));
  EXPECT_EQ(j["error"]["code"], "permission") << j.dump();
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("WRONGPASS"));
  EXPECT_EQ(j["nodes"][0]["auth_failed"], true) << j.dump();
  EXPECT_EQ(j["url"], "redis://:***@" + at);

  EXPECT_EQ(
      exec({"remote", "check", "redis://:" + std::string(kSecret) + "@" + at, "--json"}, "right"),
      0)
      << err("right");
  EXPECT_EQ(json::parse(out("right"))["nodes"][0]["reachable"], true);

  // The password from a file: the same check without the secret in argv.
  const std::string file = (dir_ / "pw").string();
  std::ofstream(file) << kSecret << "\n";
  EXPECT_EQ(exec({"remote", "check", "redis://" + at + "?password_file=" + file}, "file"), 0)
      << err("file");

  // The issue's case: a URL that does not parse must not echo its password either.
  EXPECT_EQ(
      exec({"remote", "check", "redis://:" + std::string(kSecret) + "@::1:6379", "--json"}, "bad"),
      2);
  EXPECT_THAT(err("bad") + out("bad"), HasSubstr("IPv6 host in brackets"));
  EXPECT_EQ(
      exec(run_args("redis://:" + std::string(kSecret) + "@::1:6379", "engine-bad"), "badrun"), 2);
  // A usage error of the option parser quotes the words it refuses: redacted too.
  EXPECT_EQ(exec({"remote", "check", "redis://:" + std::string(kSecret) + "@" + at,
                  "redis://u:" + std::string(kSecret) + "@h:1"},
                 "usage"),
            2);
  EXPECT_THAT(err("usage"), HasSubstr("redis://u:***@h:1"));
  expect_no_secret();
}

TEST_F(RemoteAuthRunTest, RunWithoutThePasswordFailsSayingSo) {
  ServerProcess redis(ServerProcess::Kind::kRedis, {"--requirepass", kSecret});
  const std::string at = "127.0.0.1:" + std::to_string(redis.port());
  EXPECT_EQ(exec(run_args("redis://" + at, "engine-n", {"--json"}), "none"), 1);
  EXPECT_THAT(err("none"), HasSubstr("authentication failed"));
  EXPECT_THAT(err("none"), HasSubstr("NOAUTH"));
  const json j = json::parse(out("none"));
  EXPECT_EQ(j["error"]["code"], "permission") << j.dump();
  EXPECT_EQ(
      exec(run_args("redis://:Wr0ng-" + std::string(kSecret) + "@" + at, "engine-w"), "wrong"), 1);
  EXPECT_THAT(err("wrong"), HasSubstr("WRONGPASS"));
  EXPECT_TRUE(fs::is_empty(shm_)) << "a refused run leaves no region";
  expect_no_secret();
}

// An ACL user that may not SET: the tier opens (PING answers), and every put is refused. The run
// serves from the host pool, but ends non-zero with the store's verdict.
TEST_F(RemoteAuthRunTest, RunWhoseStoreRefusesEveryPutEndsNonZero) {
  ServerProcess redis(ServerProcess::Kind::kRedis,
                      {"--user", "default", "off", "--user", "ro", "on", std::string(">") + kSecret,
                       "~*", "+@all", "-set"});
  const std::string url =
      "redis://ro:" + std::string(kSecret) + "@127.0.0.1:" + std::to_string(redis.port());
  EXPECT_EQ(
      exec(run_args(url, "engine-ro", {"--requests", "60", "--duration", "0", "--json"}), "ro"), 1);
  const json j = json::parse(out("ro"));
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("refused the credentials"));
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("NOPERM"));
  EXPECT_GT(j["remote"]["auth_failures"].get<std::uint64_t>(), 0u) << j.dump();
  EXPECT_EQ(j["remote"]["url"], "redis://ro:***@127.0.0.1:" + std::to_string(redis.port()));
  EXPECT_THAT(err("ro"), HasSubstr("authentication failed"));
  expect_no_secret();
}

// Every channel while an authenticated run is live and after it: the run's own stdout, stderr
// (every log line), --json report, its argv in the process list; `region list` and `top --once`
// (text and JSON); the exporter's /metrics and page.
TEST_F(RemoteAuthRunTest, NoChannelEverShowsTheSecret) {
  ServerProcess redis(ServerProcess::Kind::kRedis, {"--requirepass", kSecret});
  redis.set_cli_args({"--pass", kSecret, "--no-auth-warning"});
  const std::string url =
      "redis://:" + std::string(kSecret) + "@127.0.0.1:" + std::to_string(redis.port());
  ChildProcess& job = start(
      run_args(url, "engine-live", {"--requests", "0", "--duration", "600", "--json"}), "live");
  // Live once it wrote through to the store.
  bool stored = false;
  for (int i = 0; i < 12000 && !stored && !job.poll(); ++i) {
    stored = redis.cli({"DBSIZE"}) != "0";
    if (!stored) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(stored) << err("live");
  // The process list: argv was scrubbed once parsed (15 '*' for the 15 characters of kSecret).
  const std::string cmdline = read_text("/proc/" + std::to_string(job.pid()) + "/cmdline");
  EXPECT_THAT(cmdline, HasSubstr("redis://:***************@127.0.0.1"));
  EXPECT_EQ(exec({"region", "list", "--shm-dir", shm_.string()}, "list"), 0) << err("list");
  EXPECT_THAT(out("list"), HasSubstr("engine-live"));
  EXPECT_EQ(exec({"region", "list", "--shm-dir", shm_.string(), "--json"}, "listjson"), 0);
  EXPECT_EQ(exec({"top", "--once", "--shm-dir", shm_.string()}, "top"), 0) << err("top");
  EXPECT_THAT(out("top"), HasSubstr("engine-live"));
  EXPECT_EQ(exec({"top", "--once", "--json", "--shm-dir", shm_.string()}, "topjson"), 0);
  ChildProcess& exporter =
      start({"exporter", "--listen", "127.0.0.1:0", "--shm-dir", shm_.string(), "--json"},
            "exporter", /*pipe_stdout=*/true);
  const auto line = exporter.read_line();
  ASSERT_TRUE(line.has_value()) << err("exporter");
  const int port = json::parse(*line)["port"].get<int>();
  const std::string metrics = http_get(port, "/metrics");
  const std::string page = http_get(port, "/");
  EXPECT_THAT(metrics, HasSubstr("kvoffload_"));
  exporter.signal_group(SIGTERM);
  (void)exporter.wait();
  job.signal_group(SIGINT);
  EXPECT_EQ(job.wait(), 130) << err("live");
  const json r = json::parse(out("live"));
  EXPECT_GT(r["remote"]["stored"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(r["remote"]["auth_failures"], 0);
  EXPECT_THAT(err("live"), HasSubstr(":***@127.0.0.1"));  // the tier's open line names the store
  expect_no_secret({metrics, page, *line, cmdline});
}

}  // namespace
