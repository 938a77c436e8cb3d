# GPU CI container for the HIP backend on ROCm (see docker/README.md).
# The image build compiles kvoffload with the `hip` preset through CMake's HIP language (a full
# ROCm install has what Debian's packaging lacks); `docker run` on an AMD GPU host then runs the
# gpu-labelled tests and the transfer benchmark (docker/gpu-ci.sh).
#
#   docker build -f docker/rocm.Dockerfile -t kvoffload-rocm .
#   docker run --rm --device /dev/kfd --device /dev/dri --group-add video --ipc=host \
#     --ulimit memlock=-1 kvoffload-rocm
#
# ROCm >= 7.1 has hipMemcpyBatchAsync (used when present); older images build and use the
# per-copy loop.
ARG ROCM_IMAGE=rocm/dev-ubuntu-24.04:7.1
FROM ${ROCM_IMAGE}

# gfx90a (MI200), gfx942 (MI300).
ARG HIP_ARCHITECTURES="gfx90a;gfx942"

# The packages of tools/setup/install-deps.sh (the one list; Ubuntu 24.04 has them under the
# same names), without Debian's HIP toolchain (--no-hip): ROCm provides HIP and rocPRIM.
ENV DEBIAN_FRONTEND=noninteractive
COPY tools/setup/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --no-hip && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh

ENV ROCM_PATH=/opt/rocm
ENV PATH=/opt/rocm/bin:${PATH}
WORKDIR /src/kvoffload
COPY . .
RUN cmake --preset hip \
      -DCMAKE_PREFIX_PATH=/opt/rocm \
      -DCMAKE_HIP_COMPILER=/opt/rocm/llvm/bin/clang++ \
      -DKVOFFLOAD_HIP_ARCHITECTURES="${HIP_ARCHITECTURES}" \
 && cmake --build --preset hip

CMD ["docker/gpu-ci.sh", "hip"]
