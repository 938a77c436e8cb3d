#!/usr/bin/env bash
# Builds and runs every test from a fresh clone: dependencies, the CPU preset, ctest (label cpu)
# and the Python tests against Debian's /usr/bin/python3 (the vLLM backend's against vLLM's
# sources in $KVOFFLOAD_VLLM_SRC, default ../shared/vllm-017e9f4448 when it exists).
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
  # The vLLM backend's tests import vLLM's own modules from KVOFFLOAD_VLLM_SRC; next to a checkout
  # in this workplace that is ../shared/vllm-017e9f4448 (.ci/run sets it and insists on it).
  # Without it those tests skip, naming the variable.
  if [[ -z ${KVOFFLOAD_VLLM_SRC:-} && -f ../shared/vllm-017e9f4448/vllm/v1/kv_offload/base.py ]]; then
    export KVOFFLOAD_VLLM_SRC="$(cd ../shared/vllm-017e9f4448 && pwd)"
  fi
  PYTHONPATH="$PWD/build/cpu/python" KVOFFLOAD_TEST_BIN_DIR="$PWD/build/cpu/bin" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests
fi
