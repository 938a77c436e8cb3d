#pragma once
// The scheduler of `kvoffload run`: builds the offload stack (region, manager, optional file
// tier), starts one process per rank, drives the workload and reports.
#include "run_config.hpp"

#include <nlohmann/json.hpp>

namespace kvoffload::run {

struct RunOutcome {
  nlohmann::json report;  // every figure, also what --json prints
  int exit_code = 0;      // 0 only when every byte verified and no job failed
};

RunOutcome run_scheduler(const RunConfig& config);

// Human-readable form of the report.
std::string format_report(const nlohmann::json& report);

}  // namespace kvoffload::run
