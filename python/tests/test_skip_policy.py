# The CI skip policy of the pytest suite (conftest.py; Note [Skips in CI] in
# tests/support/gtest_main.cpp): with KVOFFLOAD_CI_NO_SKIPS=1 a skip whose tag
# tests/accepted_skips.txt does not list, or that has no tag, is a failure; an accepted one is
# not; every run says how many cases ran and were skipped, and why.
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def probe(tmp_path, ci, skip):
    env = dict(os.environ)
    env.pop("KVOFFLOAD_CI_NO_SKIPS", None)
    env.pop("KVO_PROBE_SKIP", None)
    if ci:
        env["KVOFFLOAD_CI_NO_SKIPS"] = "1"
    if skip is not None:
        env["KVO_PROBE_SKIP"] = skip
    env["KVOFFLOAD_TEST_REPORT_DIR"] = str(tmp_path)  # not the real run's report directory
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "skip_probe.py")],
        env=env, cwd=HERE, capture_output=True, text=True)
    report = json.loads((tmp_path / "pytest.json").read_text())
    return out.returncode, out.stdout + out.stderr, report


@pytest.mark.parametrize(
    "ci, skip, rc, needles",
    [
        (True, None, 0, ["pytest: 1 cases ran (0 failed), 0 skipped"]),
        (True, "no-servers", 1, ["skipped without a reason CI accepts", "[no-servers] the probe was told to skip"]),
        (True, "", 1, ["skipped without a reason CI accepts", "a skip that names no reason"]),
        (True, "no-gpu", 0, ["1 skipped", "[no-gpu] the probe was told to skip (accepted in CI)"]),
        (False, "no-servers", 0, ["1 skipped", "[no-servers] the probe was told to skip (not accepted in CI)"]),
    ],
    ids=["passes", "refused_in_ci", "untagged_in_ci", "accepted_in_ci", "reported_outside_ci"],
)
def test_skips_fail_ci_unless_their_reason_is_accepted(tmp_path, ci, skip, rc, needles):
    code, output, report = probe(tmp_path, ci, skip)
    assert code == rc, output
    for needle in needles:
        assert needle in output, output
    if skip is not None and not (ci and skip in ("no-servers", "")):
        assert report["skipped"] == 1 and report["skips"][0]["tag"] == (skip or "")
