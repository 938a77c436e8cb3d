#!/usr/bin/env bash
# clang-format over every tracked C, C++, CUDA and HIP source of the tree (.clang-format at the
# root). `tools/ci/format.sh` rewrites the files; `tools/ci/format.sh --check` changes nothing and
# fails, naming each file and line, when any file differs from the style (CI runs this).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=(-i)
if [[ ${1:-} == --check ]]; then
  mode=(--dry-run --Werror)
fi
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp' '*.cu')
if ((${#files[@]} == 0)); then
  echo "format.sh: no sources found" >&2
  exit 1
fi
clang-format "${mode[@]}" "${files[@]}"
if [[ ${1:-} == --check ]]; then
  echo "format.sh: ${#files[@]} files match .clang-format ($(clang-format --version | head -1))"
fi
