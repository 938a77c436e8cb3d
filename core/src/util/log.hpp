#pragma once
// One spdlog logger for the whole library, named "kvoffload", writing to stderr. Internal: spdlog
// is no part of the public headers (an engine needs no spdlog to build against kvoffload); the
// `kvoffload` program logs through it too (kvoffload_util), so log() stays exported.
// Its level comes from KVOFFLOAD_LOG_LEVEL (trace, debug, info, warn, error, critical, off;
// default "warn" so that libraries linked into an engine stay quiet unless asked).

#include <spdlog/spdlog.h>

#include <kvoffload/export.h>

namespace kvoffload {

KVOFFLOAD_API spdlog::logger& log();

// Overrides the level from the environment (the CLI's --verbose uses it).
KVOFFLOAD_API void set_log_level(spdlog::level::level_enum level);

}  // namespace kvoffload
