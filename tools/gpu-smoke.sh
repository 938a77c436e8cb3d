#!/usr/bin/env bash
# One script for a GPU host, CUDA or ROCm: builds the matching preset, runs the gpu-labelled
# tests (plus compute-sanitizer memcheck on the GPU runtime suite where it exists), the transfer
# benchmark for that backend and `kvoffload run --backend <gpu> --world-size 2`, and writes logs
# and JSON under OUT_DIR (at most eight files, none in subfolders). Sized for under 8 minutes on
# a 16-core machine.
#
#   tools/gpu-smoke.sh OUT_DIR [cuda|hip]        # backend: detected when not given
#
# Environment: KVOFFLOAD_SMOKE_ARCH (CUDA architectures, default: the device's own, e.g. 90),
# KVOFFLOAD_SMOKE_BENCH_FILTER (a transfer_bench filter, default: the README's cases).
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: tools/gpu-smoke.sh OUT_DIR [cuda|hip]}
backend=${2:-}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "gpu-smoke: $*" | tee -a "$summary"; }
start=$SECONDS

if [[ -z $backend ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    backend=cuda
  elif [[ -e /dev/kfd ]]; then
    backend=hip
  else
    say "no GPU found (nvidia-smi -L failed and /dev/kfd is missing)"
    exit 2
  fi
fi
case $backend in
  cuda | hip) ;;
  *) say "unknown backend '$backend' (cuda or hip)"; exit 2 ;;
esac
say "backend $backend, $(date -u +%FT%TZ), $(nproc) cores"
if [[ $backend == cuda ]]; then
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader \
    2>&1 | tee -a "$summary"
  arch=${KVOFFLOAD_SMOKE_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)}
  arch_flag=(-DKVOFFLOAD_CUDA_ARCHITECTURES="${arch:-90}")
else
  arch_flag=()
fi

# 1. Build: only what the checks need, Python off (the GPU host may lack its dev packages).
build=build/$backend
targets=(kvoffload "kvoffload_$backend" kvoffload_cli transfer_gpu_test gpu_runtime_gpu_test transfer_bench)
if ! { cmake --preset "$backend" -DKVOFFLOAD_BUILD_PYTHON=OFF "${arch_flag[@]}" &&
       cmake --build --preset "$backend" -j"$(nproc)" --target "${targets[@]}"; } >"$out/build.log" 2>&1; then
  say "build FAILED (build.log)"
  tail -30 "$out/build.log"
  exit 1
fi
say "built in $((SECONDS - start)) s"

status=0
# 2. The gpu-labelled suites (transfer engine and GPU runtime on the real device).
if ctest --test-dir "$build" -L gpu --output-on-failure --timeout 300 >"$out/ctest.log" 2>&1; then
  say "gpu tests passed ($(grep -c '\[       OK \]' "$out/ctest.log") cases ok, $(grep -c 'SKIPPED \]' "$out/ctest.log") skipped)"
else
  say "gpu tests FAILED (ctest.log)"
  status=1
fi
if [[ $backend == cuda ]] && command -v compute-sanitizer >/dev/null; then
  if compute-sanitizer --tool memcheck --error-exitcode 1 \
       "$build/tests/gpu/gpu_runtime_gpu_test" --gtest_filter='*Kernel*:*Paths*:*Ring*' >"$out/memcheck.log" 2>&1; then
    say "compute-sanitizer memcheck clean on the kernel cases"
  else
    say "compute-sanitizer memcheck FAILED (memcheck.log)"
    status=1
  fi
fi
say "tests done at $((SECONDS - start)) s"

# 3. Transfer benchmark for this backend (figures for the README), then the 12-CTA kernel case.
filter=${KVOFFLOAD_SMOKE_BENCH_FILTER:-"^$backend/"}
if KVOFFLOAD_BENCH_BACKENDS=$backend "$build/bin/transfer_bench" --benchmark_filter="$filter" \
     --benchmark_out="$out/transfer_bench.json" --benchmark_out_format=json \
     --benchmark_counters_tabular=true >"$out/bench.txt" 2>&1 &&
   KVOFFLOAD_BENCH_BACKENDS=$backend KVOFFLOAD_BENCH_KERNEL_CTAS=12 "$build/bin/transfer_bench" \
     --benchmark_filter="^$backend/load/kernel/bytes:(4096|16384)/" --benchmark_counters_tabular=true \
     >>"$out/bench.txt" 2>&1; then
  say "transfer_bench done (bench.txt, transfer_bench.json)"
else
  say "transfer_bench FAILED (bench.txt)"
  status=1
fi
say "bench done at $((SECONDS - start)) s"

# 4. The main job on this GPU, two ranks, every byte verified.
if "$build/bin/kvoffload" run --backend "$backend" --world-size 2 --duration 10 --host-pool 1G \
     --json >"$out/run.json" 2>>"$summary"; then
  say "kvoffload run: all verified ($(grep -o '"store_gbps":[0-9.]*' "$out/run.json"), $(grep -o '"load_gbps":[0-9.]*' "$out/run.json"))"
else
  say "kvoffload run FAILED (run.json)"
  status=1
fi
"$build/bin/kvoffload" probe >>"$summary" 2>&1 || true
say "finished in $((SECONDS - start)) s, status $status"
exit $status
