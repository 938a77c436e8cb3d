#!/usr/bin/env bash
# One script for a GPU host, CUDA or ROCm: checks the build's dependencies (and names any that are
# missing before building anything), builds the matching preset, runs the gpu-labelled tests
# (plus compute-sanitizer memcheck on the GPU runtime suite where the toolkit has it), the
# transfer benchmark for that backend and `kvoffload run --backend <gpu> --world-size 2` while
# recording which processes hold a context on which GPU, and writes logs and JSON under OUT_DIR
# (at most eight files, none in subfolders). Sized for under 8 minutes on a 16-core machine.
#
#   tools/gpu-smoke.sh [--check-deps-only] [--no-exporter] [--no-remote-tier] [--minimal] OUT_DIR [cuda|hip]
#
# --check-deps-only: check the dependencies, print the configure command it would run, build
# nothing (CI runs it: the gpu_smoke_deps ctest). --no-exporter: build without the `kvoffload
# exporter` subcommand (-DKVOFFLOAD_EXPORTER=OFF), so cpp-httplib and what its .pc requires
# (OpenSSL, zlib, Brotli) are not needed. --no-remote-tier: build without the Redis/memcached tier
# (-DKVOFFLOAD_REMOTE_TIER=OFF), so hiredis, libmemcached, the libsasl2 and libcrypto its .pc
# requires, and libxxhash are not needed. --minimal: both (then neither pkg-config nor OpenSSL
# is needed either). The backend is detected when not given (not with --check-deps-only, which
# needs no GPU: give it).
#
# OUT_DIR may be relative: it is resolved against the directory the script was started from.
# Dependencies may come from extracted .deb files: point CMAKE_PREFIX_PATH at the prefix (e.g.
# /opt/kvo-deps/usr: `apt-get download` the .debs, `dpkg-deb -x` each there); its bin/ goes on PATH
# and its pkg-config files are relocated to it. The build runs with -DKVOFFLOAD_WERROR=OFF: the
# GPU host's compiler is not CI's, and a warning it adds must not stop the one run it gets.
#
# Environment: KVOFFLOAD_SMOKE_ARCH (CUDA architectures, default: the device's own, e.g. 90),
# KVOFFLOAD_SMOKE_BENCH_FILTER (a transfer_bench filter, default: docs/PERFORMANCE.md's cases),
# KVOFFLOAD_SMOKE_SYSTEM_PREFIXES (where the system's packages are, default "/usr /usr/local";
# the dependency check's own test empties it).
set -uo pipefail

check_only=0
exporter=ON
remote_tier=ON
while [[ ${1:-} == --* ]]; do
  case $1 in
    --check-deps-only) check_only=1 ;;
    --no-exporter) exporter=OFF ;;
    --no-remote-tier) remote_tier=OFF ;;
    --minimal) exporter=OFF remote_tier=OFF ;;
    *)
      echo "gpu-smoke: unknown option '$1' (--check-deps-only, --no-exporter, --no-remote-tier," \
        "--minimal)" >&2
      exit 2
      ;;
  esac
  shift
done
out_arg=${1:?usage: tools/gpu-smoke.sh [--check-deps-only] [--no-exporter] [--no-remote-tier] [--minimal] OUT_DIR [cuda|hip]}
backend=${2:-}
mkdir -p "$out_arg" || exit 2
out=$(cd "$out_arg" && pwd)  # before the cd below: a relative OUT_DIR is the caller's
cd "$(dirname "$0")/.." || exit 2
summary="$out/summary.txt"
: >"$summary"
say() { echo "gpu-smoke: $*" | tee -a "$summary"; }
start=$SECONDS

if [[ -z $backend ]]; then
  if ((check_only)); then
    say "--check-deps-only needs the backend (cuda or hip): it does not look for a GPU"
    exit 2
  elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
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
  *)
    say "unknown backend '$backend' (cuda or hip)"
    exit 2
    ;;
esac
say "backend $backend, $(date -u +%FT%TZ), $(nproc) cores"

