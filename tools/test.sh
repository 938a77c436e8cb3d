#!/usr/bin/env bash
# Builds and runs every test from a fresh clone: dependencies, the CPU preset, ctest (label cpu)
# and the Python tests against Debian's /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)"
ctest --preset cpu
if [[ -d python/tests ]] && compgen -G "build/cpu/python/kvoffload*.so" >/dev/null; then
  PYTHONPATH="$PWD/build/cpu/python" KVOFFLOAD_TEST_BIN_DIR="$PWD/build/cpu/bin" \
    /usr/bin/python3 -m pytest -q python/tests
fi
