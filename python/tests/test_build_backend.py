"""The PEP 517 backend (python/build_backend/kvoffload_build.py) as pip drives it, and the README's
Python snippet as a user copies it (issue 26).

pip asks prepare_metadata_for_build_wheel first; without the hook it ran the whole CMake build to
get the metadata and showed only "Preparing metadata ... still running". The snippet imported
numpy, which the package does not require."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _backend():
    spec = importlib.util.spec_from_file_location(
        "kvoffload_build", ROOT / "python" / "build_backend" / "kvoffload_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_metadata_is_prepared_without_building(tmp_path, monkeypatch):
    backend = _backend()

    def no_build(*args, **kwargs):
        raise AssertionError(f"the metadata hook ran a command: {args}")

    # Nothing may be built or run for the metadata: no CMake, no subprocess.
    monkeypatch.setattr(backend.subprocess, "run", no_build)
    monkeypatch.setattr(backend, "_build", no_build)
    version = backend._version()
    info = backend.prepare_metadata_for_build_wheel(str(tmp_path))
    assert info == f"kvoffload-{version}.dist-info"
    metadata = (tmp_path / info / "METADATA").read_text()
    assert "Name: kvoffload\n" in metadata and f"Version: {version}\n" in metadata
    assert "Requires-Dist" not in metadata, "the package requires nothing at run time"
    # build_wheel writes the same files into the wheel.
    for name, data in backend._dist_info_files(version, backend._tag()).items():
        assert (tmp_path / name).read_bytes() == data, name


def test_readme_python_snippet_runs_without_numpy(tmp_path):
    text = (ROOT / "README.md").read_text()
    start = text.index("Python (device pointers are integers")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, "README has no Python snippet after 'Python (device pointers are integers'"
    snippet = match.group(1)
    # numpy hidden: an import of it fails as it does where numpy is not installed.
    program = "import sys\nsys.modules['numpy'] = None\n" + snippet
    shm = tmp_path / "shm"
    shm.mkdir()
    env = dict(os.environ, KVOFFLOAD_SHM_DIR=str(shm))
    result = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
