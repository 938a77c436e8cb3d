#!/usr/bin/env bash
# Runs kvoffload's vLLM backend inside vLLM's real engine loop, on every supported vLLM commit:
# for each vLLM tree, vLLM's own OffloadingConnector tests (tests/v1/kv_connector/unit/
# offloading_connector/, unmodified), the vLLM backend's tests (python/tests/test_vllm_*.py: vLLM's
# kv_offload modules, tiers and worker with kvoffload's) and kvoffload's engine-loop tests
# (python/engine_tests/: vLLM's Scheduler + OffloadingConnector with KvoffloadSpec), under the
# vLLM harness, which
# supplies stand-ins for the few third-party libraries Debian lacks (torch, msgspec, ...).
#
#   tools/vllm-engine-tests.sh [BUILD_DIR] [pytest args for python/engine_tests]
#   KVOFFLOAD_VLLM_ENGINE_SUITES  which of vllm, backend, kvoffload run (default all three, ',')
#
# BUILD_DIR (default build/cpu) holds the built package, BUILD_DIR/python/kvoffload/. Where things
# are, when not next to this checkout in this workplace (../shared/):
#   KVOFFLOAD_VLLM_HARNESS       the harness (setup.sh, run-vllm-tests.sh)
#   KVOFFLOAD_VLLM_ENGINE_TREES  ':'-separated vLLM trees (default: the 017e9f4448 and 7cfb97e3
#                                -engine trees)
# A missing harness or tree fails the run (it never skips). Each run writes a report into
# BUILD_DIR/test-reports for tools/ci/test_summary.py; with KVOFFLOAD_CI_NO_SKIPS=1 a skip whose
# reason tests/accepted_skips.txt does not list fails (tools/ci/junit_report.py).
#
# Needs the Debian packages of tools/setup/install-deps.sh, and pydantic 2, which Debian 12 lacks
# (it packages 1.10): the harness's setup.sh links it from a CPython of Debian's minor version
# that has it (the machine image's pyenv 3.11 here), found below.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cpu}
shift || true
fail() { echo "vllm-engine-tests: $*" >&2; exit 1; }

harness=${KVOFFLOAD_VLLM_HARNESS:-../shared/vllm-harness}
[[ -x $harness/setup.sh && -x $harness/run-vllm-tests.sh ]] ||
  fail "no vLLM harness at $harness (setup.sh, run-vllm-tests.sh); set KVOFFLOAD_VLLM_HARNESS"
source tools/vllm-trees.sh
trees=("${vllm_engine_trees[@]}")
for t in "${trees[@]}"; do
  [[ -f $t/vllm/v1/core/sched/scheduler.py && -d $t/tests/v1/kv_connector/unit/offloading_connector ]] ||
    fail "no vLLM engine tree at $t (vllm/v1/core/sched/scheduler.py and vLLM's offloading_connector tests); set KVOFFLOAD_VLLM_ENGINE_TREES"
done
pkg=$build/python
suites=${KVOFFLOAD_VLLM_ENGINE_SUITES:-vllm,backend,kvoffload}
compgen -G "$pkg/kvoffload/_kvoffload*.so" >/dev/null ||
  fail "the Python module is not built ($pkg/kvoffload/_kvoffload*.so): cmake --build --preset cpu --target kvoffload_python"

build=$(cd "$build" && pwd)  # absolute: BUILD_DIR may be given either way
vllm_harness_setup "$harness" "$build" || exit 1

reports=$build/test-reports
mkdir -p "$reports"
status=0
for t in "${trees[@]}"; do
  name=$(basename "$(cd "$t" && pwd)")
  for what in vllm backend kvoffload; do
    [[ ,$suites, == *,$what,* ]] || continue
    junit=$(mktemp "${TMPDIR:-/tmp}/vllm-engine-tests.XXXXXX.xml")
    case $what in
      vllm) echo "=== vllm-engine-tests: vLLM's own offloading_connector tests on $name"; args=() ;;
      # python/tests' conftest writes the report and applies the CI skip policy itself; its node
      # ids are relative to this checkout (not to the tree, which would drop their file names).
      backend) echo "=== vllm-engine-tests: python/tests/test_vllm_*.py on $name"
        args=(--rootdir="$PWD" "$PWD"/python/tests/test_vllm_*.py) ;;
      kvoffload) echo "=== vllm-engine-tests: python/engine_tests on $name"
        args=("$PWD/python/engine_tests" "$@") ;;
    esac
    rc=0
    KVOFFLOAD_TEST_BIN_DIR="$build/bin" KVOFFLOAD_TEST_REPORT_DIR="$reports" \
      KVOFFLOAD_TEST_REPORT_SUITE="pytest-vllm-$name" \
      "$harness/run-vllm-tests.sh" "$t" "$pkg" --junitxml="$junit" "${args[@]}" || rc=$?
    # 5 = no test collected: as much a failure as a failed test.
    ((rc == 0)) || { echo "vllm-engine-tests: $what tests on $name: pytest exit status $rc" >&2; status=1; }
    if [[ $what != backend ]]; then
      /usr/bin/python3 tools/ci/junit_report.py "$junit" "vllm-harness-$what-$name" "$reports" || status=1
    fi
    rm -f "$junit"
  done
done
exit "$status"
