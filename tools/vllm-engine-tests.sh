#!/usr/bin/env bash
# Runs kvoffload's vLLM backend inside vLLM's real engine loop, on every supported vLLM commit:
# for each vLLM tree, vLLM's own OffloadingConnector tests (tests/v1/kv_connector/unit/
# offloading_connector/, unmodified) and kvoffload's engine-loop tests (python/engine_tests/:
# vLLM's Scheduler + OffloadingConnector with KvoffloadSpec), under the vLLM harness, which
# supplies stand-ins for the few third-party libraries Debian lacks (torch, msgspec, ...).
#
#   tools/vllm-engine-tests.sh [BUILD_DIR] [pytest args for python/engine_tests]
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
compgen -G "$pkg/kvoffload/_kvoffload*.so" >/dev/null ||
  fail "the Python module is not built ($pkg/kvoffload/_kvoffload*.so): cmake --build --preset cpu --target kvoffload_python"

# The harness keeps its links (pydantic 2) in the build tree, not in a directory shared with others.
export VLLM_HARNESS_STATE_DIR=$PWD/$build/vllm-harness
py=${VLLM_HARNESS_PYTHON:-/usr/bin/python3}
# pydantic 2 for Debian's interpreter: from the first CPython of its minor version that has it,
# on PATH or in pyenv's versions. setup.sh would ask only the first python3 on PATH.
if [[ -z ${VLLM_HARNESS_PYDANTIC_FROM:-} ]] && ! "$py" -c 'import pydantic, sys; sys.exit(int(pydantic.VERSION[0]) < 2)' 2>/dev/null; then
  minor=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  candidates=()
  for name in python3 "python$minor"; do
    while read -r c; do candidates+=("$c"); done < <(which -a "$name" 2>/dev/null || true)
  done
  for c in "${PYENV_ROOT:-$HOME/.pyenv}/versions/$minor".*/bin/python"$minor"; do
    [[ -x $c ]] && candidates+=("$c")
  done
  for c in "${candidates[@]}"; do
    from=$("$c" -c "import sys, os, pydantic
assert '%d.%d' % sys.version_info[:2] == '$minor' and int(pydantic.VERSION[0]) >= 2
print(os.path.dirname(os.path.dirname(pydantic.__file__)))" 2>/dev/null) || continue
    export VLLM_HARNESS_PYDANTIC_FROM=$from
    break
  done
  [[ -n ${VLLM_HARNESS_PYDANTIC_FROM:-} ]] ||
    fail "pydantic 2 is needed by vLLM's config classes and Debian 12 packages 1.10: no CPython $minor with pydantic 2 found (tried: ${candidates[*]:-none}); name its site-packages in VLLM_HARNESS_PYDANTIC_FROM"
fi
# What the harness installs must come from install-deps.sh, or a fresh machine lacks it.
not_listed=$(comm -23 <(bash -c 'source "$1/env.sh"; printf "%s\n" "${DEBIAN_PACKAGES[@]}"' _ "$harness" | sort -u) \
  <(tools/setup/install-deps.sh --list | sort -u))
[[ -z $not_listed ]] ||
  fail "the vLLM harness needs Debian packages that tools/setup/install-deps.sh does not install: $(echo $not_listed)"
"$harness/setup.sh"

reports=$PWD/$build/test-reports
mkdir -p "$reports"
status=0
for t in "${trees[@]}"; do
  name=$(basename "$(cd "$t" && pwd)")
  for what in vllm kvoffload; do
    junit=$(mktemp "${TMPDIR:-/tmp}/vllm-engine-tests.XXXXXX.xml")
    echo "=== vllm-engine-tests: $([[ $what == vllm ]] && echo "vLLM's own offloading_connector tests" || echo "python/engine_tests") on $name"
    if [[ $what == vllm ]]; then
      args=()
    else
      args=("$PWD/python/engine_tests" "$@")
    fi
    rc=0
    "$harness/run-vllm-tests.sh" "$t" "$pkg" --junitxml="$junit" "${args[@]}" || rc=$?
    # 5 = no test collected: as much a failure as a failed test.
    ((rc == 0)) || { echo "vllm-engine-tests: $what tests on $name: pytest exit status $rc" >&2; status=1; }
    /usr/bin/python3 tools/ci/junit_report.py "$junit" "vllm-harness-$what-$name" "$reports" || status=1
    rm -f "$junit"
  done
done
exit "$status"
