#!/usr/bin/env bash
# Installs everything kvoffload needs from Debian 12 packages. Idempotent: a second run changes nothing.
# The CUDA toolkit is not a Debian package; it is used when present at /usr/local/cuda (or $CUDA_HOME).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  pybind11-dev python3-dev python3-pytest python3-numpy
  python3-typing-extensions python3-prometheus-client   # imported by vLLM's modules (python/tests)
  python3-pip python3-venv python3-setuptools python3-wheel python3-pybind11   # `pip install .`
  clang-tidy clang-format
  hipcc libamdhip64-dev
  libhiredis-dev libmemcached-dev libxxhash-dev redis-server redis-tools memcached
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
