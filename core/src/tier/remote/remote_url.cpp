// RemoteUrl: parsing (schemes, credentials, options, where the password comes from), the printed
// form and redaction (remote_url.hpp). No network here.
//
// Every message about a URL shows redact_remote_url() of the text, never the text itself, and
// the parts a message quotes (a node, a db, an option's name or file) come from after the
// credentials, so no error of a URL that holds a password can repeat it, parsed or not.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_url.hpp>

namespace kvoffload {

// ---- Secret -------------------------------------------------------------------------------------

Secret::Secret(Secret&& other) noexcept : text_(std::move(other.text_)) {
  other.wipe();
}

Secret& Secret::operator=(const Secret& other) {
  if (this != &other) {
    wipe();
    text_ = other.text_;
  }
  return *this;
}

Secret& Secret::operator=(Secret&& other) noexcept {
  if (this != &other) {
    wipe();
    text_ = std::move(other.text_);
    other.wipe();
  }
  return *this;
}

Secret::~Secret() {
  wipe();
}

// explicit_bzero: a plain memset before the string dies could be optimized away.
void Secret::wipe() noexcept {
  if (!text_.empty()) ::explicit_bzero(text_.data(), text_.size());
  text_.clear();
}

// ---- names --------------------------------------------------------------------------------------

std::string_view to_string(RemoteKind kind) noexcept {
  switch (kind) {
    case RemoteKind::kRedis:
      return "redis";
    case RemoteKind::kRedisCluster:
      return "redis-cluster";
    case RemoteKind::kMemcached:
      return "memcached";
  }
  return "unknown";
}

std::string RemoteEndpoint::to_string() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

namespace {

// Options whose values are names of files and variables, never secrets.
bool option_is_public(std::string_view name) {
  return name == "password_file" || name == "password_env" || name == "tls_ca" ||
         name == "tls_cert" || name == "tls_key" || name == "tls_server_name";
}

// The query with the value of every option not known to be public shown as "***" (a password
// typed into an option that does not exist must not be echoed by the error that refuses it).
std::string redact_query(std::string_view query) {
  std::string out;
  std::size_t start = 0;
  while (start <= query.size()) {
    const auto amp = query.find('&', start);
    const std::string_view item =
        query.substr(start, amp == std::string_view::npos ? std::string_view::npos : amp - start);
    const auto eq = item.find('=');
    if (eq != std::string_view::npos && !option_is_public(item.substr(0, eq))) {
      out += std::string(item.substr(0, eq)) + "=***";
    } else {
      out += item;
    }
    if (amp == std::string_view::npos) break;
    out += '&';
    start = amp + 1;
  }
  return out;
}

}  // namespace

std::string redact_remote_url(std::string_view text) {
  const auto sep = text.find("://");
  std::size_t start = sep == std::string_view::npos ? 0 : sep + 3;
  std::string out(text.substr(0, start));
  const auto at = text.rfind('@');
  if (at != std::string_view::npos && at >= start) {
    const std::string_view userinfo = text.substr(start, at - start);
    const auto colon = userinfo.find(':');
    // Without a ':' the whole userinfo may be a password typed without its user.
    out +=
        colon == std::string_view::npos ? "***" : std::string(userinfo.substr(0, colon)) + ":***";
    start = at;
  } else if (at != std::string_view::npos) {  // an '@' before any "://"
    out = "***";
    start = at;
  }
  const auto q = text.find('?', start);
  out += text.substr(start, q == std::string_view::npos ? std::string_view::npos : q - start);
  if (q != std::string_view::npos) out += "?" + redact_query(text.substr(q + 1));
  return out;
}

namespace {

constexpr std::string_view kForms =
    "expected redis://, rediss://, redis-cluster://, rediss-cluster:// or memcached://, then "
    "[user:password@]host:port[,host:port...][/db][?option=value&...] (see remote_url.hpp)";
constexpr std::string_view kOptions =
    "password_file, password_env, tls_ca, tls_cert, tls_key, tls_server_name";

[[noreturn]] void bad_url(std::string_view text, const std::string& what) {
  throw_invalid("remote tier URL '" + redact_remote_url(text) + "': " + what + "; " +
                std::string(kForms));
}

RemoteEndpoint parse_node(std::string_view url, std::string_view node) {
  if (node.empty()) bad_url(url, "an empty node (two commas, or a trailing comma)");
  RemoteEndpoint ep;
  std::string_view port_text;
  if (node.front() == '[') {
    const auto close = node.find(']');
    if (close == std::string_view::npos)
      bad_url(url, "'" + std::string(node) + "' has no closing ']'");
    ep.host = std::string(node.substr(1, close - 1));
    const std::string_view rest = node.substr(close + 1);
    if (rest.empty()) bad_url(url, "node '" + std::string(node) + "' has no port");
    if (rest.front() != ':')
      bad_url(url, "node '" + std::string(node) + "': expected ':' after ']'");
    port_text = rest.substr(1);
  } else {
    const auto colon = node.rfind(':');
    if (colon == std::string_view::npos)
      bad_url(url, "node '" + std::string(node) + "' has no port");
    if (node.find(':') != colon) {
      bad_url(url, "node '" + std::string(node) + "': write an IPv6 host in brackets, [::1]:6379");
    }
    ep.host = std::string(node.substr(0, colon));
    port_text = node.substr(colon + 1);
  }
  if (ep.host.empty()) bad_url(url, "node '" + std::string(node) + "' has no host");
  for (const char c : ep.host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
    if (!ok) bad_url(url, "host '" + ep.host + "' contains '" + std::string(1, c) + "'");
  }
  if (port_text.empty()) bad_url(url, "node '" + std::string(node) + "' has no port");
  unsigned long port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || end != port_text.data() + port_text.size()) {
    if (ec == std::errc::result_out_of_range) {
      bad_url(url, "port " + std::string(port_text) + " is out of range; allowed 1..65535");
    }
    bad_url(url, "port '" + std::string(port_text) + "' is not a number");
  }
  if (port < 1 || port > 65535) {
    bad_url(url, "port " + std::string(port_text) + " is out of range; allowed 1..65535");
  }
  ep.port = static_cast<std::uint16_t>(port);
  return ep;
}

// %XX decoding. `what` names the part for the error, which never quotes the text (it may be a
// password).
std::string percent_decode(std::string_view url, std::string_view in, const char* what) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    unsigned v = 0;
    if (i + 2 >= in.size() ||
        std::from_chars(in.data() + i + 1, in.data() + i + 3, v, 16).ptr != in.data() + i + 3) {
      bad_url(url, std::string("the ") + what +
                       " holds a '%' not followed by two hex digits (write a literal '%' as %25)");
    }
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

// The first line of a password file, read whole (a secret is small: at most 64 KiB).
std::string read_password_file(std::string_view url, const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad_url(url, "password_file " + errno_text("open " + path, errno));
  std::string text;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::explicit_bzero(buf, sizeof buf);
      bad_url(url, "password_file " + errno_text("read " + path, err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > (64U << 10)) {
      ::close(fd);
      ::explicit_bzero(buf, sizeof buf);
      Secret wipe(std::move(text));
      bad_url(url, "password_file " + path + " is larger than 64 KiB; it must hold the password");
    }
  }
  ::close(fd);
  ::explicit_bzero(buf, sizeof buf);
  Secret whole(std::move(text));
  const std::string& all = whole.reveal();
  std::string line(all.begin(), std::find(all.begin(), all.end(), '\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty())
    bad_url(url, "password_file " + path + " is empty (its first line is the password)");
  return line;
}

struct Options {
  std::string password_file, password_env;
  bool has_file = false, has_env = false;
  RemoteTls tls;
};

void parse_options(std::string_view url, std::string_view query, Options& o) {
  if (query.find('@') != std::string_view::npos) {
    bad_url(url,
            "an '@' after '?': percent-encode it in option values (%40), and a '?' in a "
            "password (%3F)");
  }
  std::size_t start = 0;
  while (start <= query.size()) {
    const auto amp = query.find('&', start);
    const std::string_view item =
        query.substr(start, amp == std::string_view::npos ? std::string_view::npos : amp - start);
    start = amp == std::string_view::npos ? query.size() + 1 : amp + 1;
    if (item.empty()) bad_url(url, "an empty option (a stray '&' or '?')");
    const auto eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    // Only the name is quoted: a value typed into the wrong option may be a secret.
    if (eq == std::string_view::npos) {
      bad_url(url, "option '" + std::string(name) + "' has no value (write " + std::string(name) +
                       "=VALUE)");
    }
    const std::string value = percent_decode(url, item.substr(eq + 1), "option value");
    if (value.empty()) bad_url(url, "option '" + std::string(name) + "' has an empty value");
    auto set = [&](std::string& field, bool* flag = nullptr) {
      if (!field.empty() || (flag != nullptr && *flag))
        bad_url(url, "option '" + std::string(name) + "' is given twice");
      field = value;
      if (flag != nullptr) *flag = true;
    };
    if (name == "password_file") {
      set(o.password_file, &o.has_file);
    } else if (name == "password_env") {
      set(o.password_env, &o.has_env);
    } else if (name == "tls_ca") {
      set(o.tls.ca_file);
    } else if (name == "tls_cert") {
      set(o.tls.cert_file);
    } else if (name == "tls_key") {
      set(o.tls.key_file);
    } else if (name == "tls_server_name") {
      set(o.tls.server_name);
    } else {
      bad_url(url, "unknown option '" + std::string(name) + "'; allowed: " + std::string(kOptions));
    }
  }
}

void require_readable(std::string_view url, const char* option, const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0)
    bad_url(url, std::string(option) + " " + errno_text("access " + path, errno));
}

// The password of password_file= or password_env=, given once only (not also in the URL).
void take_password_option(std::string_view text, const Options& options, RemoteUrl& url) {
  if (!options.has_file && !options.has_env) return;
  if (url.password_from == RemoteUrl::SecretFrom::kUrl) {
    bad_url(text, std::string("the password is given twice: in the URL and in ") +
                      (options.has_file ? "password_file" : "password_env"));
  }
  if (options.has_file && options.has_env) {
    bad_url(text, "the password is given twice: password_file and password_env");
  }
  if (options.has_file) {
    url.password = Secret(read_password_file(text, options.password_file));
    url.password_from = RemoteUrl::SecretFrom::kFile;
    url.password_origin = options.password_file;
  } else {
    const char* value = std::getenv(options.password_env.c_str());
    if (value == nullptr) {
      bad_url(text,
              "password_env " + options.password_env + ": the environment variable is not set");
    }
    if (*value == '\0') {
      bad_url(text, "password_env " + options.password_env + ": the environment variable is empty");
    }
    url.password = Secret(value);
    url.password_from = RemoteUrl::SecretFrom::kEnv;
    url.password_origin = options.password_env;
  }
}

// The tls_ options, for a TLS scheme only, each file readable.
void take_tls_options(std::string_view text, std::string_view scheme, const RemoteTls& t,
                      RemoteUrl& url) {
  const bool tls_options =
      !t.ca_file.empty() || !t.cert_file.empty() || !t.key_file.empty() || !t.server_name.empty();
  if (tls_options && !url.tls.enabled) {
    bad_url(text, "the tls_ options apply to rediss:// and rediss-cluster:// only (scheme '" +
                      std::string(scheme) + "' has no TLS)");
  }
  if (t.cert_file.empty() != t.key_file.empty()) {
    bad_url(text, "tls_cert and tls_key go together (a client certificate and its key)");
  }
  if (!t.ca_file.empty()) require_readable(text, "tls_ca", t.ca_file);
  if (!t.cert_file.empty()) require_readable(text, "tls_cert", t.cert_file);
  if (!t.key_file.empty()) require_readable(text, "tls_key", t.key_file);
  const bool enabled = url.tls.enabled;
  url.tls = t;
  url.tls.enabled = enabled;
}

// The /db after the nodes (redis:// only): takes it off `rest`.
void take_db(std::string_view text, std::string_view& rest, RemoteUrl& url) {
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) return;
  const std::string_view db = rest.substr(slash + 1);
  rest = rest.substr(0, slash);
  if (url.kind != RemoteKind::kRedis) {
    bad_url(text, "a /db is only allowed on redis:// (clusters and memcached have no databases)");
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(db.data(), db.data() + db.size(), value);
  if (db.empty() || ec != std::errc{} || end != db.data() + db.size() || value > 15) {
    bad_url(text, "db '" + std::string(db) + "' is not a database number 0..15");
  }
  url.db = value;
}

}  // namespace

RemoteUrl RemoteUrl::parse(std::string_view text) {
  RemoteUrl url;
  const auto sep = text.find("://");
  if (sep == std::string_view::npos) bad_url(text, "no scheme (scheme://...)");
  const std::string_view scheme = text.substr(0, sep);
  if (scheme == "redis" || scheme == "rediss") {
    url.kind = RemoteKind::kRedis;
  } else if (scheme == "redis-cluster" || scheme == "rediss-cluster") {
    url.kind = RemoteKind::kRedisCluster;
  } else if (scheme == "memcached") {
    url.kind = RemoteKind::kMemcached;
  } else {
    bad_url(text, "unknown scheme '" + std::string(scheme) + "'");
  }
  url.tls.enabled = scheme == "rediss" || scheme == "rediss-cluster";
  std::string_view rest = text.substr(sep + 3);

  // The query starts at the first '?'; the credentials end at the last '@' before it (hosts,
  // ports and dbs hold no '@', so a '/' in a password is still a password).
  Options options;
  const auto q = rest.find('?');
  if (q != std::string_view::npos) {
    parse_options(text, rest.substr(q + 1), options);
    rest = rest.substr(0, q);
  }
  const auto at = rest.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (userinfo.empty()) bad_url(text, "nothing before '@' (write user:PASSWORD@ or :PASSWORD@)");
    const auto colon = userinfo.find(':');
    url.user = percent_decode(text, userinfo.substr(0, colon), "user name");
    if (colon != std::string_view::npos) {
      url.password = Secret(percent_decode(text, userinfo.substr(colon + 1), "password"));
      if (url.password.empty()) bad_url(text, "the password after ':' is empty");
      url.password_from = SecretFrom::kUrl;
    }
  }
  take_password_option(text, options, url);
  if (!url.user.empty() && url.password.empty()) {
    // Not quoted: a password typed without its ':' would be taken for the user.
    bad_url(text,
            "a user name without a password; write user:PASSWORD@, or give the password "
            "with password_file= or password_env=");
  }
  if (url.kind == RemoteKind::kMemcached && url.authenticates() && url.user.empty()) {
    bad_url(text, "memcached SASL needs a user name: memcached://user:PASSWORD@host:port");
  }

