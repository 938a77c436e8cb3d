#include "argv_secrets.hpp"

#include <cstring>
#include <string_view>

#include <kvoffload/remote_url.hpp>

namespace kvoffload::cli {
namespace {

// The span of a word's password: after "://" and the user's ':', up to the last '@' (as
// redact_remote_url reads it); empty when the word holds none.
std::string_view password_span(std::string_view word) {
  const auto sep = word.find("://");
  const auto at = word.rfind('@');
  if (sep == std::string_view::npos || at == std::string_view::npos || at < sep + 3) return {};
  const std::string_view userinfo = word.substr(sep + 3, at - sep - 3);
  const auto colon = userinfo.find(':');
  // Without a ':' the whole userinfo may be a password typed without its user.
  return colon == std::string_view::npos ? userinfo : userinfo.substr(colon + 1);
}

}  // namespace

std::string redact_argv_secrets(std::string message, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (password_span(word).empty()) continue;
    const std::string redacted = redact_remote_url(word);
    for (auto at = message.find(word); at != std::string::npos;
         at = message.find(word, at + redacted.size())) {
      message.replace(at, word.size(), redacted);
    }
  }
  return message;
}

void scrub_argv_secrets(int argc, char** argv) noexcept {
  for (int i = 1; i < argc; ++i) {
    const std::string_view span = password_span(argv[i]);
    if (!span.empty()) std::memset(const_cast<char*>(span.data()), '*', span.size());
  }
}

}  // namespace kvoffload::cli
