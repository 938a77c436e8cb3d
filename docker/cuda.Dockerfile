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

# The packages of tools/setup/install-deps.sh (the one list; Ubuntu 24.04 has them under the
# same names), without Debian's HIP toolchain (--no-hip): this image is for CUDA.
ENV DEBIAN_FRONTEND=noninteractive
COPY tools/setup/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --no-hip && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh

ENV CUDA_HOME=/usr/local/cuda
WORKDIR /src/kvoffload
COPY . .
RUN cmake --preset cuda \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
      -DKVOFFLOAD_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build --preset cuda

CMD ["docker/gpu-ci.sh", "cuda"]
