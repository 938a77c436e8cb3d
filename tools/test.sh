#!/usr/bin/env bash
# Builds and runs every test from a fresh clone: dependencies, the CPU preset, ctest (label cpu)
# and the Python tests against Debian's /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)"
ctest --preset cpu
# The Python package is build/cpu/python/kvoffload/ (__init__.py + the _kvoffload extension).
if [[ -d python/tests ]]; then
  if ! compgen -G "build/cpu/python/kvoffload/_kvoffload*.so" >/dev/null; then
    echo "test.sh: the Python module was not built (build/cpu/python/kvoffload/_kvoffload*.so)" >&2
    exit 1
  fi
  PYTHONPATH="$PWD/build/cpu/python" KVOFFLOAD_TEST_BIN_DIR="$PWD/build/cpu/bin" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests
fi
