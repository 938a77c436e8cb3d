#!/usr/bin/env bash
# What an installed engine's include path shows: the public API only (docs/DESIGN.md §2.1). Fails
# when the installed include directory carries a test seam or an internal header (the system-call
# table, the stack's InitHooks, the fault-injecting runtime, the tests' fault tables, the logger,
# anything under a detail/ folder) or a header that includes spdlog (no part of the public API).
#   tools/ci/check-installed-headers.sh PREFIX/include   (tools/ci/check-install.sh runs it)
set -euo pipefail
inc=${1:?usage: check-installed-headers.sh INCLUDE_DIR}
[[ -d $inc/kvoffload ]] || { echo "check-installed-headers: no kvoffload/ under $inc" >&2; exit 2; }
cd "$inc"
bad=$(find kvoffload \( -name syscalls.hpp -o -name sys.hpp -o -name init_hooks.hpp \
        -o -name 'fault_*' -o -name log.hpp -o -path '*/detail/*' \) -print | sort)
seams=$(grep -rlE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]spdlog/|^struct Syscalls \{|^struct InitHooks \{|class FaultInjectingRuntime' kvoffload | sort || true)
status=0
for f in $bad; do
  echo "check-installed-headers: $inc/$f is installed: a test seam or internal header (it belongs under core/src)" >&2
  status=1
done
for f in $seams; do
  echo "check-installed-headers: $inc/$f defines a test seam or includes spdlog (keep both internal)" >&2
  status=1
done
((status == 0)) && echo "check-installed-headers: $(find kvoffload -type f | wc -l) headers under $inc, none a test seam or internal"
exit $status
