#!/usr/bin/env python3
"""Parses a Prometheus text exposition with the Prometheus Python client's own parser (Debian's
python3-prometheus-client) and checks it against Prometheus' naming conventions, as
`promtool check metrics` does for the rules that apply here. Prints the samples as one JSON
object {"samples": [[name, {labels}, value], ...]} and exits 0, or prints the problems on stderr
and exits 1. Used by tests/cli/monitor/exporter_test.cpp and pool_monitor_test.cpp on what
`kvoffload exporter` serves.

usage: check_prometheus.py FILE
"""
import json
import math
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

ALLOWED_LABELS = {"engine_id", "rank", "tier", "direction", "result", "state", "path", "problem",
                  "pool"}
NAME = re.compile(r"^kvoffload_[a-z][a-z0-9_]*$")
# Units must be base units (seconds, bytes) and spelled out as Prometheus recommends.
BAD_UNITS = re.compile(r"_(ms|us|ns|kb|mb|gb|kib|mib|gib|milliseconds|microseconds|nanoseconds|"
                       r"kilobytes|megabytes|gigabytes|percent|gbps)(_|$)")


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    problems = []
    if not text.endswith("\n"):
        problems.append("the exposition does not end with a newline")
    # HELP and TYPE come once per family, before its samples.
    seen_type = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if name in seen_type:
                problems.append(f"TYPE of {name} appears twice")
            seen_type[name] = kind
    samples = []
    keys = set()
    for family in text_string_to_metric_families(text):
        if not family.documentation:
            problems.append(f"{family.name}: no HELP text")
        if family.type not in ("counter", "gauge"):
            problems.append(f"{family.name}: type {family.type}, expected counter or gauge")
        for s in family.samples:
            if not NAME.match(s.name):
                problems.append(f"{s.name}: not kvoffload_ followed by lower-case words")
            if family.type == "counter" and not s.name.endswith("_total"):
                problems.append(f"{s.name}: a counter whose name does not end in _total")
            if family.type == "gauge" and s.name.endswith("_total"):
                problems.append(f"{s.name}: a gauge named like a counter (_total)")
            if BAD_UNITS.search(s.name):
                problems.append(f"{s.name}: not in base units (seconds, bytes)")
            for label in s.labels:
                if label not in ALLOWED_LABELS:
                    problems.append(f"{s.name}: unexpected label {label}")
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in keys:
                problems.append(f"{s.name}{s.labels}: sample appears twice")
            keys.add(key)
            if family.type == "counter" and (math.isnan(s.value) or s.value < 0):
                problems.append(f"{s.name}{s.labels}: counter value {s.value}")
            samples.append([s.name, s.labels, s.value])
    if not samples:
        problems.append("no samples")
    if problems:
        for p in problems:
            print("check_prometheus: " + p, file=sys.stderr)
        return 1
    json.dump({"samples": samples}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
