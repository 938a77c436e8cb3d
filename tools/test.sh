#!/usr/bin/env bash
# Builds and runs every test from a fresh clone: dependencies, the CPU preset, ctest (label cpu)
# and the Python tests against Debian's /usr/bin/python3, vLLM's engine loop on each supported
# commit with the vLLM backend's tests in it (tools/vllm-engine-tests.sh), the SGLang
# backend's against $KVOFFLOAD_SGLANG_SRC (default ../shared/sglang-17313cf4b2); then says how
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
  # The vLLM backend's tests (test_vllm_*.py) run in vLLM's engine loop under the vLLM harness, on
  # every supported vLLM commit's tree (tools/vllm-engine-tests.sh, below); the others here.
  PYTHONPATH="$PWD/build/cpu/python" KVOFFLOAD_TEST_BIN_DIR="$PWD/build/cpu/bin" \
    KVOFFLOAD_TEST_REPORT_DIR="$reports" KVOFFLOAD_TEST_REPORT_SUITE=pytest \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider --ignore-glob='*/test_vllm_*.py' python/tests || status=$?
  # The SGLang backend's tests import SGLang's own HiCache files from KVOFFLOAD_SGLANG_SRC (next to
  # a checkout here, ../shared/sglang-17313cf4b2) with Debian's real torch, so they run in their
  # own pytest process (the vLLM tests use the harness's torch stand-in). Without the tree they skip.
  if [[ -z ${KVOFFLOAD_SGLANG_SRC:-} && -f ../shared/sglang-17313cf4b2/python/sglang/srt/mem_cache/hicache_storage.py ]]; then
    export KVOFFLOAD_SGLANG_SRC="$(cd ../shared/sglang-17313cf4b2 && pwd)"
  fi
  PYTHONPATH="$PWD/build/cpu/python" KVOFFLOAD_TEST_REPORT_DIR="$reports" \
    KVOFFLOAD_TEST_REPORT_SUITE=pytest-sglang \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests_sglang || status=$?
fi
# vLLM's own OffloadingConnector tests, the vLLM backend's tests (python/tests/test_vllm_*.py) and
# kvoffload's engine-loop tests (python/engine_tests), in vLLM's real engine loop on each supported
# vLLM commit, with the vLLM harness in ../shared. Without it they are skipped, saying so, except
# in CI (KVOFFLOAD_CI_NO_SKIPS=1), where that fails.
if [[ -d ../shared/vllm-harness || ${KVOFFLOAD_CI_NO_SKIPS:-} == 1 || -n ${KVOFFLOAD_VLLM_HARNESS:-} ]]; then
  ./tools/vllm-engine-tests.sh build/cpu || status=$?
else
  echo "test.sh: vLLM's engine-loop tests and the vLLM backend's tests (python/tests/test_vllm_*.py) skipped: no vLLM harness at ../shared/vllm-harness (KVOFFLOAD_VLLM_HARNESS names one)"
fi
/usr/bin/python3 tools/ci/test_summary.py "$reports" || status=$?
exit "$status"