# 0. Build dependencies, checked before anything is built. Prefixes: CMAKE_PREFIX_PATH (extracted
# .debs), then the system's. Each line: what, marker files (any, relative to a prefix), the Debian
# packages that provide it (what to download with `apt-get download` into .gpu-deps/).
IFS=: read -r -a prefixes <<<"${CMAKE_PREFIX_PATH:-}"
read -r -a system_prefixes <<<"${KVOFFLOAD_SMOKE_SYSTEM_PREFIXES-/usr /usr/local}"
prefixes+=("${system_prefixes[@]}")
for p in "${prefixes[@]}"; do
  [[ -n $p && -d $p/bin && $p != /usr && $p != /usr/local ]] && PATH="$p/bin:$PATH"
done
export PATH="$PATH:/usr/local/cuda/bin${CUDA_HOME:+:$CUDA_HOME/bin}"
# Every .pc a pkg_check_modules of the build reads, and every .pc those require (pkg-config fails
# on a missing Requires.private too): libmemcached's requires libsasl2 and libcrypto.
mlib=lib/x86_64-linux-gnu
deps=(
  "spdlog|$mlib/cmake/spdlog/spdlogConfig.cmake|libspdlog-dev libspdlog1.10"
  "fmt|$mlib/cmake/fmt/fmt-config.cmake|libfmt-dev libfmt9"
  "CLI11|share/cmake/CLI11/CLI11Config.cmake lib/cmake/CLI11/CLI11Config.cmake|libcli11-dev"
  "nlohmann_json|share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake|nlohmann-json3-dev"
  "GoogleTest|$mlib/cmake/GTest/GTestConfig.cmake|libgtest-dev libgmock-dev googletest"
  "Google Benchmark|$mlib/cmake/benchmark/benchmarkConfig.cmake|libbenchmark-dev libbenchmark1debian"
)
if [[ $remote_tier == ON ]]; then
  deps+=(
    "hiredis (the remote tier; --no-remote-tier builds without it)|$mlib/pkgconfig/hiredis.pc|libhiredis-dev libhiredis0.14"
    "libmemcached (the remote tier)|$mlib/pkgconfig/libmemcached.pc|libmemcached-dev libmemcached11 libmemcachedutil2 libhashkit-dev libhashkit2"
    "libsasl2 (libmemcached.pc requires it)|$mlib/pkgconfig/libsasl2.pc|libsasl2-dev libsasl2-2 libsasl2-modules-db libdb5.3"
    "OpenSSL's libcrypto (libmemcached.pc requires it)|$mlib/pkgconfig/libcrypto.pc|libssl-dev libssl3"
    "xxhash (the remote tier's checksums)|$mlib/pkgconfig/libxxhash.pc|libxxhash-dev libxxhash0"
    "OpenSSL (the remote tier's TLS)|$mlib/pkgconfig/openssl.pc|libssl-dev libssl3"
  )
fi
if [[ $exporter == ON ]]; then
  deps+=(
    "cpp-httplib (the exporter; --no-exporter builds without it)|$mlib/pkgconfig/cpp-httplib.pc|libcpp-httplib-dev libcpp-httplib0.11"
    "OpenSSL (cpp-httplib.pc requires it)|$mlib/pkgconfig/openssl.pc|libssl-dev libssl3"
    "zlib (cpp-httplib.pc requires it)|$mlib/pkgconfig/zlib.pc|zlib1g-dev zlib1g"
    "Brotli (cpp-httplib.pc requires libbrotlicommon, libbrotlidec, libbrotlienc)|$mlib/pkgconfig/libbrotlidec.pc|libbrotli-dev libbrotli1"
  )
fi
missing=()
for d in "${deps[@]}"; do
  IFS='|' read -r what markers debs <<<"$d"
  found=0
  for p in "${prefixes[@]}"; do
    for m in $markers; do
      [[ -n $p && -e $p/$m ]] && found=1
    done
  done
  ((found)) || missing+=("$what ($debs)")
done
tool_missing() { command -v "$1" >/dev/null || missing+=("$2"); }
tool_missing cmake "cmake (cmake >= 3.25)"
tool_missing ninja "ninja (ninja-build)"
tool_missing c++ "a C++20 compiler (g++ or clang++)"
# pkg-config reads the .pc files of the exporter's and the remote tier's packages only.
if [[ $exporter == ON || $remote_tier == ON ]]; then
  command -v pkg-config >/dev/null || command -v pkgconf >/dev/null ||
    missing+=("pkg-config (pkgconf pkgconf-bin libpkgconf3)")
