#!/usr/bin/env bash
# The main job from a fresh clone: install dependencies, build the program, then probe the
# machine and run the end-to-end offload cycle. On a machine with a GPU (an NVIDIA or AMD device
# node) it builds the gpu-auto preset, so `kvoffload run --backend auto` keeps the KV caches on
# the GPU; elsewhere the CPU preset (host backend). Extra arguments go to `kvoffload run` (try
# --help), e.g.
#   tools/main.sh --world-size 4 --duration 20 --file-tier /var/tmp/kvtier
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup/install-deps.sh
preset=cpu
if [[ -e /dev/nvidiactl || -e /dev/kfd ]]; then preset=gpu-auto; fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j"$(nproc)" --target kvoffload_cli
"./build/$preset/bin/kvoffload" probe
exec "./build/$preset/bin/kvoffload" run "$@"
