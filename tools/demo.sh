#!/usr/bin/env bash
# What the main job runs once the build exists: the machine probe, then one process creates a
# region and fills its slots while a second process joins it and checks every byte.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./build/cpu/bin/kvoffload
shm_dir=${KVOFFLOAD_SHM_DIR:-/dev/shm}
engine="demo-$$"
"$bin" probe --shm-dir "$shm_dir"
"$bin" region create --engine-id "$engine" --chunks 256 --slot-bytes 256K --world-size 1 --rank 0 \
  --shm-dir "$shm_dir" --fill 0xA5 --hold 3 &
creator=$!
sleep 1
"$bin" region create --engine-id "$engine" --chunks 256 --slot-bytes 256K --world-size 1 --rank 0 \
  --shm-dir "$shm_dir" --check 0xA5
wait "$creator"
"$bin" region clean --shm-dir "$shm_dir" --engine-id "$engine"
