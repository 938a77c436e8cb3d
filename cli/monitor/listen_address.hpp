#pragma once
// `--listen ADDR` of `kvoffload exporter`: HOST:PORT, :PORT (every IPv4 interface) or
// [IPv6]:PORT; PORT 0 asks for any free port.

#include <cstdint>
#include <string>
#include <string_view>

namespace kvoffload::cli {

struct ListenAddress {
  std::string host;  // as given ("0.0.0.0" for ":PORT"), without brackets
  std::uint16_t port = 0;
  bool ipv6 = false;  // given in brackets

  // "host:port" with brackets around an IPv6 host, for messages and URLs.
  [[nodiscard]] std::string to_string() const;
};

// Throws Error(kInvalidArgument) naming the value and the accepted forms.
ListenAddress parse_listen_address(std::string_view text);

}  // namespace kvoffload::cli
