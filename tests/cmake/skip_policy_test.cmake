# cmake -P tests/cmake/skip_policy_test.cmake -DPROBE=<skip_policy_probe> -DWORK_DIR=<scratch dir>
# The CI skip policy of the GoogleTest suites (Note [Skips in CI] in tests/support/gtest_main.cpp):
# with KVOFFLOAD_CI_NO_SKIPS=1 a skip whose tag tests/accepted_skips.txt does not list, or that has
# no tag, fails the suite; an accepted one does not; without CI mode every skip is reported and
# passes. Every run says how many cases ran and were skipped, and why.
cmake_minimum_required(VERSION 3.25)

set(reports ${WORK_DIR}/skip_policy_reports)
file(REMOVE_RECURSE ${reports})

# run(<name> <expected exit code> <CI mode 0|1> <KVO_PROBE_SKIP value or UNSET> <needles...>)
function(run name expected_rc ci skip)
  set(env --unset=KVOFFLOAD_CI_NO_SKIPS)
  if(ci)
    set(env KVOFFLOAD_CI_NO_SKIPS=1)
  endif()
  if(skip STREQUAL "UNSET")
    list(APPEND env --unset=KVO_PROBE_SKIP)
  else()
    list(APPEND env "KVO_PROBE_SKIP=${skip}")
  endif()
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env ${env} KVOFFLOAD_TEST_REPORT_DIR=${reports}/${name} ${PROBE}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "${name}: exit ${rc}, expected ${expected_rc}\n${out}")
  endif()
  foreach(needle IN LISTS ARGN)
    string(FIND "${out}" "${needle}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${name}: the output lacks \"${needle}\"\n${out}")
    endif()
  endforeach()
  if(NOT EXISTS ${reports}/${name}/skip_policy_probe.json)
    message(FATAL_ERROR "${name}: no report in ${reports}/${name}")
  endif()
endfunction()

run(passes 0 1 UNSET "skip_policy_probe: 1 cases ran (0 failed), 0 skipped")
run(refused_in_ci 1 1 no-servers
    "0 cases ran (0 failed), 1 skipped"
    "skipped SkipPolicyProbe.DoesWhatItIsTold: [no-servers] the probe was told to skip (not accepted in CI)"
    "1 skip(s) without a reason CI accepts")
run(untagged_in_ci 1 1 ""
    "a skip that names no reason (no reason tag: not accepted in CI)"
    "1 skip(s) without a reason CI accepts")
run(accepted_in_ci 0 1 no-gpu "[no-gpu] the probe was told to skip (accepted in CI)")
run(reported_outside_ci 0 0 no-servers "1 skipped" "(not accepted in CI)")
file(READ ${reports}/refused_in_ci/skip_policy_probe.json report)
string(FIND "${report}" "\"tag\":\"no-servers\"" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the report does not carry the skip's tag: ${report}")
endif()
