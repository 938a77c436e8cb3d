#!/usr/bin/env python3
"""Adds up what the test command ran: how many cases ran and how many were skipped, and why.

Usage: tools/ci/test_summary.py REPORT_DIR

REPORT_DIR holds one JSON report per GoogleTest suite (written by tests/support/gtest_main.cpp)
and one for pytest (python/tests/conftest.py). Prints one line per runner and every skip with its
reason. Exit 1 when KVOFFLOAD_CI_NO_SKIPS=1 and a skip's reason is not accepted in CI
(tests/accepted_skips.txt; Note [Skips in CI] in tests/support/gtest_main.cpp), or when there is
no report at all; 0 otherwise.
"""
import json
import os
import sys
from pathlib import Path


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    reports = sorted(Path(argv[1]).glob("*.json"))
    if not reports:
        print(f"test summary: no test reports in {argv[1]}", file=sys.stderr)
        return 1
    totals = {}  # runner -> [suites, ran, failed, skipped]
    skips = []
    for path in reports:
        r = json.loads(path.read_text())
        t = totals.setdefault(r["runner"], [0, 0, 0, 0])
        t[0] += 1
        t[1] += r["ran"]
        t[2] += r["failed"]
        t[3] += r["skipped"]
        skips += [(r["suite"], s) for s in r["skips"]]
    names = {"gtest": "GoogleTest", "pytest": "pytest"}
    print("test summary:")
    for runner, (suites, ran, failed, skipped) in sorted(totals.items()):
        where = f" in {suites} suites" if runner == "gtest" else ""
        print(f"  {names.get(runner, runner)}: {ran} cases ran{where} ({failed} failed), "
              f"{skipped} skipped")
    refused = 0
    for suite, s in skips:
        verdict = "accepted in CI" if s["accepted"] else "not accepted in CI"
        print(f"  skipped {suite} {s['test']}: {s['message']} ({verdict})")
        refused += not s["accepted"]
    if refused and os.environ.get("KVOFFLOAD_CI_NO_SKIPS") == "1":
        print(f"test summary: {refused} skip(s) without a reason CI accepts "
              f"(tests/accepted_skips.txt)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
