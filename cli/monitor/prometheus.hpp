#pragma once
// The Prometheus text exposition format (version 0.0.4) for every engine of a node: what
// `kvoffload exporter` serves on /metrics. Names follow Prometheus' conventions: the kvoffload_
// prefix, _total on counters, base units in the name (_bytes, _seconds), and the labels engine_id,
// rank, tier and direction (docs/OPERATING.md: "Watching engines").

#include <string>
#include <vector>

#include <kvoffload/live_stats.hpp>
#include <kvoffload/node_pool.hpp>

namespace kvoffload::cli {

// The content type /metrics answers with.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Every metric family once (# HELP, # TYPE, then its samples), families in a fixed order; the
// node pools' families (kvoffload_pool_*, labels pool and engine_id) after the regions'.
std::string prometheus_text(const std::vector<EngineSnapshot>& engines,
                            const std::vector<pool::PoolObservation>& pools = {});

// A label value with \\, " and newlines escaped as the format requires.
std::string escape_label_value(const std::string& value);

}  // namespace kvoffload::cli
