#!/usr/bin/env bash
# Checks the installed package the way an engine author uses it:
#   1. `cmake --install <build> --prefix <temp>` and the expected files are there, and no test seam
#      or internal header (tools/ci/check-installed-headers.sh);
#   2. examples/ (C++ and C) configured with find_package(kvoffload) against that prefix, built, run;
#   3. a C program built with `pkg-config --cflags --libs kvoffload` only, run;
#   4. the installed `kvoffload` program runs;
#   5. `import kvoffload` from the installed Python package (not the build tree).
# Usage: tools/ci/check-install.sh [BUILD_DIR]   (default build/cpu; it must be built already)
# Env:   KVOFFLOAD_EXAMPLE_BACKEND (default auto), KEEP=1 keeps the temp dir for inspection.
# Fails loudly: the first failing step prints what failed and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
build=${1:-build/cpu}
backend=${KVOFFLOAD_EXAMPLE_BACKEND:-auto}

die() { printf 'check-install: FAILED: %s\n' "$*" >&2; exit 1; }
step() { printf '== check-install: %s\n' "$*"; }

[[ -f $build/CMakeCache.txt ]] || die "$build is not a configured build dir (cmake --preset cpu && cmake --build --preset cpu)"
build=$(cd "$build" && pwd)
[[ -e $build/core/libkvoffload.so ]] || die "$build has no libkvoffload.so: build it first (cmake --build $build)"
python=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
python=${python:-/usr/bin/python3}
pydir=$(sed -n 's/^KVOFFLOAD_PYTHON_INSTALL_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

work=$(mktemp -d "${TMPDIR:-/tmp}/kvoffload-check-install.XXXXXX")
cleanup() { if [[ ${KEEP:-0} == 1 ]]; then echo "kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
prefix=$work/prefix
mkdir -p "$work/shm"

step "install $build into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; die "cmake --install"; }

libdir=$(cd "$prefix" && dirname "$(find . -name 'libkvoffload.so' -print -quit)")
[[ $libdir != . ]] || die "no libkvoffload.so under $prefix"
libdir=${libdir#./}
for f in include/kvoffload/kvoffload.h include/kvoffload/region.hpp include/kvoffload/version.hpp \
         "$libdir/cmake/kvoffload/kvoffloadConfig.cmake" "$libdir/cmake/kvoffload/kvoffloadTargets.cmake" \
         "$libdir/pkgconfig/kvoffload.pc" bin/kvoffload; do
  [[ -e $prefix/$f ]] || die "missing from the install: $f"
done
step "the installed headers are the public API only (tools/ci/check-installed-headers.sh)"
"$src/tools/ci/check-installed-headers.sh" "$prefix/include" || die "a test seam or internal header is installed"

# An installed CUDA module carries its runtime: it must load beside a torch built for another
# CUDA runtime, on a system path without this toolkit's libcudart (issue 25).
for module in "$prefix/$libdir"/libkvoffload_cuda.so; do
  [[ -e $module ]] || continue
  step "the installed $(basename "$module") needs no libcudart (readelf -d)"
  "$src/tools/ci/check-module-deps.sh" "$module" || die "$module links the CUDA runtime dynamically"
done

step "build examples/ against the installed package (find_package(kvoffload))"
cmake -S "$src/examples" -B "$work/example" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/example-configure.log" 2>&1 \
  || { cat "$work/example-configure.log" >&2; die "configuring examples/ with find_package(kvoffload)"; }
cmake --build "$work/example" >"$work/example-build.log" 2>&1 \
  || { cat "$work/example-build.log" >&2; die "building examples/"; }

step "run the C++ example (backend $backend)"
"$work/example/engine_integration" --backend "$backend" --shm-dir "$work/shm" || die "engine_integration"
step "run the C example"
"$work/example/engine_integration_c" "$work/shm" || die "engine_integration_c"
leftover=$(find "$work/shm" -type f | head -n1)
[[ -z $leftover ]] || die "the examples left a region behind: $leftover"

step "pkg-config kvoffload"
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
flags=$(pkg-config --cflags --libs kvoffload) || die "pkg-config --cflags --libs kvoffload"
cat >"$work/pc.c" <<'C'
#include <kvoffload/kvoffload.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  kvo_manager_options o;
  kvo_manager_t* m = NULL;
  if (kvo_manager_options_init(&o) != KVO_OK) return 1;
  if (kvo_manager_create(&o, &m) != KVO_INVALID_ARGUMENT) return 2; /* num_chunks 0 is refused */
  if (strstr(kvo_last_error_message(), "num_chunks") == NULL) return 3;
  printf("pkg-config build: kvoffload %s\n", kvo_version());
  return 0;
}
C
# shellcheck disable=SC2086  # flags are words
cc -std=c99 -Wall -Werror "$work/pc.c" -o "$work/pc" $flags -Wl,-rpath,"$prefix/$libdir" \
  || die "compiling a C program with pkg-config's flags ($flags)"
"$work/pc" || die "the pkg-config-built program"

step "the installed kvoffload program"
"$prefix/bin/kvoffload" version --json || die "$prefix/bin/kvoffload version"

step "import kvoffload from the installed package ($python)"
[[ -n $pydir ]] || die "$build was configured without the Python module (KVOFFLOAD_BUILD_PYTHON=OFF)"
for f in __init__.py py.typed _kvoffload.pyi __init__.pyi; do
  [[ -f $prefix/$pydir/kvoffload/$f ]] || die "missing from the install: $pydir/kvoffload/$f"
done
(cd "$work" && PYTHONPATH="$prefix/$pydir" "$python" - "$prefix" <<'PY') || die "import kvoffload from $prefix/$pydir"
import sys, numpy as np, kvoffload
prefix = sys.argv[1]
assert kvoffload.__file__.startswith(prefix), f"imported {kvoffload.__file__}, not the installed package"
m = kvoffload.Manager(4)
assert m.prepare_store([1, 2]).ok
rt = kvoffload.make_runtime("host")
print(f"python: kvoffload {kvoffload.__version__} from {kvoffload.__file__}")
PY

step "OK: headers, library, CMake package, pkg-config, program and Python module all work installed"
