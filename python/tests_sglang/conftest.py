"""The SGLang backend's tests run in their own pytest process (tools/test.sh): they use Debian's
real torch, and python/tests replaces torch with a stub for vLLM. The skip policy, the outcome
report and the store servers are python/tests' own (its conftest's hooks are re-exported here)."""

import importlib.util
import os
import sys
from pathlib import Path

_tests = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(_tests))  # store_servers
os.environ.setdefault("KVOFFLOAD_TEST_REPORT_SUITE", "pytest-sglang")

_spec = importlib.util.spec_from_file_location("kvoffload_tests_conftest", _tests / "conftest.py")
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
for _name in dir(_base):
    if _name.startswith("pytest_") or _name == "shm_dir":
        globals()[_name] = getattr(_base, _name)
