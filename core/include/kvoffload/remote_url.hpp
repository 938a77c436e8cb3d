#pragma once
// The address of a distributed store and how to reach it: nodes, database, credentials and TLS.
// The password is a Secret: no printed form of a RemoteUrl (to_string(), errors, logs, reports)
// ever contains it; redact_remote_url() gives the same guarantee for URL text that did not parse.
//
//   scheme://[user[:password]@]host:port[,host:port...][/db][?option=value[&option=value...]]
//
//   redis://              standalone Redis or Valkey (db 0..15, default 0; one host:port)
//   rediss://             the same over TLS
//   redis-cluster://      Redis Cluster seed nodes
//   rediss-cluster://     Redis Cluster over TLS (every node: the cluster's tls-port)
//   memcached://          memcached servers (credentials: SASL PLAIN over the binary protocol)
//
// Credentials: `user:password@` or `:password@` (Redis AUTH [user] password; an ACL user needs a
// password), percent-encoded where they hold ':', '@', '/', '?', '#', '&' or '%'. The password may
// instead come from where argv and the process list cannot see it:
//   password_file=PATH    the file's first line (a final newline is not part of it)
//   password_env=NAME     the environment variable NAME
// TLS options (rediss:// and rediss-cluster:// only; the server certificate is always verified,
// against its chain and against the node's host name or IP address):
//   tls_ca=PATH           a PEM file of the certificate authorities to trust (default: the
//                         system's trust store)
//   tls_cert=PATH, tls_key=PATH   a client certificate and its key (PEM; both or neither)
//   tls_server_name=NAME  the name to check the certificate against (and send as SNI) instead of
//                         each node's host
// Hosts are names, IPv4 addresses or [IPv6]; the port is required (1..65535).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <kvoffload/export.h>

namespace kvoffload {

enum class RemoteKind : std::uint8_t { kRedis = 0, kRedisCluster = 1, kMemcached = 2 };
KVOFFLOAD_API std::string_view to_string(RemoteKind kind) noexcept;  // "redis" | ...

struct KVOFFLOAD_API RemoteEndpoint {
  std::string host;
  std::uint16_t port = 0;
  [[nodiscard]] std::string to_string() const;  // host:port ([v6]:port)
  friend bool operator==(const RemoteEndpoint&, const RemoteEndpoint&) = default;
};

// A password. It has no printed form: reveal() is called only where the secret is sent to the
// server (AUTH, SASL), and its memory is wiped when it is destroyed or replaced.
class KVOFFLOAD_API Secret {
 public:
  Secret() = default;
  explicit Secret(std::string text) : text_(std::move(text)) {}
  Secret(const Secret& other) = default;
  Secret(Secret&& other) noexcept;
  Secret& operator=(const Secret& other);
  Secret& operator=(Secret&& other) noexcept;
  ~Secret();

  [[nodiscard]] bool empty() const noexcept { return text_.empty(); }
  [[nodiscard]] const std::string& reveal() const noexcept { return text_; }

 private:
  void wipe() noexcept;
  std::string text_;
};

struct KVOFFLOAD_API RemoteTls {
  bool enabled = false;     // rediss:// or rediss-cluster://
  std::string ca_file;      // empty: the system's trust store
  std::string cert_file;    // client certificate (with key_file)
  std::string key_file;     // client key
  std::string server_name;  // empty: each node's host
};

struct KVOFFLOAD_API RemoteUrl {
  RemoteKind kind = RemoteKind::kRedis;
  std::vector<RemoteEndpoint> nodes;
  unsigned db = 0;
  std::string user;  // empty: Redis's default user (AUTH password); memcached needs one for SASL
  Secret password;   // empty: no authentication
  enum class SecretFrom : std::uint8_t { kNone, kUrl, kFile, kEnv };
  SecretFrom password_from = SecretFrom::kNone;
  std::string password_origin;  // kFile: the path; kEnv: the variable's name
  RemoteTls tls;

  // Throws Error(kInvalidArgument) naming what is wrong (never the password): an unknown scheme
  // or option, a missing host or port, a port out of range, a bad db, a db on a cluster or
  // memcached URL, an empty node, TLS options without TLS, a password given twice, an unreadable
  // password file, a missing environment variable.
  static RemoteUrl parse(std::string_view text);
  // The URL with the password shown as "***" (the user, the options and the hosts as given).
  [[nodiscard]] std::string to_string() const;
  [[nodiscard]] bool authenticates() const noexcept { return !password.empty(); }
  // Where the password came from, for messages: "the URL", "password_file PATH",
  // "password_env NAME"; empty when there is none.
  [[nodiscard]] std::string password_source() const;
};

// `text` with any password between "://" and the last '@' replaced by "***": safe to print for
// a URL that failed to parse, whatever it holds.
KVOFFLOAD_API std::string redact_remote_url(std::string_view text);

}  // namespace kvoffload
