#pragma once
// The scheduler of `kvoffload run`: builds the offload stack (region, manager, optional file
// tier), starts one process per rank, drives the workload and reports.
#include <string>

#include <nlohmann/json.hpp>

#include "run_config.hpp"

namespace kvoffload::run {

struct RunOutcome {
  nlohmann::json report;  // every figure, also what --json prints
  int exit_code = 0;      // 0 only when every byte verified and no job failed; 130: interrupted
  std::string failure;    // why exit_code is 1, in one line (stderr; "error" in the JSON)
  // The run stopped before it served anything (bring-up failed): the failure line says it all,
  // so the text output is that line alone.
  bool verdict_only = false;
};

RunOutcome run_scheduler(const RunConfig& config);
// The same as a tenant of the node pool config.pool (Note [Run on a node pool], pool_run.cpp);
// run_scheduler calls it when --pool is given.
RunOutcome run_pool_scheduler(RunConfig config);

// The report's fields that describe the run's geometry, the same for a private region and a node
// pool: engine id, backend (what rank 0 reported, else the configured one), world size, layers,
// block and slot bytes, chunks, host pool bytes.
nlohmann::json geometry_report(const RunConfig& config, const nlohmann::json& rank_reports);

// Human-readable form of the report.
std::string format_report(const nlohmann::json& report);

}  // namespace kvoffload::run
