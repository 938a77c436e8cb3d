#!/usr/bin/env python3
"""The CUDA table (cuda/src/cuda_api.cpp) builds with CUDA 12.0 to 13.x (Note [CUDA versions]).

Only one toolkit is installed where CI runs, so this check reads the source the way an older
toolkit's preprocessor would: for each API level it keeps the lines that `#if KVOFFLOAD_CUDA_API`
conditions leave in, and fails when any of them names a declaration newer than that level. It
complements the forced-level compile in cuda/CMakeLists.txt, which cannot see a declaration the
newer header has and the older one lacks.

    check_cuda_api_levels.py path/to/cuda_api.cpp
"""
import re
import sys

# Declarations used by the table that appeared after CUDA 12.0, with the version that added them
# (CUDA runtime and driver API references, "Modules" and release notes).
NEWER = {
    "cudaGetDriverEntryPointByVersion": 12050,
    "CUmemcpyAttributes": 12080,
    "CU_MEMCPY_SRC_ACCESS_ORDER_STREAM": 12080,
    "CU_MEMCPY_SRC_ACCESS_ORDER_ANY": 12080,
    "CU_MEMCPY_FLAG_DEFAULT": 12080,
}
LEVELS = [12000, 12040, 12050, 12060, 12080, 12090, 13000]
COND = re.compile(r"#\s*(if|elif)\s+KVOFFLOAD_CUDA_API\s*(>=|<|>|<=|==)\s*(\d+)\s*$")


def live_lines(text, level):
    """Lines kept at `level`; #if conditions on anything else count as true (kept)."""
    stack = []  # (taking, any_branch_taken)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        m = COND.match(stripped)
        if stripped.startswith(("#if", "#ifdef", "#ifndef")):
            value = eval(f"{level} {m.group(2)} {m.group(3)}") if m else True  # noqa: S307
            parent = all(t for t, _ in stack)
            stack.append((parent and value, value))
            continue
        if stripped.startswith("#elif"):
            taking, taken = stack.pop()
            value = eval(f"{level} {m.group(2)} {m.group(3)}") if m else True  # noqa: S307
            parent = all(t for t, _ in stack)
            stack.append((parent and value and not taken, taken or value))
            continue
        if stripped.startswith("#else"):
            taking, taken = stack.pop()
            parent = all(t for t, _ in stack)
            stack.append((parent and not taken, True))
            continue
        if stripped.startswith("#endif"):
            stack.pop()
            continue
        if all(t for t, _ in stack):
            out.append((number, line))
    return out


def code_only(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)  # strings name symbols, they do not use them
    return line.split("//", 1)[0]


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    problems = []
    for level in LEVELS:
        for number, line in live_lines(text, level):
            code = code_only(line)
            for name, since in NEWER.items():
                if since > level and re.search(rf"\b{name}\b", code):
                    problems.append(f"{sys.argv[1]}:{number}: {name} (CUDA {since // 1000}."
                                    f"{since % 1000 // 10}) is used when built with CUDA "
                                    f"{level // 1000}.{level % 1000 // 10}: {line.strip()}")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"cuda_api levels: {len(LEVELS)} CUDA API levels from 12.0 to 13.0 use no newer declaration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
