#!/usr/bin/env bash
# Checks `pip install --no-build-isolation .` the way a vLLM user installs kvoffload into a
# virtualenv (docs/VLLM.md: "Building for a vLLM environment"), offline, with no PYTHONPATH:
#   1. a venv of Debian's /usr/bin/python3 (--system-site-packages: numpy, pytest from Debian):
#      pip builds the package for that venv's interpreter and installs it; `import kvoffload`
#      resolves to the venv's site-packages; the `kvoffload` console script runs; with
#      KVOFFLOAD_VLLM_SRC set, the vLLM spec and manager tests pass against the installed package;
#   2. a venv of the first python3 on PATH when that is another interpreter (a pyenv build here,
#      without numpy or the `wheel` package): the same install, `import kvoffload`, a Manager, the
#      console script.
# Usage: tools/ci/check-pip-install.sh   (from anywhere; builds in build/pip, reused)
#   KVOFFLOAD_PIP_BUILD_DIR=DIR   build there instead (.ci/run passes its plain Makefile build, so the
#                                 library is compiled once for both checks)
# Env:   KVOFFLOAD_PIP_CMAKE_ARGS (default "-DKVOFFLOAD_CUDA=OFF -DKVOFFLOAD_HIP=OFF": the GPU
#        backends are compiled by .ci/run's cuda/hip stages), KEEP=1 keeps the temp dir.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
cmake_args=${KVOFFLOAD_PIP_CMAKE_ARGS:--DKVOFFLOAD_CUDA=OFF -DKVOFFLOAD_HIP=OFF}
build_dir=$(realpath -m "${KVOFFLOAD_PIP_BUILD_DIR:-$src/build/pip}")

die() { printf 'check-pip-install: FAILED: %s\n' "$*" >&2; exit 1; }
step() { printf '== check-pip-install: %s\n' "$*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/kvoffload-check-pip.XXXXXX")
cleanup() { if [[ ${KEEP:-0} == 1 ]]; then echo "kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT

# install_into VENV_PYTHON: pip-installs this tree into the venv of VENV_PYTHON.
install_into() {
  local py=$1 tag log inc
  # One build dir for every interpreter: the second configure finds the other interpreter's
  # headers (FindPython re-resolves when Python_EXECUTABLE changes) and rebuilds only the
  # extension; the library and the program, which do not depend on Python, are built once.
  tag=$("$py" -c 'import hashlib, sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-" + hashlib.sha1(sys.base_prefix.encode()).hexdigest()[:8])')
  log=$work/pip-$tag.log
  step "pip install --no-build-isolation . with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  if ! "$py" -m pip install --no-build-isolation --no-index --no-deps -v \
      --config-settings "cmake-args=$cmake_args" --config-settings "build-dir=$build_dir" \
      "$src" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    die "pip install with $py (whole log: KEEP=1)"
  fi
  # The shared build dir must have compiled the extension against this interpreter's headers.
  inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  grep -rqsF --include=build.ninja --include=flags.make -- "$inc" "$build_dir" ||
    die "the extension in $build_dir was not compiled against $py's headers ($inc)"
}

# check_installed VENV_PYTHON: the package is the venv's, and it works without PYTHONPATH.
check_installed() {
  local py=$1 venv where
  venv=$(dirname "$(dirname "$py")")
  where=$(cd "$work" && env -u PYTHONPATH "$py" -c 'import kvoffload; print(kvoffload.__file__)')
  [[ $where == "$venv"/lib/python3*/site-packages/kvoffload/__init__.py ]] ||
    die "import kvoffload found $where, not the package installed in $venv"
  # Typed (PEP 561): the marker and the stubs of the extension come with the package.
  local f
  for f in py.typed _kvoffload.pyi __init__.pyi; do
    [[ -f $(dirname "$where")/$f ]] || die "the package installed in $venv lacks $f"
  done
  (cd "$work" && env -u PYTHONPATH "$py" -c '
import kvoffload
m = kvoffload.Manager(8, policy="arc")
assert m.prepare_store([1, 2]).ok
print("kvoffload", kvoffload.__version__, "backends:", [b.name for b in kvoffload.list_backends() if b.built])
') || die "the installed package does not work with $py"
  env -u PYTHONPATH "$venv/bin/kvoffload" version --json >/dev/null ||
    die "the kvoffload console script of $venv does not run"
}

step "venv of /usr/bin/python3 (Debian's packages visible)"
/usr/bin/python3 -m venv --system-site-packages "$work/debian"
install_into "$work/debian/bin/python"
check_installed "$work/debian/bin/python"
if [[ -n ${KVOFFLOAD_VLLM_SRC:-} ]]; then
  step "vLLM spec and manager tests against the installed package ($KVOFFLOAD_VLLM_SRC)"
  env -u PYTHONPATH "$work/debian/bin/python" -m pytest -q -p no:cacheprovider \
    python/tests/test_vllm_spec.py python/tests/test_vllm_manager.py ||
    die "the vLLM tests fail against the pip-installed package"
fi

first=$(command -v python3 || true)
if [[ -n $first ]] && ! [[ $(readlink -f "$first") -ef /usr/bin/python3 ]] &&
   "$first" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
  real=$("$first" -c 'import sys; print(sys.executable)')
  step "venv of the first python3 on PATH: $real"
  "$real" -m venv "$work/path"
  install_into "$work/path/bin/python"
  check_installed "$work/path/bin/python"
else
  step "the first python3 on PATH is /usr/bin/python3 (or older than 3.10): nothing more to check"
fi
step "ok"
