# Sourced by tools/test.sh and tools/vllm-engine-tests.sh: the vLLM trees of the supported commits
# (kvoffload.vllm_compat.SUPPORTED_VLLM_COMMITS), each vLLM's files at one commit with the whole
# import chain of its engine loop; next to a checkout in this workplace they are in ../shared/.
# KVOFFLOAD_VLLM_ENGINE_TREES (':'-separated) names others.
IFS=: read -r -a vllm_engine_trees <<<"${KVOFFLOAD_VLLM_ENGINE_TREES:-../shared/vllm-017e9f4448-engine:../shared/vllm-7cfb97e3-engine}"

vllm_harness_fail() { echo "vllm-harness set-up: $*" >&2; }
# vllm_harness_setup HARNESS BUILD_DIR: runs the harness's setup.sh with its state (pydantic 2's
# links) in BUILD_DIR/vllm-harness, and pydantic 2 for Debian's interpreter found (below); exports
# VLLM_HARNESS_STATE_DIR and VLLM_HARNESS_PYDANTIC_FROM. Run from the checkout's root.
vllm_harness_setup() {
  local harness=$1 build=$2 py minor c from not_listed candidates name
  # The harness keeps its links (pydantic 2) in the build tree, not in a directory shared with others.
  export VLLM_HARNESS_STATE_DIR=$(cd "$build" && pwd)/vllm-harness
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
      { vllm_harness_fail "pydantic 2 is needed by vLLM's config classes and Debian 12 packages 1.10: no CPython $minor with pydantic 2 found (tried: ${candidates[*]:-none}); name its site-packages in VLLM_HARNESS_PYDANTIC_FROM"; return 1; }
  fi
  # What the harness installs must come from install-deps.sh, or a fresh machine lacks it.
  not_listed=$(comm -23 <(bash -c 'source "$1/env.sh"; printf "%s\n" "${DEBIAN_PACKAGES[@]}"' _ "$harness" | sort -u) \
    <(tools/setup/install-deps.sh --list | sort -u))
  [[ -z $not_listed ]] ||
    { vllm_harness_fail "the vLLM harness needs Debian packages that tools/setup/install-deps.sh does not install: $(echo $not_listed)"; return 1; }
  "$harness/setup.sh" || { vllm_harness_fail "$harness/setup.sh failed"; return 1; }
  # vLLM's Scheduler imports weight_utils, which imports filelock; the harness's list lacks it.
  "$py" -c 'import filelock' 2>/dev/null ||
    { vllm_harness_fail "$py cannot import filelock (vLLM's Scheduler imports it): install python3-filelock (tools/setup/install-deps.sh)"; return 1; }
}
