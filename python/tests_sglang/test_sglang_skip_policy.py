# The SGLang backend's tests need SGLang's sources (KVOFFLOAD_SGLANG_SRC). Without them they skip
# with the reason [no-sglang-src], which CI does not accept (tests/accepted_skips.txt): under
# KVOFFLOAD_CI_NO_SKIPS=1 a missing tree fails them. A tree that is named but wrong is an error.
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def probe(tmp_path, ci, sglang_src):
    env = dict(os.environ)
    env.pop("KVOFFLOAD_CI_NO_SKIPS", None)
    env.pop("KVOFFLOAD_SGLANG_SRC", None)
    if ci:
        env["KVOFFLOAD_CI_NO_SKIPS"] = "1"
    if sglang_src is not None:
        env["KVOFFLOAD_SGLANG_SRC"] = sglang_src
    env["KVOFFLOAD_TEST_REPORT_DIR"] = str(tmp_path)
    env["KVOFFLOAD_TEST_REPORT_SUITE"] = "probe"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          os.path.join(HERE, "test_sglang_remote.py")],
                         env=env, cwd=HERE, capture_output=True, text=True, timeout=300)
    path = tmp_path / "probe.json"
    report = json.loads(path.read_text()) if path.exists() else None
    return out.returncode, out.stdout + out.stderr, report


def test_without_sglang_sources_the_tests_fail_in_ci(tmp_path):
    code, output, report = probe(tmp_path, True, None)
    assert code != 0, output
    assert "skipped without a reason CI accepts" in output, output
    assert "[no-sglang-src] SGLang's sources are needed: set KVOFFLOAD_SGLANG_SRC" in output
    assert report["failed"] >= 1 and report["skipped"] == 0, report


def test_without_sglang_sources_they_are_reported_skips_outside_ci(tmp_path):
    code, output, report = probe(tmp_path, False, None)
    assert code in (0, 5), output  # 5: pytest ran nothing (the only module skipped)
    assert report["skipped"] == 1 and report["skips"][0]["tag"] == "no-sglang-src", report
    assert not report["skips"][0]["accepted"], report


def test_a_wrong_sglang_tree_is_an_error(tmp_path):
    code, output, _ = probe(tmp_path, False, str(tmp_path / "no-sglang-here"))
    assert code != 0, output
    assert "does not exist; point KVOFFLOAD_SGLANG_SRC at SGLang's source tree" in output, output
