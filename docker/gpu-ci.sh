#!/usr/bin/env bash
# Entry point of the GPU CI containers (docker/cuda.Dockerfile, docker/rocm.Dockerfile):
# checks that a GPU and enough shared memory are visible, then runs the gpu-labelled tests and the
# transfer benchmark of the tree built into the image.
#
#   docker/gpu-ci.sh cuda|hip [extra transfer_bench arguments...]
#
# Environment: KVOFFLOAD_REQUIRE_GPU=0 lets it run without a device (the gpu tests then skip
# themselves); KVOFFLOAD_SKIP_BENCH=1 skips the benchmark.
set -euo pipefail

preset=${1:?usage: gpu-ci.sh cuda|hip [transfer_bench arguments...]}
shift
build="build/${preset}"

if [[ ${KVOFFLOAD_REQUIRE_GPU:-1} == 1 ]]; then
  case "${preset}" in
    cuda)
      if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu-ci: no NVIDIA GPU visible; run the container with --gpus all" \
             "(NVIDIA Container Toolkit), or set KVOFFLOAD_REQUIRE_GPU=0" >&2
        exit 2
      fi
      nvidia-smi -L
      ;;
    hip)
      if [[ ! -e /dev/kfd ]]; then
        echo "gpu-ci: /dev/kfd is missing; run the container with --device /dev/kfd" \
             "--device /dev/dri --group-add video, or set KVOFFLOAD_REQUIRE_GPU=0" >&2
        exit 2
      fi
      rocm-smi --showproductname 2>/dev/null || true
      ;;
    *) echo "gpu-ci: unknown preset '${preset}' (cuda or hip)" >&2; exit 2 ;;
  esac
fi

# Docker's default /dev/shm is 64 MiB: the region tests and the benchmark need far more.
shm_free=$(df --output=avail -B1 /dev/shm | tail -1)
if (( shm_free < 2 * 1024 * 1024 * 1024 )); then
  echo "gpu-ci: /dev/shm has only ${shm_free} bytes free; run with --ipc=host or --shm-size=16g" >&2
  exit 2
fi

if [[ -x "${build}/bin/kvoffload" ]]; then
  "${build}/bin/kvoffload" probe || true
fi

ctest --test-dir "${build}" -L gpu --output-on-failure

if [[ ${KVOFFLOAD_SKIP_BENCH:-0} != 1 ]]; then
  bench="${build}/bin/transfer_bench"
  if [[ ! -x "${bench}" ]]; then
    echo "gpu-ci: ${bench} was not built" >&2
    exit 1
  fi
  "${bench}" --benchmark_counters_tabular=true "$@"
fi
