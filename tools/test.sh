#!/usr/bin/env bash
# Builds and runs every test from a fresh clone: dependencies, the CPU preset, ctest (label cpu)
# and the Python tests against Debian's /usr/bin/python3 (the vLLM backend's against vLLM's
# sources in $KVOFFLOAD_VLLM_SRC, default ../shared/vllm-017e9f4448 when it exists), vLLM's engine
# loop on each supported vLLM commit (tools/vllm-engine-tests.sh); then says how
# many cases ran and how many were skipped, and why (tools/ci/test_summary.py). With
# KVOFFLOAD_CI_NO_SKIPS=1 (.ci/run sets it) a skip whose reason tests/accepted_skips.txt does not
# list fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)"
reports=$PWD/build/cpu/test-reports  # where the suites write their reports (tests/CMakeLists.txt)
rm -rf "$reports"
status=0
ctest --preset cpu || status=$?
# The Python package is build/cpu/python/kvoffload/ (__init__.py + the _kvoffload extension).
if [[ -d python/tests ]]; then
  if ! compgen -G "build/cpu/python/kvoffload/_kvoffload*.so" >/dev/null; then
    echo "test.sh: the Python module was not built (build/cpu/python/kvoffload/_kvoffload*.so)" >&2
    exit 1
  fi
  # The vLLM backend's tests import vLLM's own modules from KVOFFLOAD_VLLM_SRC; next to a checkout
  # in this workplace that is ../shared/vllm-017e9f4448 (.ci/run sets it and insists on it).
  # Without it those tests skip, naming the variable.
  if [[ -z ${KVOFFLOAD_VLLM_SRC:-} && -f ../shared/vllm-017e9f4448/vllm/v1/kv_offload/base.py ]]; then
    export KVOFFLOAD_VLLM_SRC="$(cd ../shared/vllm-017e9f4448 && pwd)"
  fi
  PYTHONPATH="$PWD/build/cpu/python" KVOFFLOAD_TEST_BIN_DIR="$PWD/build/cpu/bin" \
    KVOFFLOAD_TEST_REPORT_DIR="$reports" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests || status=$?
fi
# vLLM's own OffloadingConnector tests and kvoffload's engine-loop tests (python/engine_tests), in
# vLLM's real engine loop on each supported vLLM commit, with the vLLM harness in ../shared. Without
# it they are skipped, saying so, except in CI (KVOFFLOAD_CI_NO_SKIPS=1), where that fails.
if [[ -d ../shared/vllm-harness || ${KVOFFLOAD_CI_NO_SKIPS:-} == 1 || -n ${KVOFFLOAD_VLLM_HARNESS:-} ]]; then
  ./tools/vllm-engine-tests.sh build/cpu || status=$?
else
  echo "test.sh: vLLM's engine-loop tests skipped: no vLLM harness at ../shared/vllm-harness (KVOFFLOAD_VLLM_HARNESS names one)"
fi
/usr/bin/python3 tools/ci/test_summary.py "$reports" || status=$?
exit "$status"
