// RemoteUrl parsing, the geometry fingerprint and option validation (no network here).
#include <charconv>

#include <xxhash.h>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

#include "remote_value.hpp"

namespace kvoffload {

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

[[noreturn]] void bad_url(std::string_view text, const std::string& what) {
  throw_invalid("remote tier URL '" + std::string(text) + "': " + what +
                "; expected redis://host:port[/db], redis-cluster://host:port[,host:port...] or "
                "memcached://host:port[,host:port...]");
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

}  // namespace

RemoteUrl RemoteUrl::parse(std::string_view text) {
  RemoteUrl url;
  const auto sep = text.find("://");
  if (sep == std::string_view::npos) bad_url(text, "no scheme (scheme://...)");
  const std::string_view scheme = text.substr(0, sep);
  if (scheme == "redis") {
    url.kind = RemoteKind::kRedis;
  } else if (scheme == "redis-cluster") {
    url.kind = RemoteKind::kRedisCluster;
  } else if (scheme == "memcached") {
    url.kind = RemoteKind::kMemcached;
  } else {
    bad_url(text, "unknown scheme '" + std::string(scheme) + "'");
  }
  std::string_view rest = text.substr(sep + 3);
  const auto slash = rest.find('/');
  if (slash != std::string_view::npos) {
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

std::string RemoteUrl::to_string() const {
  std::string s = std::string(kvoffload::to_string(kind)) + "://";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (i > 0) s += ',';
    s += nodes[i].to_string();
  }
  if (kind == RemoteKind::kRedis && db != 0) s += "/" + std::to_string(db);
  return s;
}

std::string RemoteGeometry::describe() const {
  return "kvoffload-remote format=" + std::to_string(detail::kRemoteFormatVersion) +
         " slot_bytes=" + std::to_string(slot_bytes) + " world_size=" + std::to_string(world_size) +
         " replicated=" + (replicated ? "1" : "0") + " block_bytes=" + std::to_string(block_bytes) +
         " blocks_per_chunk=" + std::to_string(blocks_per_chunk) + " dtype=" + dtype +
         " layout=" + tensor_layout;
}

std::uint64_t RemoteGeometry::fingerprint() const {
  const std::string text = describe();
  return XXH3_64bits(text.data(), text.size());
}

std::uint64_t remote_value_bytes(std::uint64_t slot_bytes) noexcept {
  return slot_bytes + detail::kRemoteHeaderBytes;
}

void RemoteTierOptions::validate() const {
  if (url.nodes.empty()) throw_invalid("remote tier: the URL names no node");
  if (geometry.slot_bytes == 0) throw_invalid("remote tier: geometry.slot_bytes is 0");
  if (geometry.world_size == 0) throw_invalid("remote tier: geometry.world_size is 0");
  if (geometry.slot_stride != 0 && geometry.slot_stride < geometry.slot_bytes) {
    throw_invalid("remote tier: geometry.slot_stride " + std::to_string(geometry.slot_stride) +
                  " is smaller than slot_bytes " + std::to_string(geometry.slot_bytes) +
                  "; give the region's slot stride, or 0 for packed slots");
  }
  // Redis refuses bulk strings over 512 MiB (proto-max-bulk-len).
  if (geometry.slot_bytes > (512ULL << 20) - detail::kRemoteHeaderBytes) {
    throw_invalid("remote tier: slot_bytes " + std::to_string(geometry.slot_bytes) +
                  " exceeds the 512 MiB value limit of the stores");
  }
  auto positive = [](const char* field, std::chrono::milliseconds v) {
    if (v.count() <= 0) {
      throw_invalid(std::string("remote tier: ") + field + " is " + std::to_string(v.count()) +
                    " ms; it must be > 0");
    }
  };
  positive("connect_timeout", connect_timeout);
  positive("lookup_timeout", lookup_timeout);
  positive("get_timeout", get_timeout);
  positive("put_timeout", put_timeout);
  positive("breaker_backoff", breaker_backoff);
  positive("warn_interval", warn_interval);
  if (negative_ttl.count() < 0) throw_invalid("remote tier: negative_ttl is negative");
  if (breaker_backoff_max < breaker_backoff) {
    throw_invalid("remote tier: breaker_backoff_max " +
                  std::to_string(breaker_backoff_max.count()) + " ms is below breaker_backoff " +
                  std::to_string(breaker_backoff.count()) + " ms");
  }
  if (connections_per_node < 1 || connections_per_node > 64) {
    throw_invalid("remote tier: connections_per_node " + std::to_string(connections_per_node) +
                  " is out of range; allowed 1..64");
  }
  if (breaker_failures < 1) throw_invalid("remote tier: breaker_failures is 0; it must be >= 1");
  const std::uint64_t value = remote_value_bytes(geometry.slot_bytes);
  if (max_inflight_bytes < value) {
    throw_invalid("remote tier: max_inflight_bytes " + std::to_string(max_inflight_bytes) +
                  " cannot hold one value of " + std::to_string(value) + " bytes");
  }
  if (max_queued_bytes < max_inflight_bytes) {
    throw_invalid("remote tier: max_queued_bytes " + std::to_string(max_queued_bytes) +
                  " is below max_inflight_bytes " + std::to_string(max_inflight_bytes));
  }
  if (presence_capacity < 1) throw_invalid("remote tier: presence_capacity is 0");
  if (url.kind == RemoteKind::kMemcached && value > memcached_item_max) {
    throw_invalid("remote tier: a value of " + std::to_string(value) + " bytes (slot " +
                  std::to_string(geometry.slot_bytes) +
                  " + 64-byte header) exceeds memcached's item size " +
                  std::to_string(memcached_item_max) +
                  "; start memcached with -I of at least the value size plus 1 KiB (e.g. -I " +
                  std::to_string(((value + 1024 + (1 << 20) - 1) >> 20)) +
                  "m) and set memcached_item_max to it");
  }
}

}  // namespace kvoffload
