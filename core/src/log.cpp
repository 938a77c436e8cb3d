#include "util/log.hpp"

#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace kvoffload {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = spdlog::stderr_color_mt("kvoffload");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [kvoffload] [%^%l%$] [pid %P] %v");
  auto level = spdlog::level::warn;
  if (const char* env = std::getenv("KVOFFLOAD_LOG_LEVEL"); env != nullptr && *env != '\0') {
    level = spdlog::level::from_str(env);  // unknown names map to "off" in spdlog; warn instead
    if (level == spdlog::level::off && std::string(env) != "off") {
      level = spdlog::level::warn;
      logger->warn(
          "KVOFFLOAD_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, "
          "critical, off); using warn",
          env);
    }
  }
  logger->set_level(level);
  return logger;
}

}  // namespace

spdlog::logger& log() {
  // Function-local static: thread-safe initialisation, and never destroyed before its users
  // because spdlog's registry also holds a reference.
  static std::shared_ptr<spdlog::logger> logger = make_logger();
  return *logger;
}

void set_log_level(spdlog::level::level_enum level) {
  log().set_level(level);
}

}  // namespace kvoffload
