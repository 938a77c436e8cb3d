#!/usr/bin/env bash
# The main job from a fresh clone: install dependencies, build the program (CPU preset; the CUDA
# and HIP backends too where their toolchains exist, see README), then probe the machine and run
# the end-to-end offload cycle. Extra arguments go to `kvoffload run` (try --help), e.g.
#   tools/main.sh --world-size 4 --duration 20 --backend auto --file-tier /var/tmp/kvtier
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)" --target kvoffload_cli
./build/cpu/bin/kvoffload probe
exec ./build/cpu/bin/kvoffload run "$@"
