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


# --- the backend as pip drives it: in a subprocess through pyproject_hooks, output captured ---

_FAKE_CMAKE = r"""#!/bin/sh
# A stand-in for cmake: configure makes the build dir, --build prints ninja's step lines,
# --install lays out the package files build_wheel packs.
echo "cmake $*" >> "$FAKE_CMAKE_CALLS"
case " $* " in
  *" --build "*)
    echo "[1/3] Building CXX object core/CMakeFiles/kvoffload.dir/src/a.cpp.o"
    echo "[2/3] Building CXX object core/CMakeFiles/kvoffload.dir/src/b.cpp.o"
    echo "[3/3] Linking CXX shared library core/libkvoffload.so.0"
    exit 0 ;;
  *" --install "*)
    prefix=""; prev=""
    for a in "$@"; do [ "$prev" = "--prefix" ] && prefix=$a; prev=$a; done
    mkdir -p "$prefix/kvoffload/vllm"
    for f in __init__.py vllm/__init__.py vllm/spec.py _cli.py _kvoffload.cpython-3-fake.so; do
      echo "# $f" > "$prefix/kvoffload/$f"
    done
    exit 0 ;;
  *)
    prev=""
    for a in "$@"; do [ "$prev" = "-B" ] && mkdir -p "$a"; prev=$a; done
    exit 0 ;;
esac
"""

# Runs one hook the way pip 23 does: pyproject_hooks' in-process script in a subprocess whose
# stdout and stderr go to a pipe pip reads (and shows only with -v or on failure).
_DRIVER = r"""
import json, os, subprocess, sys
from pip._vendor.pyproject_hooks import BuildBackendHookCaller
root, hook, out_dir, capture = sys.argv[1:5]
captured = []
def runner(cmd, cwd=None, extra_environ=None):
    env = dict(os.environ, **(extra_environ or {}))
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    captured.append(proc.stdout.decode(errors="replace"))
    proc.check_returncode()
caller = BuildBackendHookCaller(root, "kvoffload_build", backend_path=["python/build_backend"],
                                runner=runner)
try:
    if hook == "metadata":
        result = caller.prepare_metadata_for_build_wheel(out_dir, _allow_fallback=False)
    else:
        result = caller.build_wheel(out_dir, config_settings={"build-dir": out_dir + "/build"})
finally:
    with open(capture, "w") as f:
        f.write("".join(captured))
print("HOOK-RESULT", result, flush=True)
"""


def _fake_tools(tmp_path, cmake_body):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cmake = bin_dir / "cmake"
    cmake.write_text(cmake_body)
    cmake.chmod(0o755)
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    calls = tmp_path / "cmake-calls"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_CMAKE_CALLS=str(calls))
    env.pop("KVOFFLOAD_CMAKE_ARGS", None)
    return driver, calls, env


def test_pip_gets_the_metadata_without_cmake(tmp_path):
    # A cmake that fails and leaves a trace: the metadata hook must never reach it.
    driver, calls, env = _fake_tools(
        tmp_path, '#!/bin/sh\necho "cmake $*" >> "$FAKE_CMAKE_CALLS"\nexit 1\n')
    out = tmp_path / "meta"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, str(driver), str(ROOT), "metadata", str(out), str(tmp_path / "log")],
        env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr + (tmp_path / "log").read_text()
    assert not calls.exists(), f"the metadata hook ran cmake: {calls.read_text()}"
    version = _backend()._version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert f"HOOK-RESULT kvoffload-{version}.dist-info" in result.stdout
    fields = {}
    for line in (out / f"kvoffload-{version}.dist-info" / "METADATA").read_text().splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    assert fields["Name"] == ["kvoffload"]
    assert fields["Version"] == [version]
    assert fields["Requires-Python"] == [">=3.10"]
    licence = (ROOT / "LICENSE").read_text()
    if "Apache License" in licence and "Version 2.0" in licence:
        assert fields["License"] == ["Apache-2.0"]


def _read_pty(fd):
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the child and every holder of the pty's slave side are gone
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def test_build_progress_reaches_the_terminal_past_pips_capture(tmp_path):
    import pty

    driver, calls, env = _fake_tools(tmp_path, _FAKE_CMAKE)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    capture = tmp_path / "captured"
    argv = [sys.executable, str(driver), str(ROOT), "wheel", str(wheels), str(capture)]
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pty, as a user's shell
        try:
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    terminal = _read_pty(fd)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, terminal + capture.read_text()
    # The build's steps were shown on the terminal though pip captured the backend's output ...
    for step in ("[1/3] Building CXX object", "[3/3] Linking CXX shared library"):
        assert f"kvoffload_build: {step}" in terminal, terminal
    assert "kvoffload-build.log" in terminal, terminal
    # ... and are in pip's captured log and the build's log file too.
    captured = capture.read_text()
    assert "[2/3] Building CXX object" in captured, captured
    assert "[2/3] Building CXX object" in (wheels / "build" / "kvoffload-build.log").read_text()
    assert list(wheels.glob("kvoffload-*.whl")), terminal


def test_build_without_a_terminal_says_where_the_log_is(tmp_path):
    driver, calls, env = _fake_tools(tmp_path, _FAKE_CMAKE)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    capture = tmp_path / "captured"
    # start_new_session: no controlling terminal, /dev/tty cannot be opened (CI, a daemon).
    result = subprocess.run(
        [sys.executable, str(driver), str(ROOT), "wheel", str(wheels), str(capture)],
        env=env, capture_output=True, text=True, timeout=120, start_new_session=True,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr + capture.read_text()
    log = wheels / "build" / "kvoffload-build.log"
    assert f"the build's full output: {log}" in capture.read_text()
    assert "[3/3] Linking" in log.read_text()
    assert list(wheels.glob("kvoffload-*.whl"))


def test_every_module_of_the_package_is_copied_and_installed():
    # python/CMakeLists.txt names each file it copies into the build tree and installs (the wheel
    # is that install): a module left out of the list imports in the source tree and is missing
    # from every installed kvoffload (kvoffload.vllm is a package of modules since issue 27).
    cmake = (ROOT / "python" / "CMakeLists.txt").read_text()
    listed = re.search(r"set\(_kvo_py_sources(.*?)\)", cmake, re.S)
    assert listed, "no set(_kvo_py_sources ...) in python/CMakeLists.txt"
    named = set(listed.group(1).split())
    package = ROOT / "python" / "kvoffload"
    on_disk = {f"kvoffload/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert on_disk - named == set(), f"python/CMakeLists.txt does not install {sorted(on_disk - named)}"
    assert {n for n in named if not (ROOT / "python" / n).is_file()} == set()
    # Installed each into its own folder (a subpackage's files are not flattened into kvoffload/).
    assert re.search(r"DESTINATION \$\{KVOFFLOAD_PYTHON_INSTALL_DIR\}/\$\{_kvo_py_dir\}", cmake)
