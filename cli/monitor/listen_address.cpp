#include "monitor/listen_address.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <kvoffload/error.hpp>

namespace kvoffload::cli {
namespace {

[[noreturn]] void refuse(std::string_view text, const std::string& why) {
  throw_invalid("--listen: '" + std::string(text) + "' " + why +
                "; use HOST:PORT, :PORT (every IPv4 interface) or [IPv6]:PORT, with PORT 0 to "
                "65535 (0: any free port), e.g. --listen 127.0.0.1:9477");
}

}  // namespace

std::string ListenAddress::to_string() const {
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

ListenAddress parse_listen_address(std::string_view text) {
  ListenAddress a;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) refuse(text, "has no ']' after its IPv6 address");
    a.host = std::string(text.substr(1, close - 1));
    a.ipv6 = true;
    if (a.host.empty()) refuse(text, "has an empty IPv6 address");
    if (close + 1 >= text.size() || text[close + 1] != ':') refuse(text, "has no port");
    port = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) refuse(text, "has no port");
    a.host = std::string(text.substr(0, colon));
    if (a.host.find(':') != std::string::npos) {
      refuse(text, "looks like an IPv6 address without brackets");
    }
    if (a.host.empty()) a.host = "0.0.0.0";
    port = text.substr(colon + 1);
  }
  if (port.empty()) refuse(text, "has no port");
  if (!std::all_of(port.begin(), port.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
    refuse(text, "has a port that is not a number");
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc{} || end != port.data() + port.size() || value > 65535) {
    refuse(text, "has a port out of range");
  }
  a.port = static_cast<std::uint16_t>(value);
  for (const char c : a.host) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' ||
                    c == '_' || (a.ipv6 && (c == ':' || c == '%'));
    if (!ok) refuse(text, "has a host with the character '" + std::string(1, c) + "'");
  }
  return a;
}

}  // namespace kvoffload::cli
