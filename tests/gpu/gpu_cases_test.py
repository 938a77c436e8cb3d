#!/usr/bin/env python3
"""tools/ci/gpu_cases.py, which makes tools/gpu-smoke.sh fail when a GPU suite ran no GPU case.

    gpu_cases_test.py path/to/tools/ci/gpu_cases.py
"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = None

# `ctest -V` output of the two gpu suites: test 1 ran its cuda cases, test 2 skipped them all.
CTEST_LOG = """\
1: Test command: /b/tests/runtime/runtime_gpu_tests "--gtest_color=no"
1: [ RUN      ] Backends/GpuRuntimeTest.Paths/cuda
1: [       OK ] Backends/GpuRuntimeTest.Paths/cuda (12 ms)
1: [ RUN      ] Backends/GpuRuntimeTest.Paths/hip
1: [no-gpu] device runtime 'hip' is not available: this build does not include it
1: [  SKIPPED ] Backends/GpuRuntimeTest.Paths/hip (0 ms)
1: [ RUN      ] Backends/GpuRuntimeTest.Ring/cuda
1: [  FAILED  ] Backends/GpuRuntimeTest.Ring/cuda (3 ms)
2: Test command: /b/tests/transfer/transfer_gpu_tests "--gtest_color=no"
2: [ RUN      ] Backends/TransferTest.Load/cuda
2: [no-gpu] device runtime 'cuda' is not available: no driver is installed
2: [  SKIPPED ] Backends/TransferTest.Load/cuda (0 ms)
"""


def run(*args, log):
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(log)
    try:
        return subprocess.run([sys.executable, SCRIPT, *args, f.name], capture_output=True,
                              text=True, check=False)
    finally:
        os.unlink(f.name)


class GpuCases(unittest.TestCase):
    def test_a_suite_that_skipped_every_case_fails_the_run(self):
        r = run("--backend", "cuda", log=CTEST_LOG)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("runtime_gpu_tests: 2 ran, 0 skipped (cuda)", r.stdout)
        self.assertIn("transfer_gpu_tests: 0 ran, 1 skipped (cuda): ran no GPU case", r.stdout)

    def test_every_suite_ran_cases(self):
        log = CTEST_LOG.replace("2: [no-gpu] device runtime 'cuda' is not available: no driver "
                                "is installed\n2: [  SKIPPED ]", "2: [       OK ]")
        r = run("--backend", "cuda", log=log)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("transfer_gpu_tests: 1 ran, 0 skipped (cuda)", r.stdout)

    def test_cases_of_another_backend_do_not_count(self):
        r = run("--backend", "hip", log=CTEST_LOG)
        self.assertEqual(r.returncode, 1)
        self.assertIn("runtime_gpu_tests: 0 ran, 1 skipped (hip)", r.stdout)
        self.assertIn("transfer_gpu_tests: 0 ran, 0 skipped (hip): ran no GPU case", r.stdout)

    def test_one_suites_own_output(self):
        plain = "\n".join(line.split(": ", 1)[1] for line in CTEST_LOG.splitlines()[:8])
        r = run("--backend", "cuda", "--suite", "memcheck", log=plain)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("memcheck: 2 ran, 0 skipped (cuda)", r.stdout)
        skipped = "[ RUN      ] A.B/cuda\n[  SKIPPED ] A.B/cuda (0 ms)\n"
        r = run("--backend", "cuda", "--suite", "memcheck", log=skipped)
        self.assertEqual(r.returncode, 1)
        self.assertIn("memcheck: 0 ran, 1 skipped (cuda): ran no GPU case", r.stdout)

    def test_a_log_without_suites_fails(self):
        r = run("--backend", "cuda", log="build FAILED\n")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no suite found", r.stdout)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
