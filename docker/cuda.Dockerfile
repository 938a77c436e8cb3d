# GPU CI container for the CUDA backend (see docker/README.md).
# The image build compiles kvoffload with the `cuda` preset (no GPU needed for that); `docker run`
# on a GPU host then runs the gpu-labelled tests and the transfer benchmark (docker/gpu-ci.sh).
#
#   docker build -f docker/cuda.Dockerfile -t kvoffload-cuda .
#   docker run --rm --gpus all --ipc=host kvoffload-cuda
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

# sm_80 (A100) and sm_90 (H100/H200); PTX of the newest is embedded for later GPUs.
ARG CUDA_ARCHITECTURES="80;90"

# The Debian/Ubuntu packages of tools/setup/install-deps.sh, less the HIP ones (hipcc,
# libamdhip64-dev) and the linters; CMake >= 3.25 comes with Ubuntu 24.04.
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git \
      libgtest-dev libgmock-dev googletest libbenchmark-dev \
      libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev \
      pybind11-dev python3-dev python3-pytest python3-numpy \
 && rm -rf /var/lib/apt/lists/*

ENV CUDA_HOME=/usr/local/cuda
WORKDIR /src/kvoffload
COPY . .
RUN cmake --preset cuda \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
      -DKVOFFLOAD_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build --preset cuda

CMD ["docker/gpu-ci.sh", "cuda"]