fi
if [[ $backend == cuda ]]; then
  tool_missing nvcc "nvcc (a CUDA toolkit 12.0 or newer under /usr/local/cuda or on PATH)"
else
  tool_missing hipcc "hipcc (ROCm, or Debian's hipcc libamdhip64-dev librocprim-dev)"
fi
# The configure it runs (Python off: the GPU host may lack its dev packages).
build=build/$backend
configure=(cmake --preset "$backend" -DKVOFFLOAD_WERROR=OFF -DKVOFFLOAD_BUILD_PYTHON=OFF
  -DKVOFFLOAD_EXPORTER="$exporter" -DKVOFFLOAD_REMOTE_TIER="$remote_tier")
if ((${#missing[@]} > 0)); then
  say "missing build dependencies, nothing was built:"
  for m in "${missing[@]}"; do say "  $m"; done
  say "carry the Debian packages named above as .debs (apt-get download into .gpu-deps/," \
    "extracted under CMAKE_PREFIX_PATH by the device command), or install them"
  exit 2
fi
say "build dependencies found (prefixes: ${prefixes[*]})"
if ((check_only)); then
  say "would configure: ${configure[*]}"
  exit 0
fi

# pkg-config files of extracted .debs name /usr: copies that name their real prefix.
pkgcfg_dir="$PWD/build/smoke-pkgconfig"
pkg_args=()
rm -rf "$pkgcfg_dir"
for p in "${prefixes[@]}"; do
  [[ -z $p || $p == /usr || $p == /usr/local ]] && continue
  for pc in "$p"/lib/x86_64-linux-gnu/pkgconfig/*.pc "$p"/share/pkgconfig/*.pc; do
    [[ -e $pc ]] || continue
    mkdir -p "$pkgcfg_dir"
    sed -E -e "s#^(prefix|exec_prefix|libdir|includedir)=/usr#\\1=$p#" -e "s#(-[IL])/usr/#\\1$p/#g" \
      "$pc" >"$pkgcfg_dir/$(basename "$pc")"
  done
done
if [[ -d $pkgcfg_dir ]]; then
  export PKG_CONFIG_PATH="$pkgcfg_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  pkg_args=(-DPKG_CONFIG_USE_CMAKE_PREFIX_PATH=OFF)
fi

if [[ $backend == cuda ]]; then
  nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader \
    2>&1 | tee -a "$summary"
  arch=${KVOFFLOAD_SMOKE_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)}
  arch_flag=(-DKVOFFLOAD_CUDA_ARCHITECTURES="${arch:-90}")
else
  arch_flag=()
fi

# 1. Build: only what the checks need.
targets=(kvoffload "kvoffload_$backend" kvoffload_cli transfer_gpu_tests runtime_gpu_tests transfer_bench)
if ! { "${configure[@]}" "${arch_flag[@]}" "${pkg_args[@]}" &&
  cmake --build --preset "$backend" -j"$(nproc)" --target "${targets[@]}"; } >"$out/build.log" 2>&1; then
  say "build FAILED (build.log)"
  tail -30 "$out/build.log"
  exit 1
fi
rm -rf "$pkgcfg_dir"
say "built in $((SECONDS - start)) s"

status=0
# 2. The gpu-labelled suites (transfer engine and GPU runtime on the real device). ctest -V keeps
# every case's verdict in the log: a suite that ran none of its GPU cases (all skipped) fails the
# run, because a green run that tested nothing is what a first GPU run must never be (issue 25).
if ctest --test-dir "$build" -L gpu -V --output-on-failure --timeout 300 >"$out/ctest.log" 2>&1; then
  say "gpu tests passed"
else
  say "gpu tests FAILED (ctest.log)"
  status=1
fi
if cases=$(/usr/bin/python3 tools/ci/gpu_cases.py --backend "$backend" "$out/ctest.log"); then
  say "gpu cases run: ${cases//$'\n'/; }"
else
  say "gpu cases run: ${cases//$'\n'/; } (FAILED: a GPU suite ran no GPU case)"
  status=1
fi
if [[ $backend == cuda ]]; then
  # compute-sanitizer lives in the toolkit's bin/ (CUDA 12+) or its own directory (older).
  sanitizer=$(command -v compute-sanitizer 2>/dev/null)
  nvcc_dir=$(dirname "$(command -v nvcc)")
  for c in "$nvcc_dir/compute-sanitizer" "$nvcc_dir/../compute-sanitizer/compute-sanitizer" \
    ${CUDA_HOME:+"$CUDA_HOME/bin/compute-sanitizer"} /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -z $sanitizer && -x $c ]] && sanitizer=$c
  done
  if [[ -z $sanitizer ]]; then
    say "compute-sanitizer memcheck skipped: not found on PATH or under $nvcc_dir/.. or /usr/local/cuda"
  elif "$sanitizer" --tool memcheck --error-exitcode 1 \
    "$build/tests/runtime/runtime_gpu_tests" --gtest_filter='*Kernel*:*Paths*:*Ring*' >"$out/memcheck.log" 2>&1; then
    # Clean only counts when its cases ran: cases that all skipped are clean and checked nothing.
    if memcheck_cases=$(/usr/bin/python3 tools/ci/gpu_cases.py --backend cuda --suite memcheck "$out/memcheck.log"); then
      say "compute-sanitizer memcheck clean on the kernel cases ($memcheck_cases; $sanitizer)"
    else
      say "compute-sanitizer memcheck FAILED: $memcheck_cases (memcheck.log)"
      status=1
    fi
  else
    say "compute-sanitizer memcheck FAILED (memcheck.log)"
    status=1
  fi
fi
say "tests done at $((SECONDS - start)) s"

# 3. Transfer benchmark for this backend (figures for docs/PERFORMANCE.md), then the 12-CTA kernel case.
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

# 4. The main job on this GPU, two ranks, every byte verified. Meanwhile every GPU context is
# sampled (nvidia-smi --query-compute-apps): each rank must hold one on its own GPU only, and the
# scheduler none, or a context on the wrong GPU shows (issue 16, N1).
"$build/bin/kvoffload" run --backend "$backend" --world-size 2 --duration 10 --host-pool 1G \
  --json >"$out/run.json" 2>>"$summary" &
run_pid=$!
contexts="$out/contexts.csv"
if [[ $backend == cuda ]]; then
  echo "# sample,pid,process_name,gpu_uuid,used_memory (gpu index: uuid below)" >"$contexts"
  nvidia-smi --query-gpu=index,uuid --format=csv,noheader | sed 's/^/# gpu /' >>"$contexts"
  sample=0
  while kill -0 "$run_pid" 2>/dev/null; do
    nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv,noheader 2>/dev/null |
      sed "s/^/$sample,/" >>"$contexts"
    sample=$((sample + 1))
    sleep 0.5
  done
else
  echo "# contexts are sampled on CUDA only (nvidia-smi)" >"$contexts"
fi
if wait "$run_pid"; then
  say "kvoffload run: all verified ($(grep -o '"store_gbps":[0-9.]*' "$out/run.json"), $(grep -o '"load_gbps":[0-9.]*' "$out/run.json"))"
else
  say "kvoffload run FAILED (run.json)"
  status=1
fi
if [[ $backend == cuda ]]; then
  # pid -> the GPUs it held a context on; the scheduler (run_pid) must hold none.
  verdict=$(awk -F', *' -v sched="$run_pid" '
    /^#/ { next }
    { gpus[$2] = gpus[$2] (index(gpus[$2], $4) ? "" : " " $4); seen[$2] = 1 }
    END {
      bad = 0
      for (p in seen) {
        n = split(gpus[p], g, " ")
        if (p == sched) { print "the scheduler (pid " p ") held a context"; bad = 1 }
        else if (n > 1) { print "pid " p " held contexts on " n " GPUs:" gpus[p]; bad = 1 }
      }
      if (!bad) print "ok: " length(seen) " process(es), one GPU each"
    }' "$contexts")
  say "contexts during kvoffload run: $verdict (contexts.csv)"
  [[ $verdict == ok:* ]] || status=1
fi
"$build/bin/kvoffload" probe >>"$summary" 2>&1 || true
say "finished in $((SECONDS - start)) s, status $status"
exit $status
