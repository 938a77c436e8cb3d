# The tools that run the vLLM backend's tests on each vLLM commit: tools/vllm-engine-tests.sh
# (fails, never skips, without the harness or a tree) and tools/ci/junit_report.py (a run under
# the vLLM harness as a report for tools/ci/test_summary.py, with its skip policy).
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JUNIT = ROOT / "tools" / "ci" / "junit_report.py"

def run(*args, env=None):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def junit(path, cases):
    body = []
    for name, outcome, message in cases:
        inner = {"passed": "", "failed": '<failure message="boom"/>',
                 "skipped": f'<skipped type="pytest.skip" message="{message}"/>'}[outcome]
        body.append(f'<testcase classname="tests.x.test_worker" name="{name}">{inner}</testcase>')
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(body)}</testsuite></testsuites>')
    return path


def test_a_harness_run_becomes_a_report_with_the_ci_skip_policy(tmp_path):
    ci = {"KVOFFLOAD_CI_NO_SKIPS": "1"}
    known = ("test_register_kv_caches[backend0]", "skipped",
             "got empty parameter set ['backend'], function test_register_kv_caches")
    xml = junit(tmp_path / "a.xml", [("test_a", "passed", ""), known])
    done = run(JUNIT, xml, "suite-a", tmp_path / "reports", env=ci)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "reports" / "suite-a.json").read_text())
    assert (report["ran"], report["failed"], report["skipped"]) == (1, 0, 1)
    assert report["skips"][0]["tag"] == "vllm-gpu-platform" and report["skips"][0]["accepted"]
    # Any other skip fails in CI, and only there.
    xml = junit(tmp_path / "b.xml", [("test_a", "passed", ""), ("test_b", "skipped", "no redis")])
    assert run(JUNIT, xml, "suite-b", tmp_path / "reports", env=ci).returncode == 1
    assert run(JUNIT, xml, "suite-b", tmp_path / "reports", env={"KVOFFLOAD_CI_NO_SKIPS": "0"}).returncode == 0
    # The known skip's message on another test is not accepted either.
    xml = junit(tmp_path / "c.xml", [("test_a", "passed", ""),
                                     ("test_other", "skipped", "got empty parameter set ['x']")])
    assert run(JUNIT, xml, "suite-c", tmp_path / "reports", env=ci).returncode == 1
    # A failure, a run with nothing run, and no report at all fail.
    xml = junit(tmp_path / "d.xml", [("test_a", "failed", "")])
    assert run(JUNIT, xml, "suite-d", tmp_path / "reports").returncode == 1
    xml = junit(tmp_path / "e.xml", [])
    done = run(JUNIT, xml, "suite-e", tmp_path / "reports")
    assert done.returncode == 1 and "no test ran" in done.stderr
    done = run(JUNIT, tmp_path / "missing.xml", "suite-f", tmp_path / "reports")
    assert done.returncode == 1 and "no pytest report" in done.stderr


def test_the_engine_loop_tests_fail_without_their_trees_never_skip(tmp_path):
    script = ROOT / "tools" / "vllm-engine-tests.sh"
    harness = tmp_path / "harness"
    harness.mkdir()
    env = {**os.environ, "KVOFFLOAD_VLLM_HARNESS": str(tmp_path / "none")}
    done = subprocess.run([str(script)], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "no vLLM harness at" in done.stderr, done.stderr
    for name in ("setup.sh", "run-vllm-tests.sh"):
        (harness / name).write_text("#!/bin/sh\nexit 0\n")
        (harness / name).chmod(0o755)
    env = {**os.environ, "KVOFFLOAD_VLLM_HARNESS": str(harness),
           "KVOFFLOAD_VLLM_ENGINE_TREES": f"{tmp_path / 'tree-a'}:{tmp_path / 'tree-b'}"}
    done = subprocess.run([str(script)], capture_output=True, text=True, env=env)
    assert done.returncode == 1, done.stderr
    assert f"no vLLM engine tree at {tmp_path / 'tree-a'}" in done.stderr


def test_the_backend_tests_run_under_the_harness_on_every_tree(tmp_path):
    # tools/vllm-engine-tests.sh runs python/tests/test_vllm_*.py through the harness's runner on
    # each tree (its report written by python/tests' conftest), besides vLLM's own tests and
    # python/engine_tests. A fake harness records what it was asked to run.
    script = ROOT / "tools" / "vllm-engine-tests.sh"
    harness = tmp_path / "harness"
    harness.mkdir()
    log = tmp_path / "calls.txt"
    (harness / "env.sh").write_text("DEBIAN_PACKAGES=()\n")
    (harness / "setup.sh").write_text("#!/bin/sh\nexit 0\n")
    (harness / "run-vllm-tests.sh").write_text(
        "#!/bin/bash\n"
        f'echo "$1 ${{KVOFFLOAD_TEST_REPORT_SUITE}} ${{*:3}}" >> {log}\n'
        'for a in "$@"; do [[ $a == --junitxml=* ]] && '
        "echo '<testsuites><testsuite name=\"pytest\"><testcase classname=\"t\" name=\"x\"/>"
        "</testsuite></testsuites>' > \"${a#--junitxml=}\"; done\nexit 0\n")
    for name in ("setup.sh", "run-vllm-tests.sh"):
        (harness / name).chmod(0o755)
    trees = [tmp_path / "tree-a", tmp_path / "tree-b"]
    for t in trees:
        (t / "vllm/v1/core/sched").mkdir(parents=True)
        (t / "vllm/v1/core/sched/scheduler.py").write_text("")
        (t / "tests/v1/kv_connector/unit/offloading_connector").mkdir(parents=True)
    build = tmp_path / "build"
    (build / "python" / "kvoffload").mkdir(parents=True)
    (build / "python" / "kvoffload" / "_kvoffload.cpython-311-x86_64-linux-gnu.so").write_text("")
    env = {**os.environ, "KVOFFLOAD_VLLM_HARNESS": str(harness),
           "KVOFFLOAD_VLLM_ENGINE_TREES": ":".join(map(str, trees))}
    env.pop("KVOFFLOAD_VLLM_ENGINE_SUITES", None)  # the default: all three
    done = subprocess.run([str(script), str(build)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    backend = [c for c in calls if "python/tests/test_vllm_spec.py" in c]
    assert [c.split()[0] for c in backend] == [str(t) for t in trees], calls
    for c, t in zip(backend, trees):
        assert f"pytest-vllm-{t.name}" in c and f"--rootdir={ROOT}" in c, c
        assert "python/tests/test_vllm_worker.py" in c and "python/tests/test_manager.py" not in c, c
    assert sum("python/engine_tests" in c for c in calls) == 2, calls
    assert len(calls) == 6, calls  # vLLM's own tests, the backend's, python/engine_tests; twice
    # An absolute BUILD_DIR: the reports go into it (not into a path made below the checkout).
    assert {p.name for p in (build / "test-reports").iterdir()} == {
        f"vllm-harness-{what}-{t.name}.json" for what in ("vllm", "kvoffload") for t in trees}
