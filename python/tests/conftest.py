import json
import os
import re
from pathlib import Path

import pytest

# Run against the build tree by default: tools/test.sh sets PYTHONPATH=build/<preset>/python.
os.environ.setdefault("KVOFFLOAD_LOG_LEVEL", "warn")


@pytest.fixture
def shm_dir(tmp_path):
    """A private directory standing in for /dev/shm (regions are plain files on any tmpfs/fs)."""
    d = tmp_path / "shm"
    d.mkdir()
    return str(d)


# ---- skips (Note [Skips in CI] in tests/support/gtest_main.cpp) ----------------------------------
# A test that cannot run skips with a reason tag: pytest.skip("[tag] detail"). With
# KVOFFLOAD_CI_NO_SKIPS=1 (.ci/run exports it) a skip whose tag tests/accepted_skips.txt does not
# list, or that has no tag, is reported as a failure. The run ends with how many cases ran and
# were skipped, and why; with KVOFFLOAD_TEST_REPORT_DIR set the same goes to pytest.json there.

ACCEPTED_SKIPS = Path(__file__).resolve().parents[2] / "tests" / "accepted_skips.txt"
CI_NO_SKIPS = os.environ.get("KVOFFLOAD_CI_NO_SKIPS") == "1"


def _accepted_tags():
    tags = set()
    for line in ACCEPTED_SKIPS.read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            tags.add(words[0])
    return tags


ACCEPTED = _accepted_tags()


def skip_tag(message):
    """'[tag] detail' -> 'tag'; anything else -> ''."""
    m = re.match(r"\[([^\]\s]+)\]", message)
    return m.group(1) if m else ""


def _skip_message(report):
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return message[len("Skipped: "):] if message.startswith("Skipped: ") else message


def _refuse_in_ci(report):
    """Turns a skip CI does not accept into a failure naming it."""
    if not (CI_NO_SKIPS and report.skipped) or hasattr(report, "wasxfail"):
        return
    message = _skip_message(report)
    if skip_tag(message) in ACCEPTED:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped without a reason CI accepts (KVOFFLOAD_CI_NO_SKIPS=1; accepted tags are in "
        f"{ACCEPTED_SKIPS}): {message}"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _refuse_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _refuse_in_ci(outcome.get_result())


_outcomes = {}  # nodeid -> ("passed" | "failed" | "skipped", skip message)


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _outcomes[report.nodeid] = ("skipped", _skip_message(report))
    elif report.failed:
        _outcomes[report.nodeid] = ("failed", "")
    elif report.when == "call" and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = ("passed", "")


def pytest_collectreport(report):
    if report.skipped:
        _outcomes[report.nodeid] = ("skipped", _skip_message(report))
    elif report.failed:  # a module that cannot be imported, or a module-level skip CI refused
        _outcomes[report.nodeid] = ("failed", "")


def pytest_terminal_summary(terminalreporter):
    ran = sum(1 for kind, _ in _outcomes.values() if kind != "skipped")
    failed = sum(1 for kind, _ in _outcomes.values() if kind == "failed")
    skips = [(nodeid, msg) for nodeid, (kind, msg) in _outcomes.items() if kind == "skipped"]
    write = terminalreporter.write_line
    write(f"pytest: {ran} cases ran ({failed} failed), {len(skips)} skipped")
    records = []
    for nodeid, msg in skips:
        tag = skip_tag(msg)
        ok = tag in ACCEPTED
        verdict = "accepted in CI" if ok else ("no reason tag: " if not tag else "") + "not accepted in CI"
        write(f"  skipped {nodeid}: {msg} ({verdict})")
        records.append({"test": nodeid, "tag": tag, "message": msg, "accepted": ok})
    report_dir = os.environ.get("KVOFFLOAD_TEST_REPORT_DIR")
    if report_dir:
        os.makedirs(report_dir, exist_ok=True)
        # One report per pytest process (python/tests_sglang runs in its own, under another name).
        suite = os.environ.get("KVOFFLOAD_PYTEST_SUITE", "pytest")
        with open(os.path.join(report_dir, f"{suite}.json"), "w") as f:
            json.dump({"runner": "pytest", "suite": suite, "ran": ran, "failed": failed,
                       "skipped": len(skips), "skips": records}, f)
            f.write("\n")
