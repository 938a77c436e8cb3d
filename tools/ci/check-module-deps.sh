#!/usr/bin/env bash
# A GPU backend module must load beside an engine's own GPU runtime (issue 25, item 5): the CUDA
# module links the CUDA runtime statically, so `readelf -d` lists no libcudart among what it
# needs (only the driver, libcuda.so.1, is opened at run time, by the runtime itself).
#   tools/ci/check-module-deps.sh MODULE.so...
set -euo pipefail
status=0
for module in "$@"; do
  [[ -f $module ]] || { echo "check-module-deps: $module does not exist" >&2; status=1; continue; }
  needed=$(readelf -d "$module" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  case $(basename "$module") in
    libkvoffload_cuda.so)
      if grep -E '^libcudart\.so' <<<"$needed" >/dev/null; then
        echo "check-module-deps: $module needs $(grep -E '^libcudart' <<<"$needed" | tr '\n' ' ')(link CUDA::cudart_static):" >&2
        echo "$needed" | sed 's/^/  /' >&2
        status=1
      else
        echo "check-module-deps: $module needs no libcudart ($(tr '\n' ' ' <<<"$needed"))"
      fi
      ;;
    *) echo "check-module-deps: $module needs: $(tr '\n' ' ' <<<"$needed")" ;;
  esac
done
exit $status
