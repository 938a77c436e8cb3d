// `kvoffload exporter --listen ADDR`: the Prometheus text format for every region on the node, as
// node_exporter or dcgm-exporter serve theirs: one exporter per node beside the engines, no HTTP
// server inside any engine. Each scrape lists the shm dir and copies every region's live
// statistics page through a read-only mapping (no lock, no role; Note [Live stats]).
//
// GET /metrics answers the exposition (prometheus.hpp); GET / a short page pointing there.
// SIGINT, SIGTERM and SIGHUP stop it (exit 0). No client can stall it (Note [Exporter
// connections] in monitor/connection_reaper.hpp); an address beyond loopback is warned about.
#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include <kvoffload/error.hpp>
#include <kvoffload/live_stats.hpp>
#include <kvoffload/node_pool.hpp>

#include "cli.hpp"
#include "monitor/connection_reaper.hpp"
#include "monitor/listen_address.hpp"
#include "monitor/prometheus.hpp"
#include "util/log.hpp"

namespace kvoffload::cli {
namespace {

// getaddrinfo of the address; throws kInvalidArgument for a host that does not resolve.
struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list != nullptr) ::freeaddrinfo(list);
  }
};

struct ExporterOptions {
  std::string listen;
  std::string shm_dir;
  double request_timeout = 10;  // seconds a connection may stay open (Note [Exporter connections])
  bool json = false;
};

// Whether every address `info` resolved to is a loopback one (127.0.0.0/8, ::1): then only this
// machine can scrape. "0.0.0.0" (and ":PORT"), "::" and an interface's address are not.
bool loopback_only(const AddrInfo& info) {
  bool any = false;
  for (const addrinfo* p = info.list; p != nullptr; p = p->ai_next) {
    any = true;
    if (p->ai_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(p->ai_addr);
      if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) return false;
    } else if (p->ai_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(p->ai_addr);
      if (!IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) return false;
    } else {
      return false;
    }
  }
  return any;
}

void resolve(const ListenAddress& a, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = a.ipv6 ? AF_INET6 : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string port = std::to_string(a.port);
  const int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &out.list);
  if (rc != 0) {
    throw_invalid("--listen: cannot resolve the host '" + a.host + "' of '" + a.to_string() +
                  "': " + ::gai_strerror(rc));
  }
}

// Why binding failed, by trying it once more with a plain socket (cpp-httplib reports only
// "failed").
std::string bind_failure(const AddrInfo& info) {
  int err = 0;
  for (const addrinfo* p = info.list; p != nullptr; p = p->ai_next) {
    const int fd = ::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int yes = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    const int rc = ::bind(fd, p->ai_addr, p->ai_addrlen);
    err = rc == 0 ? 0 : errno;
    if (rc == 0 && ::listen(fd, 1) != 0) err = errno;
    ::close(fd);
    if (err != 0) break;
  }
  if (err == EADDRINUSE) return "the port is in use (another exporter or program listens there)";
  if (err == EACCES) return "permission denied (ports below 1024 need privileges)";
  if (err == EADDRNOTAVAIL) return "the address is not one of this machine's";
  return err != 0 ? errno_name(err) : "the HTTP library could not listen there";
}

std::string url_host(const ListenAddress& a) {
  if (a.host == "0.0.0.0") return "127.0.0.1";
  if (a.ipv6) return a.host == "::" ? "[::1]" : "[" + a.host + "]";
  return a.host;
}

