#!/usr/bin/env bash
# Checks what libkvoffload.so exports (`nm -D --defined-only`): the C API of kvoffload.h (every
# KVO_API function, and no other C symbol) and the public C++ API of include/kvoffload (names in
# namespace kvoffload, with their typeinfo and vtables), nothing internal: no core/src helper
# (kvoffload::capi, ::detail, ::util, anonymous namespaces), no GPU backend or kernel, and no
# third-party or standard-library code instantiated inside the library.
# Usage: tools/ci/check-exports.sh BUILD_DIR   (ctest runs it as library_exports)
set -euo pipefail
build=$(cd "${1:?usage: check-exports.sh BUILD_DIR}" && pwd)
cd "$(dirname "$0")/../.."
lib=$build/core/libkvoffload.so
[[ -e $lib ]] || { echo "check-exports: no $lib (build the kvoffload target)" >&2; exit 2; }

exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | c++filt)
# Symbols every ELF shared object defines.
exported=$(grep -v -x -E '_init|_fini|_edata|_end|__bss_start' <<<"$exported" || true)

bad=$(grep -v -E '^kvo_[a-z0-9_]+$|^((typeinfo|typeinfo name|vtable|VTT) for )?kvoffload::' <<<"$exported" || true)
internal=$(grep -E '(^|[ :(<])kvoffload::(capi|detail|util|cuda|hip|python|run|cli)::|\(anonymous namespace\)' \
           <<<"$exported" || true)
missing=()
# Every function kvoffload.h declares with KVO_API.
while read -r fn; do
  grep -q -x "$fn" <<<"$exported" || missing+=("$fn")
done < <(grep -o -E 'KVO_API [^;]*\b(kvo_[a-z0-9_]+)\(' core/include/kvoffload/kvoffload.h |
         grep -o -E 'kvo_[a-z0-9_]+\($' | tr -d '(' | sort -u)
# A few of the C++ API that engines and the program use (the link of the public-API test suites
# checks the rest).
for sym in 'typeinfo for kvoffload::Error' 'vtable for kvoffload::DeviceRuntime' \
           'kvoffload::Region::create_or_join(kvoffload::RegionOptions const&)' \
           'kvoffload::to_string(kvoffload::ErrorCode)'; do
  grep -q -x -F "$sym" <<<"$exported" || missing+=("$sym")
done

status=0
if [[ -n $bad ]]; then
  echo "check-exports: $lib exports symbols outside the public API:" >&2
  sed 's/^/  /' <<<"$bad" | head -n 40 >&2
  status=1
fi
if [[ -n $internal ]]; then
  echo "check-exports: $lib exports internal symbols:" >&2
  sed 's/^/  /' <<<"$internal" | head -n 40 >&2
  status=1
fi
if ((${#missing[@]} > 0)); then
  echo "check-exports: $lib does not export:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  status=1
fi
if ((status == 0)); then
  echo "check-exports: $(wc -l <<<"$exported") symbols, all public API ($(grep -c '^kvo_' <<<"$exported") C functions)"
fi
exit $status