  take_tls_options(text, scheme, options.tls, url);

  take_db(text, rest, url);
  if (rest.empty()) bad_url(text, "no host:port");
  std::size_t start = 0;
  while (true) {
    const auto comma = rest.find(',', start);
    const std::string_view node = rest.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    url.nodes.push_back(parse_node(text, node));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (url.kind == RemoteKind::kRedis && url.nodes.size() != 1) {
    bad_url(text, "redis:// takes one host:port (use redis-cluster:// for a cluster)");
  }
  return url;
}

std::string RemoteUrl::password_source() const {
  switch (password_from) {
    case SecretFrom::kNone:
      return {};
    case SecretFrom::kUrl:
      return "the URL";
    case SecretFrom::kFile:
      return "password_file " + password_origin;
    case SecretFrom::kEnv:
      return "password_env " + password_origin;
  }
  return {};
}

std::string RemoteUrl::to_string() const {
  std::string s = kind == RemoteKind::kMemcached ? "memcached"
                  : kind == RemoteKind::kRedis   ? (tls.enabled ? "rediss" : "redis")
                                               : (tls.enabled ? "rediss-cluster" : "redis-cluster");
  s += "://";
  if (password_from == SecretFrom::kUrl) {
    s += user + ":***@";
  } else if (!user.empty()) {
    s += user + "@";
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (i > 0) s += ',';
    s += nodes[i].to_string();
  }
  if (kind == RemoteKind::kRedis && db != 0) s += "/" + std::to_string(db);
  char sep = '?';
  auto option = [&](const char* name, const std::string& value) {
    if (value.empty()) return;
    s += sep;
    s += name;
    s += '=';
    s += value;
    sep = '&';
  };
  if (password_from == SecretFrom::kFile) option("password_file", password_origin);
  if (password_from == SecretFrom::kEnv) option("password_env", password_origin);
  option("tls_ca", tls.ca_file);
  option("tls_cert", tls.cert_file);
  option("tls_key", tls.key_file);
  option("tls_server_name", tls.server_name);
  return s;
}

}  // namespace kvoffload
