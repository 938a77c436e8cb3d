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


def probe(tmp_path, ci, skip, modules=("skip_probe.py",), env_changes=None):
    env = dict(os.environ)
    env.pop("KVOFFLOAD_CI_NO_SKIPS", None)
    env.pop("KVO_PROBE_SKIP", None)
    if ci:
        env["KVOFFLOAD_CI_NO_SKIPS"] = "1"
    if skip is not None:
        env["KVO_PROBE_SKIP"] = skip
    for name, value in (env_changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["KVOFFLOAD_TEST_REPORT_DIR"] = str(tmp_path)  # not the real run's report directory
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *(os.path.join(HERE, m) for m in modules)],
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


# The vLLM backend's tests need vLLM's engine loop: they run under the vLLM harness
# (tools/vllm-engine-tests.sh, on each supported commit's tree). Outside it they skip with the
# reason [no-vllm-src], which CI does not accept: there a missing harness fails them, never passes
# them. Outside pytest (a bench) vllm_real.require() raises.
NO_HARNESS = {"VLLM_HARNESS_TREE": None, "PYTHONPATH": os.pathsep.join(
    p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and "vllm-harness" not in p)}
NEEDED = "[no-vllm-src] vLLM's engine loop is needed: run these tests under the vLLM harness"


@pytest.mark.parametrize("module", ["test_vllm_spec.py", "test_vllm_manager.py",
                                    "test_vllm_worker.py", "test_vllm_own_tests.py"])
def test_vllm_tests_without_vllm_sources_fail_in_ci(tmp_path, module):
    code, output, report = probe(tmp_path, True, None, [module], NO_HARNESS)
    assert code != 0, output
    assert "skipped without a reason CI accepts" in output, output
    assert NEEDED in output, output
    assert report["ran"] >= 1 and report["failed"] >= 1 and report["skipped"] == 0, report


def test_vllm_tests_without_vllm_sources_are_reported_skips_outside_ci(tmp_path):
    # With the probe beside it, so that something runs (pytest exits 5 when nothing does).
    code, output, report = probe(tmp_path, False, None, ["skip_probe.py", "test_vllm_spec.py"],
                                 NO_HARNESS)
    assert code == 0, output
    assert "[no-vllm-src]" in output and "(not accepted in CI)" in output, output
    assert report["skipped"] == 1 and report["skips"][0]["tag"] == "no-vllm-src", report


def test_vllm_real_outside_pytest_and_the_harness_raises(tmp_path):
    env = {**os.environ, **{k: v for k, v in NO_HARNESS.items() if v is not None}}
    env.pop("VLLM_HARNESS_TREE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", "import vllm_real; vllm_real.require()"],
                          env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0
    assert "VllmTreeError: " + NEEDED in done.stderr, done.stderr
