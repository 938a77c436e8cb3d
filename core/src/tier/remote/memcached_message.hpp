#pragma once
// libmemcached's error text made fit for a user: memcached_last_error_message() returns
// "(0x5611d2a0c2f0) CONNECTION FAILURE(Connection refused), host: 127.0.0.1:1 ->
// ./src/libmemcached/connect.cc:123", with the client's address in front and its source file
// behind, and a server's answer keeps its CR/LF. What reaches an error, a log line or a JSON
// report is the middle: "CONNECTION FAILURE(Connection refused), host: 127.0.0.1:1".

#include <string>
#include <string_view>

#include <libmemcached/memcached.h>

namespace kvoffload::detail {

inline std::string clean_memcached_message(std::string_view raw) {
  // "(0x...) " in front: libmemcached's pointer to its client object.
  if (raw.starts_with("(0x")) {
    if (const std::size_t close = raw.find(") "); close != std::string_view::npos) {
      raw.remove_prefix(close + 2);
    }
  }
  // " -> path/file.cc:NN" behind: where in libmemcached the error was raised.
  if (const std::size_t arrow = raw.rfind(" -> "); arrow != std::string_view::npos) {
    const std::string_view where = raw.substr(arrow + 4);
    if (where.find(".cc:") != std::string_view::npos ||
        where.find(".c:") != std::string_view::npos) {
      raw = raw.substr(0, arrow);
    }
  }
  // Control characters (a server's CR/LF) become one space each run; the ends are trimmed.
  std::string out;
  out.reserve(raw.size());
  bool space = false;
  for (const char c : raw) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out.empty() ? std::string("unknown error") : out;
}

// The last error of `mc`, cleaned.
inline std::string memcached_message(const memcached_st* mc) {
  const char* raw = memcached_last_error_message(mc);
  return clean_memcached_message(raw != nullptr ? raw : "");
}

}  // namespace kvoffload::detail
