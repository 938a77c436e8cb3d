// Node pools watched from outside (docs/DESIGN.md §6.6, Note [Pool observer]): the real
// `kvoffload` binary's `region list --json`, `top --json` and exporter /metrics show a pool that
// child processes attached, with each tenant's engine id, PID, occupancy, pins, hits and
// cross-engine hits; a pool whose tenants were all killed is listed as stale and `region clean`
// removes it. Every test uses its own shm dir.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef KVOFFLOAD_TEST_EXPORTER
#include <httplib.h>
#endif

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "monitor_test_util.hpp"
#include "pool_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload::pool {
namespace {

using json = nlohmann::json;
using kvoffload::test::spawn;
using kvoffload::test::TempDir;

// A tenant in a child process: attaches as `id`, stores keys [store_from, store_from + n) with
// their bytes, then looks up (and pins, keeping the pins) keys [0, lookup_n); reports ready
// through a pipe and holds until killed.
struct Tenant {
  pid_t pid = -1;
  Tenant(const std::filesystem::path& dir, const std::string& id, std::uint64_t store_n,
         std::uint64_t lookup_n) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      char status = 'x';
      try {
        auto p = NodePool::attach(test::small_options(dir, id));
        if (store_n > 0 && test::store(p, test::keys(0, store_n)) != store_n) throw 1;
        if (lookup_n > 0 && p.lookup(test::keys(0, lookup_n), true).hits != lookup_n) throw 2;
        status = 'r';
        (void)::write(fds[1], &status, 1);
        for (;;) ::pause();
      } catch (...) {
      }
      (void)::write(fds[1], &status, 1);
      ::_exit(1);
    }
    ::close(fds[1]);
    char status = 0;
    const ssize_t got = ::read(fds[0], &status, 1);
    ::close(fds[0]);
    if (got != 1 || status != 'r') ADD_FAILURE() << "tenant " << id << " did not get ready";
  }
  void kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int st = 0;
    (void)::waitpid(pid, &st, 0);
    pid = -1;
  }
  ~Tenant() { kill(); }
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;
};

json run_json(const std::vector<std::string>& args, const std::filesystem::path& work) {
  auto p = spawn(args, work);
  EXPECT_EQ(p->wait(), 0) << p->err();
  return json::parse(p->out());
}

const json* tenant_of(const json& pool, const std::string& id) {
  for (const json& t : pool["tenants"])
    if (t["engine_id"] == id) return &t;
  return nullptr;
}

// Both tenants as the scenario leaves them: a stored 4 chunks; b hit all 4 (cross-engine) and pins
// them.
void expect_two_tenants(const json& pool, pid_t a, pid_t b) {
  EXPECT_EQ(pool["name"], "testpool");
  EXPECT_FALSE(pool["stale"].get<bool>());
  EXPECT_EQ(pool["slot_count"], 8);
  EXPECT_EQ(pool["free"], 4);
  EXPECT_EQ(pool["ready"], 4);
  EXPECT_EQ(pool["writing"], 0);
  EXPECT_EQ(pool["pinned"], 4);
  ASSERT_EQ(pool["tenants"].size(), 2U) << pool.dump();
  const json* ta = tenant_of(pool, "engine-a");
  const json* tb = tenant_of(pool, "engine-b");
  ASSERT_NE(ta, nullptr) << pool.dump();
  ASSERT_NE(tb, nullptr) << pool.dump();
  EXPECT_EQ((*ta)["pid"], a);
  EXPECT_EQ((*tb)["pid"], b);
  EXPECT_TRUE((*ta)["alive"].get<bool>());
  EXPECT_EQ((*ta)["occupancy"], 4);
  EXPECT_EQ((*ta)["hits"], 0);
  EXPECT_EQ((*tb)["occupancy"], 0);
  EXPECT_EQ((*tb)["pinned"], 4);
  EXPECT_EQ((*tb)["pins"], 4);
  EXPECT_EQ((*tb)["hits"], 4);
  EXPECT_EQ((*tb)["cross_engine_hits"], 4);
}

