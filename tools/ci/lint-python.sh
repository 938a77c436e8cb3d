#!/usr/bin/env bash
# Lints every Python file of the repository (python/, tools/, tests/) with pyflakes: unused and
# undefined names, redefinitions, imports that shadow. The ctest python_lint (label cpu) runs it,
# so `tools/test.sh` and .ci/run fail on a finding. pyflakes3 is a Debian package that
# tools/setup/install-deps.sh installs.
#   tools/ci/lint-python.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
pyflakes=$(command -v pyflakes3 || true)
if [[ -z $pyflakes ]]; then
  echo "lint-python: pyflakes3 is not installed (run tools/setup/install-deps.sh)" >&2
  exit 1
fi
mapfile -t files < <(find python tools tests -name '*.py' -not -path '*/__pycache__/*' | sort)
if ((${#files[@]} == 0)); then
  echo "lint-python: no Python files found under python/, tools/, tests/" >&2
  exit 1
fi
"$pyflakes" "${files[@]}"
echo "lint-python: ${#files[@]} files clean"
