#!/usr/bin/env bash
# Runs a Python script (a bench) in vLLM's engine loop on this CPU-only machine: vLLM's code from
# one supported commit's tree, the built kvoffload package, and the vLLM harness's stand-ins for
# the third-party libraries Debian lacks (torch, msgspec, ...), as the tests run
# (tools/vllm-engine-tests.sh). python/tests/vllm_real.require() checks that set-up.
#
#   tools/vllm-python.sh [--tree VLLM_TREE] [--build BUILD_DIR] SCRIPT [ARGS...]
#
# VLLM_TREE defaults to the first tree of tools/vllm-trees.sh (../shared/vllm-017e9f4448-engine
# here), BUILD_DIR to build/cpu; KVOFFLOAD_VLLM_HARNESS names the harness (../shared/vllm-harness).
# BUILD_DIR/python (kvoffload) and python/engine_tests (engine_loop) come first on sys.path.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "vllm-python: $*" >&2; exit 1; }
source tools/vllm-trees.sh
tree=${vllm_engine_trees[0]}
build=build/cpu
while [[ $# -gt 0 ]]; do
  case $1 in
    --tree) tree=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || fail "usage: tools/vllm-python.sh [--tree VLLM_TREE] [--build BUILD_DIR] SCRIPT [ARGS...]"
harness=${KVOFFLOAD_VLLM_HARNESS:-../shared/vllm-harness}
[[ -x $harness/setup.sh && -f $harness/env.sh && -d $harness/boot ]] ||
  fail "no vLLM harness at $harness (setup.sh, env.sh, boot/); set KVOFFLOAD_VLLM_HARNESS"
[[ -f $tree/vllm/v1/core/sched/scheduler.py ]] ||
  fail "no vLLM engine tree at $tree (vllm/v1/core/sched/scheduler.py)"
compgen -G "$build/python/kvoffload/_kvoffload*.so" >/dev/null ||
  fail "the Python module is not built ($build/python/kvoffload/_kvoffload*.so): cmake --build --preset cpu --target kvoffload_python"
vllm_harness_setup "$harness" "$build" >&2 || exit 1
pydeps=$(bash -c 'source "$1/env.sh"; harness_pydeps' _ "$harness") ||
  fail "pydantic 2 is not importable after the harness's setup.sh"
PYTHONPATH=$(cd "$harness/boot" && pwd) VLLM_HARNESS_TREE=$(cd "$tree" && pwd) \
  VLLM_HARNESS_EXTRA_PATH=$(cd "$build" && pwd)/python:$PWD/python/engine_tests VLLM_HARNESS_PYDEPS=$pydeps PYTHONDONTWRITEBYTECODE=1 \
  exec "${VLLM_HARNESS_PYTHON:-/usr/bin/python3}" "$@"
