#!/usr/bin/env python3
"""Turns a pytest JUnit XML file from a run under the vLLM harness into the report that
tools/ci/test_summary.py adds up (the format python/tests/conftest.py writes).

Usage: tools/ci/junit_report.py JUNIT_XML SUITE REPORT_DIR

Those runs are of vLLM's own test files, which carry no kvoffload skip tags, so the skips whose
cause is known are tagged here (KNOWN_SKIPS); tests/accepted_skips.txt decides as for every
suite. Prints the counts and every skip. Exit 1 when a case failed, when nothing ran, or when
KVOFFLOAD_CI_NO_SKIPS=1 and a skip is not accepted in CI; 0 otherwise.
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ACCEPTED_SKIPS = Path(__file__).resolve().parents[2] / "tests" / "accepted_skips.txt"

# (test name pattern, skip message pattern) -> tag. vLLM parametrizes these two tests over the
# attention backends of a CUDA, ROCm or XPU platform; on the CPU platform the list is empty.
KNOWN_SKIPS = [
    (r"test_register_kv_caches(_uniform_type)?$", r"got empty parameter set", "vllm-gpu-platform"),
]


def accepted_tags():
    tags = set()
    for line in ACCEPTED_SKIPS.read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            tags.add(words[0])
    return tags


def tag_of(name, message):
    m = re.match(r"\[([^\]\s]+)\]", message)
    if m:
        return m.group(1)
    for test, text, tag in KNOWN_SKIPS:
        if re.match(test, name.split("[")[0]) and re.search(text, message):
            return tag
    return ""


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    junit, suite, report_dir = argv[1:]
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as err:
        print(f"junit_report: {junit}: no pytest report ({err})", file=sys.stderr)
        return 1
    accepted = accepted_tags()
    ran = failed = 0
    skips = []
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        skipped = case.find("skipped")
        if skipped is not None:
            message = skipped.get("message", "")
            tag = tag_of(case.get("name", ""), message)
            skips.append({"test": test, "tag": tag, "message": message, "accepted": tag in accepted})
            continue
        ran += 1
        failed += case.find("failure") is not None or case.find("error") is not None
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, f"{suite}.json"), "w") as f:
        json.dump({"runner": "pytest", "suite": suite, "ran": ran, "failed": failed,
                   "skipped": len(skips), "skips": skips}, f)
        f.write("\n")
    print(f"{suite}: {ran} cases ran ({failed} failed), {len(skips)} skipped")
    refused = 0
    for s in skips:
        verdict = "accepted in CI" if s["accepted"] else "not accepted in CI"
        print(f"  skipped {s['test']}: {s['message']} ({verdict})")
        refused += not s["accepted"]
    if ran == 0:
        print(f"junit_report: {suite}: no test ran", file=sys.stderr)
        return 1
    if failed:
        return 1
    if refused and os.environ.get("KVOFFLOAD_CI_NO_SKIPS") == "1":
        print(f"junit_report: {suite}: {refused} skip(s) without a reason CI accepts "
              f"({ACCEPTED_SKIPS})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