TEST(PoolMonitor, RegionListAndTopShowEachTenantOfAPoolAndCleanRemovesItOnceStale) {
  const TempDir shm;
  const TempDir work;
  Tenant a(shm.path(), "engine-a", 4, 0);
  Tenant b(shm.path(), "engine-b", 0, 4);
  const std::string dir = shm.path().string();

  const json list = run_json({"region", "list", "--shm-dir", dir, "--json"}, work.path());
  ASSERT_EQ(list["pools"].size(), 1U) << list.dump();
  expect_two_tenants(list["pools"][0], a.pid, b.pid);
  const json top = run_json({"top", "--shm-dir", dir, "--json"}, work.path());
  ASSERT_EQ(top["pools"].size(), 1U) << top.dump();
  expect_two_tenants(top["pools"][0], a.pid, b.pid);

  auto text = spawn({"region", "list", "--shm-dir", dir}, work.path());
  ASSERT_EQ(text->wait(), 0) << text->err();
  EXPECT_NE(text->out().find("pool testpool  in use  2 tenants, 4 of 8 slots free, 4 ready"),
            std::string::npos)
      << text->out();
  EXPECT_NE(text->out().find("tenant engine-b  pid " + std::to_string(b.pid) +
                             "  occupancy 0, 4 pinned (4 pins); hits 4 of 4 keys, 4 cross-engine"),
            std::string::npos)
      << text->out();

  // In use: clean keeps it.
  const std::filesystem::path file = pool_path(shm.path(), "testpool");
  json clean = run_json({"region", "clean", "--shm-dir", dir, "--json"}, work.path());
  EXPECT_EQ(clean["kept"], json::array({file.string()})) << clean.dump();
  EXPECT_TRUE(std::filesystem::exists(file));

  // Every tenant killed: the file stays, listed as stale with dead tenants; clean removes it.
  a.kill();
  b.kill();
  ASSERT_TRUE(std::filesystem::exists(file));
  const json stale = run_json({"region", "list", "--shm-dir", dir, "--json"}, work.path());
  ASSERT_EQ(stale["pools"].size(), 1U);
  EXPECT_TRUE(stale["pools"][0]["stale"].get<bool>()) << stale.dump();
  for (const json& t : stale["pools"][0]["tenants"]) EXPECT_FALSE(t["alive"].get<bool>());
  clean = run_json({"region", "clean", "--shm-dir", dir, "--json"}, work.path());
  EXPECT_EQ(clean["removed"], json::array({file.string()})) << clean.dump();
  EXPECT_FALSE(std::filesystem::exists(file));
  const json after = run_json({"region", "list", "--shm-dir", dir, "--json"}, work.path());
  EXPECT_TRUE(after["pools"].empty()) << after.dump();
}

TEST(PoolMonitor, ANonPoolFileNamedLikeAPoolIsListedWithItsProblemAndNeverRemoved) {
  const TempDir shm;
  const TempDir work;
  const std::filesystem::path file = shm.path() / "kvoffload_junk.pool";
  std::ofstream(file) << "not a pool";
  std::filesystem::permissions(
      file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::string dir = shm.path().string();
  const json list = run_json({"region", "list", "--shm-dir", dir, "--json"}, work.path());
  ASSERT_EQ(list["pools"].size(), 1U);
  EXPECT_EQ(list["pools"][0]["name"], "junk");
  EXPECT_NE(list["pools"][0]["problem"].get<std::string>().find("not a kvoffload node pool"),
            std::string::npos)
      << list.dump();
  const json clean = run_json({"region", "clean", "--shm-dir", dir, "--json"}, work.path());
  EXPECT_EQ(clean["skipped"].size(), 1U) << clean.dump();
  EXPECT_TRUE(std::filesystem::exists(file));
}

#ifdef KVOFFLOAD_TEST_EXPORTER
TEST(PoolMonitor, TheExporterServesEachPoolAndTenantUnderTheKvoffloadNames) {
  const TempDir shm;
  const TempDir work;
  Tenant a(shm.path(), "engine-a", 4, 0);
  Tenant b(shm.path(), "engine-b", 0, 4);
  auto exporter =
      spawn({"exporter", "--listen", "127.0.0.1:0", "--shm-dir", shm.path().string(), "--json"},
            work.path(), true);
  const auto line = exporter->read_line();
  ASSERT_TRUE(line) << exporter->err();
  const int port = json::parse(*line)["port"].get<int>();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(30));
  const auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::string& m = res->body;
  const std::string pb = "pool=\"testpool\"";
  for (const std::string& want :
       {std::string("kvoffload_pools 1\n"), "kvoffload_pool_slots{" + pb + "} 8\n",
        "kvoffload_pool_slots_free{" + pb + "} 4\n", "kvoffload_pool_slots_ready{" + pb + "} 4\n",
        "kvoffload_pool_slots_pinned{" + pb + "} 4\n", "kvoffload_pool_stale{" + pb + "} 0\n",
        "kvoffload_pool_tenants{" + pb + "} 2\n",
        "kvoffload_pool_tenant_occupancy_slots{" + pb + ",engine_id=\"engine-a\"} 4\n",
        "kvoffload_pool_tenant_pinned_slots{" + pb + ",engine_id=\"engine-b\"} 4\n",
        "kvoffload_pool_tenant_pins_total{" + pb + ",engine_id=\"engine-b\"} 4\n",
        "kvoffload_pool_tenant_hits_total{" + pb + ",engine_id=\"engine-b\"} 4\n",
        "kvoffload_pool_tenant_cross_engine_hits_total{" + pb + ",engine_id=\"engine-b\"} 4\n",
        "kvoffload_pool_tenant_alive{" + pb + ",engine_id=\"engine-a\"} 1\n",
        "kvoffload_pool_tenant_pid{" + pb + ",engine_id=\"engine-a\"} " + std::to_string(a.pid) +
            "\n"}) {
    EXPECT_NE(m.find(want), std::string::npos) << want << " in\n" << m;
  }
  // Prometheus' own parser and naming rules accept the whole exposition.
  const std::filesystem::path in = work.path() / "metrics.txt";
  std::ofstream(in, std::ios::binary) << m;
  const std::string cmd = std::string(KVOFFLOAD_TEST_PYTHON) + " " + KVOFFLOAD_TEST_CLI_DIR +
                          "/check_prometheus.py " + in.string() + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << m;
  exporter->signal(SIGTERM);
  EXPECT_EQ(exporter->wait(), 0) << exporter->err();
}
#endif

}  // namespace
}  // namespace kvoffload::pool
