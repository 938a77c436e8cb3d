#!/usr/bin/env bash
# clang-tidy, with the repo's .clang-tidy and every finding an error, on the C and C++ files a
# change touches: the sources changed against a base revision, plus for each changed header one
# translation unit of the build that includes it (HeaderFilterRegex then reports the header).
#
# Usage: tools/ci/tidy-changed.sh [BUILD_DIR [BASE]]
#   BUILD_DIR  a configured build with compile_commands.json (default build/cpu, from the
#              directory it is run in); files it does
#              not compile (e.g. cuda/ in a CPU build) are listed and skipped.
#   BASE       the revision to diff against (default $KVOFFLOAD_TIDY_BASE, else the merge-base
#              with origin/main, else, on main itself or without a remote, the previous commit).
# Uncommitted and untracked files count as changed. Exit 0 when no file has a finding, 1 otherwise.
set -euo pipefail
build=${1:-build/cpu}
[[ $build == /* ]] || build=$PWD/$build  # relative to where it is run from
cd "$(dirname "$0")/../.."
base=${2:-${KVOFFLOAD_TIDY_BASE:-}}
db=$build/compile_commands.json
[[ -f $db ]] || { echo "tidy-changed: no $db; configure first (cmake --preset cpu)" >&2; exit 2; }
command -v clang-tidy >/dev/null || { echo "tidy-changed: clang-tidy is not installed" >&2; exit 2; }

if [[ -z $base ]]; then
  if git rev-parse -q --verify origin/main >/dev/null; then
    base=$(git merge-base HEAD origin/main)
  fi
  if [[ -z $base || $base == "$(git rev-parse HEAD)" ]]; then
    # On main itself: the change is the last commit (the empty tree when there is no parent).
    base=$(git rev-parse -q --verify HEAD~1 || git hash-object -t tree /dev/null)
  fi
fi

mapfile -t changed < <({ git diff --name-only --diff-filter=ACMR "$base" --;
                         git ls-files --others --exclude-standard; } |
                       grep -E '\.(c|cc|cpp|h|hpp)$' | sort -u)
if ((${#changed[@]} == 0)); then
  echo "tidy-changed: no C/C++ file changed since $(git rev-parse --short "$base")"
  exit 0
fi

# The translation units of the build, as absolute paths.
mapfile -t units < <(sed -n 's/^ *"file": "\(.*\)",*$/\1/p' "$db" | sort -u)
declare -A in_db=()
for u in "${units[@]}"; do in_db[$u]=1; done

# unit_including NAME: the first unit of the build with an #include of a file called NAME.
unit_including() {
  grep -l -E "#include [<\"]([^\">]*/)?${1//./\\.}[\">]" "${units[@]}" 2>/dev/null | head -n1 || true
}

targets=()
skipped=()
for f in "${changed[@]}"; do
  abs=$PWD/$f
  case $f in
    *.c | *.cc | *.cpp)
      if [[ -n ${in_db[$abs]:-} ]]; then targets+=("$abs"); else skipped+=("$f"); fi ;;
    *)
      # A header: the first unit of the build that includes it, directly or through one header
      # of the repository that does.
      unit=$(unit_including "$(basename "$f")")
      if [[ -z $unit ]]; then
        while read -r via; do
          unit=$(unit_including "$(basename "$via")")
          [[ -n $unit ]] && break
        done < <(git grep -l -E "#include [<\"]([^\">]*/)?$(basename "$f" | sed 's/\./\\./g')[\">]" -- '*.h' '*.hpp' || true)
      fi
      if [[ -n $unit ]]; then targets+=("$unit"); else skipped+=("$f"); fi ;;
  esac
done
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u | sed '/^$/d')
if ((${#skipped[@]} > 0)); then
  echo "tidy-changed: not compiled by $build, skipped: ${skipped[*]}"
fi
if ((${#targets[@]} == 0)); then
  echo "tidy-changed: nothing of this change is compiled by $build"
  exit 0
fi
echo "tidy-changed: ${#targets[@]} unit(s) for ${#changed[@]} changed file(s) since $(git rev-parse --short "$base")"

# Findings are reported for the changed files only (a unit analysed for a changed header, or a
# changed source's unchanged headers, are not this change's business): clang-tidy's --line-filter
# keeps the diagnostics whose file path ends with one of these names.
filter=$(printf '{"name":"%s"},' "${changed[@]}")
filter="[${filter%,}]"

# The build's compile commands without GCC's precompiled header (-include cmake_pch.hxx finds the
# .gch next to it, which clang cannot read); every source includes what it uses anyway.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tidy-changed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sed -E 's# -Winvalid-pch##g; s# -include [^ ]*/cmake_pch\.hxx##g' "$db" >"$tmp/compile_commands.json"

# One clang-tidy per unit, in parallel; --quiet keeps the output to the findings.
printf '%s\0' "${targets[@]}" |
  xargs -0 -n1 -P"$(nproc)" clang-tidy --quiet -p "$tmp" --warnings-as-errors='*' \
    --line-filter="$filter" \
  && { echo "tidy-changed: no findings"; exit 0; }
echo "tidy-changed: clang-tidy reported findings (above)" >&2
exit 1
