#!/usr/bin/env bash
# Each public header compiles on its own: one translation unit per header of core/include/kvoffload
# (and the generated version.hpp) that includes it twice (its include guard too) and nothing else,
# syntax only, with only the public include directories on the path, so a header that leans on an
# include its users happen to make first, or on a third-party header, fails here naming itself. The
# C headers (.h: the C API) compile as C99 as well.
#   tools/ci/check-headers.sh BUILD_DIR [REGEX]   (ctest runs it as public_headers; REGEX: only the
#                                                 headers whose name matches)
set -euo pipefail
build=$(cd "${1:?usage: check-headers.sh BUILD_DIR}" && pwd)
cd "$(dirname "$0")/../.."
cache=$build/CMakeCache.txt
[[ -f $cache ]] || { echo "check-headers: $build is not a configured build dir" >&2; exit 2; }
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache")
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$cache")
generated=$build/generated/include
[[ -f $generated/kvoffload/version.hpp ]] || { echo "check-headers: no $generated/kvoffload/version.hpp (configure $build)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/kvoffload-check-headers.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One job per header and language: "lang header".
jobs=()
for h in core/include/kvoffload/*.hpp core/include/kvoffload/*.h "$generated"/kvoffload/*.hpp; do
  name=$(basename "$h")
  [[ $name =~ ${2:-.} ]] || continue
  jobs+=("c++ $name")
  [[ $name == *.h ]] && jobs+=("c $name")
done

check() {
  local lang=$1 name=$2 compiler std
  if [[ $lang == c ]]; then compiler=$cc std=-std=c99; else compiler=$cxx std=-std=c++20; fi
  # The typedef keeps a C translation unit of a macro-only header from being empty (-Wpedantic).
  printf '#include <kvoffload/%s>\n#include <kvoffload/%s>\ntypedef int check_headers_tu;\n' \
    "$name" "$name" >"$work/$lang-$name.in"
  if ! "$compiler" "$std" -x "$lang" -fsyntax-only -Wall -Wextra -Wpedantic -Werror \
      -I "$PWD/core/include" -I "$generated" "$work/$lang-$name.in" 2>"$work/$lang-$name.err"; then
    echo "check-headers: kvoffload/$name does not compile on its own ($lang):" \
      "$(grep -m1 -E 'error' "$work/$lang-$name.err" || head -c 300 "$work/$lang-$name.err")"
    return 1
  fi
}
export -f check
export cc cxx work generated
# shellcheck disable=SC2016  # $0 and $1 are the inner bash's arguments
printf '%s\n' "${jobs[@]}" | xargs -P "${KVOFFLOAD_CHECK_JOBS:-$(nproc)}" -L1 bash -c 'check "$0" "$1"' \
  >"$work/report" || true
cat "$work/report"
failed=$(grep -c . "$work/report" || true)
echo "check-headers: ${#jobs[@]} header compiles (C++20, and C99 for the C headers), $failed failed"
((failed == 0))
