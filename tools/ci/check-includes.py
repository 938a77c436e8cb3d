#!/usr/bin/env python3
"""Every source includes what it uses: compiles each translation unit of a build once more without
its precompiled header (the `-include cmake_pch.hxx` CMake adds), syntax only, so a source that
compiles only because the precompiled header brought a header in fails here, naming the file.

    tools/ci/check-includes.py [-j N] [--filter REGEX] BUILD_DIR

BUILD_DIR is a configured build with compile_commands.json (the cpu preset writes one). A build
configured with -DKVOFFLOAD_PCH=OFF checks the same thing, at the cost of a whole build; this
costs about a third of one (no code generation). It cannot see a header whose absence changes
behaviour without breaking the build (pybind11/stl.h: its casters): python/CMakeLists.txt keeps
such headers out of the precompiled header instead.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys


def without_pch(args):
    out = []
    skip = 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a == "-include" and i + 1 < len(args) and args[i + 1].endswith("cmake_pch.hxx"):
            skip = 1
            continue
        if a in ("-Winvalid-pch",):
            continue
        if a == "-o":
            skip = 1
            continue
        if a == "-c":
            continue
        out.append(a)
    return out + ["-fsyntax-only"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--filter", default="", help="only sources whose path matches this regex")
    ap.add_argument("build")
    a = ap.parse_args()
    with open(os.path.join(a.build, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    jobs = []
    for e in entries:
        src = e["file"]
        if "cmake_pch" in src or not re.search(a.filter, src):
            continue
        if not src.endswith((".cpp", ".cc", ".c")):
            continue
        args = e.get("arguments") or shlex.split(e["command"])
        if args and os.path.basename(args[0]) == "ccache":
            args = args[1:]
        jobs.append((src, e["directory"], without_pch(args)))

    def check(job):
        src, cwd, args = job
        r = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
        return src, r.returncode, r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.j)) as pool:
        for src, rc, err in pool.map(check, jobs):
            if rc != 0:
                failed += 1
                first = next((l for l in err.splitlines() if "error" in l), err.strip()[:300])
                print(f"check-includes: {os.path.relpath(src)} does not compile without the "
                      f"precompiled header: {first}")
    print(f"check-includes: {len(jobs)} sources, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
