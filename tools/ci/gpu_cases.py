#!/usr/bin/env python3
"""How many GPU cases each suite really ran, from GoogleTest output (tools/gpu-smoke.sh).

A GPU run whose cases all skipped is green and tests nothing (issue 25), so the smoke run counts
per suite the cases of the backend that ran (passed or failed, not skipped) and fails when a suite
ran none. Two inputs:

    gpu_cases.py --backend cuda ctest.log            # `ctest -V` output, suites told apart by
                                                     # ctest's "N: " prefix and its Test command
    gpu_cases.py --backend cuda --suite NAME out.log # one suite's own output (compute-sanitizer)

Prints "SUITE: R ran, S skipped (BACKEND)" per suite; exit 0 when every suite ran at least one
case of the backend, 1 otherwise (or when no suite is found at all), 2 on bad arguments.
"""
import argparse
import os
import re
import sys

PREFIX = re.compile(r"^(\d+): (.*)$")
COMMAND = re.compile(r"^Test command: (\S+)")
VERDICT = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+?)(?: \(\d+ ms\))?$")


def count(lines, backend, suite=None):
    """{suite: [ran, skipped]} for cases named .../<backend>."""
    names = {}  # ctest test number -> suite name
    counts = {}
    for raw in lines:
        line = raw.rstrip("\n")
        key, text = None, line
        if suite is None:
            m = PREFIX.match(line)
            if not m:
                continue
            key, text = m.group(1), m.group(2)
            if c := COMMAND.match(text):
                names[key] = os.path.basename(c.group(1))
                continue
        v = VERDICT.match(text)
        if not v or not v.group(2).endswith("/" + backend):
            continue
        name = suite if suite is not None else names.get(key, "test " + key)
        ran_skipped = counts.setdefault(name, [0, 0])
        ran_skipped[1 if v.group(1) == "SKIPPED" else 0] += 1
    if suite is None:
        for name in names.values():  # a suite with no case of the backend at all
            counts.setdefault(name, [0, 0])
    elif suite not in counts:
        counts[suite] = [0, 0]
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, choices=["cuda", "hip"])
    parser.add_argument("--suite", help="the log is this one suite's own output")
    parser.add_argument("log")
    args = parser.parse_args()
    try:
        with open(args.log, encoding="utf-8", errors="replace") as f:
            counts = count(f, args.backend, args.suite)
    except OSError as e:
        print(f"gpu_cases: cannot read {args.log}: {e}", file=sys.stderr)
        return 2
    if not counts:
        print(f"no suite found in {args.log} (not `ctest -V` output?)")
        return 1
    bad = 0
    for name, (ran, skipped) in sorted(counts.items()):
        note = "" if ran > 0 else ": ran no GPU case"
        print(f"{name}: {ran} ran, {skipped} skipped ({args.backend}){note}")
        bad += ran == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
