#!/usr/bin/env bash
# The main job from a fresh clone: install dependencies, build (CPU preset), run the end-to-end
# offload cycle. Extra arguments go to `kvoffload run` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)"
exec ./tools/demo.sh "$@"