int run_exporter(const ExporterOptions& o) {
  const ListenAddress address = parse_listen_address(o.listen);
  const std::filesystem::path shm_dir =
      o.shm_dir.empty() ? default_shm_dir() : std::filesystem::path(o.shm_dir);
  (void)snapshot_engines(shm_dir);  // a missing or unreadable shm dir fails now, not per scrape
  AddrInfo info;
  resolve(address, info);

  httplib::Server server;
  // Note [Exporter connections]: threads enough that idle clients do not starve the scrapes,
  // and each read, write and keep-alive wait bounded.
  server.new_task_queue = [] { return new httplib::ThreadPool(kExporterThreads); };
  server.set_read_timeout(std::chrono::seconds(2));
  server.set_write_timeout(std::chrono::seconds(2));
  server.set_keep_alive_timeout(2);
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which would let a second
  // exporter bind the same port and share the scrapes without an error.
  server.set_socket_options([](socket_t fd) {
    const int yes = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server.Get("/metrics", [shm_dir](const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(prometheus_text(snapshot_engines(shm_dir), pool::observe_pools(shm_dir)),
                      kPrometheusContentType);
    } catch (const std::exception& e) {
      log().warn("exporter: scrape failed: {}", e.what());
      res.status = 500;
      res.set_content(std::string("kvoffload exporter: ") + e.what() + "\n", "text/plain");
    }
  });
  server.Get("/", [shm_dir](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "<html><head><title>kvoffload exporter</title></head><body><h1>kvoffload "
        "exporter</h1><p>Regions in " +
            shm_dir.string() + ": <a href=\"/metrics\">/metrics</a></p></body></html>\n",
        "text/html; charset=utf-8");
  });

  // The signals are taken by one thread with sigwait; blocked here before any server thread
  // exists, so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (const int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop_signals, s);
  if (const int rc = ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); rc != 0) {
    throw_system_error("pthread_sigmask", rc, "(blocking SIGINT/SIGTERM/SIGHUP in the exporter)");
  }

  int port = address.port;
  if (port == 0) {
    port = server.bind_to_any_port(address.host);
  } else if (!server.bind_to_port(address.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    throw Error(ErrorCode::kSystem,
                "exporter: cannot listen on " + address.to_string() + ": " + bind_failure(info));
  }
  ListenAddress bound = address;
  bound.port = static_cast<std::uint16_t>(port);
  const bool local_only = loopback_only(info);
  if (!local_only) {
    log().warn(
        "exporter: listening on {}, beyond loopback: anyone who can reach this machine on that "
        "address can read the metrics (engine ids, occupancy, traffic). Use --listen "
        "127.0.0.1:{} unless a Prometheus on another machine scrapes it, and then firewall the "
        "port to that server",
        bound.to_string(), port);
  }
  if (!raise_listen_backlog(bound.port)) {
    log().warn(
        "exporter: could not raise the listen backlog of port {}; a burst of "
        "connections may delay scrapes",
        port);
  }
  ConnectionReaper reaper(
      bound.port, std::chrono::milliseconds(static_cast<std::int64_t>(o.request_timeout * 1000)));
  const std::string url = "http://" + url_host(bound) + ":" + std::to_string(port) + "/metrics";
  emit(o.json,
       {{"listen", bound.to_string()},
        {"port", port},
        {"url", url},
        {"shm_dir", shm_dir.string()},
        {"loopback_only", local_only}},
       "kvoffload exporter: serving the regions in " + shm_dir.string() + " on " +
           bound.to_string() + " (" + url + "); Ctrl-C stops it");

  std::atomic<bool> stopped_by_signal{false};
  std::atomic<bool> listen_ended{false};
  std::thread waiter([&] {
    int signo = 0;
    // After listen_ended the signal is the main thread's wake-up call, not a stop request.
    if (::sigwait(&stop_signals, &signo) == 0 && signo != 0 && !listen_ended.load()) {
      stopped_by_signal.store(true);
      log().info("exporter: signal {}; stopping", signo);
    }
    // A signal that comes before listen_after_bind() has started finds the server not running
    // yet, and stop() would do nothing: the server would then listen for ever. Wait for it to
    // run (or to have ended) first.
    while (!server.is_running() && !listen_ended.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    server.stop();
    reaper.close_all();  // the pool's threads wait on their connections: end those now
  });
  const bool served = server.listen_after_bind();
  listen_ended.store(true);
  // Wakes the signal thread's sigwait (SIGHUP is one of the signals it waits for; it only
  // returns, nothing is terminated).
  if (!stopped_by_signal.load()) (void)::pthread_kill(waiter.native_handle(), SIGHUP);
  waiter.join();
  if (!served && !stopped_by_signal.load()) {
    throw Error(ErrorCode::kSystem, "exporter: serving on " + bound.to_string() + " failed");
  }
  return kExitOk;
}

const CommandRegistrar kRegisterExporter("exporter", [](CLI::App& top) {
  auto* app = top.add_subcommand(
      "exporter",
      "Serve the Prometheus text format for every region on this node (one exporter per node)");
  auto o = std::make_shared<ExporterOptions>();
  app->add_option("--listen", o->listen,
                  "Address to serve on: HOST:PORT, :PORT (every IPv4 interface) or [IPv6]:PORT; "
                  "PORT 0 picks a free port (printed)")
      ->required()
      ->type_name("ADDR");
  app->add_option("--shm-dir", o->shm_dir,
                  "Directory of the region files (default $KVOFFLOAD_SHM_DIR, else /dev/shm)")
      ->type_name("DIR");
  app->add_option("--request-timeout", o->request_timeout,
                  "Seconds a client connection may stay open to send its request and read the "
                  "answer; a slower one is closed (default 10, Prometheus' scrape timeout)")
      ->check(real_range(0.1, 3600.0, "seconds"));
  app->add_flag("--json", o->json,
                "Print one JSON object (listen, port, url, shm_dir, loopback_only) once listening");
  return Command{app, [o] { return run_exporter(*o); }};
});

}  // namespace
}  // namespace kvoffload::cli
