#!/usr/bin/env bash
# tools/gpu-smoke.sh --check-deps-only, as CI runs it (issue 25, item 3): every package the build
# needs is checked before anything is built, including cpp-httplib and what its .pc requires,
# libsasl2 (libmemcached's .pc requires it) and pkg-config; --no-exporter drops cpp-httplib's
# part, --no-remote-tier the remote tier's (hiredis, libmemcached, libsasl2, xxhash), --minimal
# both; the configure it would run has -DKVOFFLOAD_WERROR=OFF and the options chosen.
#
#   gpu_smoke_deps_test.sh SOURCE_DIR WORK_DIR
set -uo pipefail
src=${1:?usage: gpu_smoke_deps_test.sh SOURCE_DIR WORK_DIR}
work=${2:?usage: gpu_smoke_deps_test.sh SOURCE_DIR WORK_DIR}
smoke=$src/tools/gpu-smoke.sh
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
# expect WHAT RC OUTPUT: the run's exit status was RC.
expect_rc() { [[ $2 == "$3" ]] || fail "$1: exit $3, expected $2; output:"$'\n'"$4"; }
has() { grep -qF -- "$3" <<<"$2" || fail "$1: output lacks '$3':"$'\n'"$2"; }
lacks() { ! grep -qF -- "$3" <<<"$2" || fail "$1: output has '$3':"$'\n'"$2"; }
rm -rf "$work" && mkdir -p "$work" || exit 1

# This machine: CI installs every package (tools/setup/install-deps.sh). A backend whose compiler
# is not installed is reported missing, by name.
for backend in cuda hip; do
  compiler=nvcc
  [[ $backend == hip ]] && compiler=hipcc
  have=0
  if command -v $compiler >/dev/null || [[ $backend == cuda && -x /usr/local/cuda/bin/nvcc ]]; then
    have=1
  fi
  out=$(env -u CMAKE_PREFIX_PATH "$smoke" --check-deps-only "$work/$backend" $backend 2>&1)
  rc=$?
  if ((have)); then
    expect_rc "$backend here" 0 $rc "$out"
    has "$backend here" "$out" "build dependencies found"
    has "$backend here" "$out" "would configure: cmake --preset $backend -DKVOFFLOAD_WERROR=OFF"
    has "$backend here" "$out" "-DKVOFFLOAD_EXPORTER=ON -DKVOFFLOAD_REMOTE_TIER=ON"
  else
    expect_rc "$backend here, no $compiler" 2 $rc "$out"
    has "$backend here, no $compiler" "$out" "$compiler ("
  fi
  [[ -f $work/$backend/summary.txt ]] || fail "$backend here: no summary.txt in OUT_DIR"
done

# A machine without the packages (no system prefixes, no CMAKE_PREFIX_PATH): all named, with the
# Debian packages to fetch, and nothing built.
out=$(KVOFFLOAD_SMOKE_SYSTEM_PREFIXES='' env -u CMAKE_PREFIX_PATH "$smoke" --check-deps-only "$work/bare" cuda 2>&1)
expect_rc "bare machine" 2 $? "$out"
for what in "missing build dependencies, nothing was built" "spdlog (libspdlog-dev" "hiredis (" \
  "libmemcached (" "libsasl2 (libmemcached.pc requires it) (libsasl2-dev" "libcrypto" \
  "xxhash (" "cpp-httplib (the exporter" "libcpp-httplib-dev" "zlib (cpp-httplib.pc requires it)" \
  "Brotli (" "libbrotli-dev" "OpenSSL (cpp-httplib.pc requires it)"; do
  has "bare machine" "$out" "$what"
done
lacks "bare machine" "$out" "would configure"
out=$(KVOFFLOAD_SMOKE_SYSTEM_PREFIXES='' env -u CMAKE_PREFIX_PATH "$smoke" --check-deps-only --no-exporter "$work/bare-noexp" cuda 2>&1)
expect_rc "bare machine, --no-exporter" 2 $? "$out"
has "bare machine, --no-exporter" "$out" "libsasl2 ("
lacks "bare machine, --no-exporter" "$out" "cpp-httplib"
lacks "bare machine, --no-exporter" "$out" "Brotli"
has "bare machine, --no-exporter" "$out" "hiredis (the remote tier"
out=$(KVOFFLOAD_SMOKE_SYSTEM_PREFIXES='' env -u CMAKE_PREFIX_PATH "$smoke" --check-deps-only --no-remote-tier "$work/bare-noremote" cuda 2>&1)
expect_rc "bare machine, --no-remote-tier" 2 $? "$out"
for what in "hiredis" "libmemcached" "libsasl2" "xxhash" "libcrypto" "the remote tier's TLS"; do
  lacks "bare machine, --no-remote-tier" "$out" "$what"
done
has "bare machine, --no-remote-tier" "$out" "spdlog (libspdlog-dev"
has "bare machine, --no-remote-tier" "$out" "cpp-httplib (the exporter"
has "bare machine, --no-remote-tier" "$out" "OpenSSL (cpp-httplib.pc requires it)"
out=$(KVOFFLOAD_SMOKE_SYSTEM_PREFIXES='' env -u CMAKE_PREFIX_PATH "$smoke" --check-deps-only --minimal "$work/bare-minimal" cuda 2>&1)
expect_rc "bare machine, --minimal" 2 $? "$out"
for what in "hiredis" "libsasl2" "xxhash" "cpp-httplib" "OpenSSL" "Brotli" "zlib"; do
  lacks "bare machine, --minimal" "$out" "$what"
done
has "bare machine, --minimal" "$out" "CLI11 (libcli11-dev"

# The packages under CMAKE_PREFIX_PATH (extracted .debs): found there. /usr stands in for it.
out=$(KVOFFLOAD_SMOKE_SYSTEM_PREFIXES='' CMAKE_PREFIX_PATH=/usr "$smoke" --check-deps-only --no-exporter "$work/prefix" cuda 2>&1)
lacks "packages under CMAKE_PREFIX_PATH" "$out" "hiredis ("
has "packages under CMAKE_PREFIX_PATH" "$out" "-DKVOFFLOAD_EXPORTER=OFF -DKVOFFLOAD_REMOTE_TIER=ON"
out=$(KVOFFLOAD_SMOKE_SYSTEM_PREFIXES='' CMAKE_PREFIX_PATH=/usr "$smoke" --check-deps-only --minimal "$work/prefix-minimal" cuda 2>&1)
has "--minimal, packages under CMAKE_PREFIX_PATH" "$out" "-DKVOFFLOAD_EXPORTER=OFF -DKVOFFLOAD_REMOTE_TIER=OFF"

# Usage errors.
out=$("$smoke" --check-deps-only "$work/nobackend" 2>&1)
expect_rc "--check-deps-only without a backend" 2 $? "$out"
has "--check-deps-only without a backend" "$out" "needs the backend"
out=$("$smoke" --bogus "$work/bogus" cuda 2>&1)
expect_rc "unknown option" 2 $? "$out"
has "unknown option" "$out" "unknown option '--bogus'"

((fails == 0)) && echo "gpu-smoke dependency checks: ok"
exit $((fails > 0))
