#!/usr/bin/env bash
# What the main job runs once the build exists: the machine probe, then one process (an engine
# rank) creates a region and fills its slots while a second process (the scheduler's unranked view)
# joins it and checks every byte; a second rank 0 is refused; then the region is listed, the
# creator released, and whatever this demo left is cleaned. No fixed sleeps: each step waits for
# the previous one's signal.
#   KVOFFLOAD_BIN      the program (default build/cpu/bin/kvoffload)
#   KVOFFLOAD_SHM_DIR  where the region file goes (default /dev/shm)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KVOFFLOAD_BIN:-./build/cpu/bin/kvoffload}
shm_dir=${KVOFFLOAD_SHM_DIR:-/dev/shm}
engine="demo-$$"
region=(--engine-id "$engine" --chunks 256 --slot-bytes 256K --world-size 1 --shm-dir "$shm_dir")
ready_timeout_s=60

if [[ ! -x $bin ]]; then
  echo "demo: $bin not found; build first (cmake --preset cpu && cmake --build --preset cpu)" >&2
  exit 1
fi

work=$(mktemp -d)
creator=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $creator ]] && kill -0 "$creator" 2>/dev/null; then
    kill -TERM "$creator" 2>/dev/null || true   # ends --hold; the creator releases the region
    wait "$creator" 2>/dev/null || true
  fi
  # Anything of this demo's engine left stale (e.g. after a crash) goes; a region in use stays.
  "$bin" region clean --shm-dir "$shm_dir" --engine-id "$engine" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step() { printf '\n== %s\n' "$*"; }

step "probe: what this machine offers"
"$bin" probe --shm-dir "$shm_dir"

step "creator (rank 0): create the region, populate, fill its slots with 0xA5, hold it"
# The creator prints its one-line JSON result after the fill and before the hold, so the line
# appearing is the signal that the bytes are there.
"$bin" region create "${region[@]}" --rank 0 --fill 0xA5 --hold 300 --json >"$work/creator.json" &
creator=$!
deadline=$((SECONDS + ready_timeout_s))
line_complete() { [[ -s $1 && -z $(tail -c1 "$1") ]]; }   # non-empty and ends in a newline
until line_complete "$work/creator.json"; do
  if ! kill -0 "$creator" 2>/dev/null; then
    wait "$creator" && rc=0 || rc=$?
    creator=""
    echo "demo: the creator exited (status $rc) before it was ready" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "demo: the creator was not ready after ${ready_timeout_s}s" >&2
    exit 1
  fi
  sleep 0.05
done
cat "$work/creator.json"

step "joiner (unranked, as the scheduler maps it): join the same memory and check every byte"
"$bin" region create "${region[@]}" --unranked --check 0xA5

step "a second rank 0 while the creator holds it: refused (exit 1), naming the creator's PID"
if "$bin" region create "${region[@]}" --rank 0 2>"$work/second.err"; then
  echo "demo: a second rank 0 was accepted; two writers would share its slots" >&2
  exit 1
fi
cat "$work/second.err"

step "region list: the creator is still attached, and holds rank 0"
"$bin" region list --shm-dir "$shm_dir"

step "release: SIGTERM ends the creator's hold; the last process out removes the file"
kill -TERM "$creator" 2>/dev/null || true   # it may have gone already (e.g. a Ctrl-C reached it)
wait "$creator" && rc=0 || rc=$?
creator=""
if ((rc != 0)); then
  echo "demo: the creator exited with status $rc" >&2
  exit 1
fi
if [[ -e $shm_dir/kvoffload_$engine.region ]]; then
  echo "demo: $shm_dir/kvoffload_$engine.region is still there after the last process left" >&2
  exit 1
fi
echo "released; $shm_dir/kvoffload_$engine.region is gone"

step "clean: nothing of this engine is left to remove"
"$bin" region clean --shm-dir "$shm_dir" --engine-id "$engine"

step "demo done"
