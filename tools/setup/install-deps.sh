#!/usr/bin/env bash
# Installs everything kvoffload needs from Debian 12 packages: every preset (cpu, cuda, hip,
# gpu-auto, asan, tsan, tidy), the plain `cmake -S . -B build` and `.ci/run`. Idempotent: a second
# run changes nothing. The CUDA toolkit is not a Debian package; it is used when present at
# /usr/local/cuda (or $CUDA_HOME).
#
#   tools/setup/install-deps.sh           # install what is missing, saying what it does
#   tools/setup/install-deps.sh --list    # print the package list (one per line) and exit
#   tools/setup/install-deps.sh --no-hip  # without Debian's HIP toolchain (images that bring ROCm,
#                                         # or CUDA-only images)
#
# Another apt or dpkg running (unattended-upgrades on a fresh machine, a second terminal) is
# waited for, up to KVOFFLOAD_APT_WAIT seconds (default 900), instead of failing.
#
# This list is the one source of truth: .ci/run checks that every file the builds read from a
# Debian package belongs to a package installed through it (tools/setup/check-build-packages.py).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  pybind11-dev python3-dev python3-pytest python3-numpy
  python3-typing-extensions python3-prometheus-client   # imported by vLLM's modules (python/tests)
  python3-pip python3-venv python3-setuptools python3-wheel python3-pybind11   # `pip install .`
  clang-tidy clang-format
  hipcc libamdhip64-dev librocprim-dev
  libhiredis-dev libmemcached-dev libxxhash-dev redis-server redis-tools memcached
  libssl-dev openssl   # TLS to Redis (rediss://); the TLS tests make their certificates with openssl
  sasl2-bin            # saslpasswd2: the memcached SASL test writes its server's sasldb
  libcpp-httplib-dev python3-prometheus-client
  pyflakes3   # the Python linter (tools/ci/lint-python.sh, ctest python_lint)
  # vLLM's engine loop under the vLLM harness (tools/vllm-engine-tests.sh): what vLLM's import
  # chain uses for real (the harness's env.sh lists them), and xxhash for its xxhash block hashes
  python3-cachetools python3-cbor2 python3-regex python3-psutil python3-zmq python3-cloudpickle
  python3-tqdm python3-requests python3-cpuinfo python3-packaging python3-pil python3-aiohttp
  python3-uvloop python3-xxhash
  python3-filelock   # vllm/model_executor/model_loader/weight_utils.py, on the Scheduler's import chain
  python3-torch   # SGLang's host pools and controller in python/tests_sglang (real tensors)
)
# Debian's HIP toolchain: the hip preset, and gpu-auto where hipcc exists. rocPRIM is header-only
# and needed by the HIP kernels (rocprim::block_scan).
hip_packages=(hipcc libamdhip64-dev librocprim-dev)

mode=install
skip_hip=0
for arg in "$@"; do
  case $arg in
    --list) mode=list ;;
    --no-hip) skip_hip=1 ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install-deps: unknown argument '$arg' (use --list, --no-hip or --help)" >&2
      exit 2
      ;;
  esac
done

if ((skip_hip)); then
  kept=()
  for p in "${packages[@]}"; do
    [[ " ${hip_packages[*]} " == *" $p "* ]] || kept+=("$p")
  done
  packages=("${kept[@]}")
fi

if [[ $mode == list ]]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

say() { echo "install-deps: $*"; }

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  say "all ${#packages[@]} packages already installed"
  exit 0
fi

say "${#missing[@]} of ${#packages[@]} packages missing: ${missing[*]}"
SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
wait_limit=${KVOFFLOAD_APT_WAIT:-900}
started=$SECONDS

# Runs an apt-get command; while another apt/dpkg holds its locks, says who and waits. dpkg's own
# lock wait (DPkg::Lock::Timeout) covers the install step, but `apt-get update` takes the lists
# lock without waiting, so the retry loop is the one mechanism for both.
apt_run() {
  local what=$1
  shift
  local log
  log=$(mktemp)
  local waited=0
  while :; do
    if "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=60 "$@" >"$log" 2>&1; then
      # dpkg's progress counter is one long line of carriage returns: keep what it did.
      tr '\r' '\n' <"$log" | grep -v -e '^debconf: ' -e 'Reading database' -e '^$' || true
      rm -f "$log"
      return 0
    fi
    if grep -q -e 'Could not get lock' -e 'Unable to lock' -e 'Unable to acquire the dpkg frontend lock' "$log"; then
      if ((SECONDS - started >= wait_limit)); then
        cat "$log" >&2
        say "gave up after ${wait_limit} s waiting for another apt/dpkg (KVOFFLOAD_APT_WAIT)" >&2
        rm -f "$log"
        return 1
      fi
      local holder
      holder=$(grep -o 'held by process [0-9]* ([^)]*)' "$log" | head -1)
      if ((waited % 30 == 0)); then
        say "$what: waiting for another apt/dpkg to finish${holder:+ ($holder)}"
      fi
      sleep 5
      waited=$((waited + 5))
      continue
    fi
    cat "$log" >&2
    rm -f "$log"
    say "$what failed (apt-get $*)" >&2
    return 1
  done
}

say "updating the package lists (apt-get update)"
apt_run "apt-get update" update -qq
say "installing ${missing[*]} (apt-get install --no-install-recommends)"
apt_run "apt-get install" install -y -qq --no-install-recommends "${missing[@]}"
say "installed ${#missing[@]} package(s) in $((SECONDS - started)) s"
