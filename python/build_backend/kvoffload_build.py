"""PEP 517 build backend for `pip install .`: builds kvoffload with CMake for the interpreter pip
runs, and packs the `kvoffload` package into a wheel.

    pip install --no-build-isolation .                 # into the environment of that pip
    pip install --no-build-isolation . --config-settings cmake-args="-DKVOFFLOAD_CUDA=OFF" \
        --config-settings build-dir=build/pip

Why not setuptools: the build needs only CMake, a C++ compiler and pybind11's CMake package
(Debian: pybind11-dev); with this backend it needs nothing from the target environment but pip
and the standard library. setuptools would add requirements that offline environments often
cannot meet: Debian 12's setuptools 66 (like any before 70.1) builds wheels only with the separate
`wheel` package, which pyenv's and many venvs' interpreters lack, and Python 3.12+ venvs come
without setuptools at all. Nothing here is installed but the wheel.

The wheel holds kvoffload/ as the build installs it with the library directory set to the
package itself: __init__.py, the vLLM backend's package vllm/, _cli.py, the type stubs
(_kvoffload.pyi, __init__.pyi) with py.typed, the extension _kvoffload*.so, libkvoffload.so.N
(found through the extension's $ORIGIN RPATH), the GPU backend modules built (libkvoffload_cuda.so / _hip.so, loaded from libkvoffload's
directory) and bin/kvoffload (the program, run by the `kvoffload` console script).

Config settings (pip --config-settings KEY=VALUE, or -C from pip 23.1 on):
  cmake-args   extra CMake arguments (also from $KVOFFLOAD_CMAKE_ARGS), e.g. -DKVOFFLOAD_CUDA=ON
  build-dir    keep the CMake build there (reused by the next build) instead of a temporary one
  jobs         parallel build jobs (default: the CPU count)
Defaults: Release, KVOFFLOAD_CUDA/HIP=AUTO (a backend is built when its compiler is found: nvcc on
PATH or under /usr/local/cuda, hipcc), no tests, no benchmarks.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "kvoffload"
SUMMARY = "KV-cache offload from GPU memory to a pinned host pool shared by all ranks of an engine"


def _version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(kvoffload VERSION ([0-9.]+)", text)
    if not m:
        raise RuntimeError("kvoffload_build: no `project(kvoffload VERSION x.y.z` in CMakeLists.txt")
    return m.group(1)


def _tag() -> str:
    impl = sys.implementation.name
    if impl != "cpython":
        raise RuntimeError(f"kvoffload_build: {impl} is not supported (the extension is for CPython)")
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = py + getattr(sys, "abiflags", "")
    plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"{py}-{abi}-{plat}"


def _setting(settings, key: str, default=None):
    value = (settings or {}).get(key, default)
    if isinstance(value, list):  # pip passes repeated -C key=... as a list
        value = " ".join(value)
    return value


def _run(cmd: list[str], **kw) -> None:
    print("kvoffload_build: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


_STEP = re.compile(r"^\[\s*(\d+)/(\d+)\]|^\[\s*(\d+)%\]")


def _open_tty():
    """The controlling terminal, for text pip does not swallow: pip captures the backend's stdout
    and stderr and shows them only with -v or when the build fails. None when the process has
    no terminal (CI, a daemon, `pip ... </dev/null >log` under setsid): never an error."""
    try:
        return open("/dev/tty", "w", encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError:
        return None


def _build_with_progress(cmd: list[str], build_dir: Path, env: dict) -> None:
    """Runs the CMake build, passing every line on to stdout (pip's log: `pip install -v` shows it)
    and to build_dir/kvoffload-build.log, and writing one progress line per compiled file
    ("[12/240] Building CXX object ...") to the terminal, where pip's capture does not reach.
    Without a terminal, one line says where the full log is."""
    log_path = build_dir / "kvoffload-build.log"
    tty = _open_tty()
    print("kvoffload_build: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    hint = (f"kvoffload_build: the build's full output: {log_path} "
            "(or `pip install -v .`)")
    if tty is None:
        print(hint, flush=True)
        # pip shows nothing of stdout without -v; stderr of the backend neither, but a caller
        # running the backend directly (python -m build, tests) sees it.
        print(hint, file=sys.stderr, flush=True)
    else:
        tty.write(hint + "\n")
        tty.flush()
    try:
        with open(log_path, "w", encoding="utf-8", errors="replace") as log, subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", bufsize=1) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
                if tty is not None and _STEP.match(line):
                    text = "kvoffload_build: " + line.strip()
                    try:
                        tty.write("\r" + text[:150] + "\033[K")
                        tty.flush()
                    except OSError:  # the terminal went away (ssh closed): go on without it
                        tty = None
            proc.wait()
            end = "\n" if proc.returncode == 0 else (
                f"\nkvoffload_build: the build failed; full output: {log_path}\n")
            if tty is not None:
                try:
                    tty.write(end)
                    tty.flush()
                except OSError:
                    pass
            if proc.returncode != 0:
                raise subprocess.CalledProcessError(proc.returncode, cmd)
    finally:
        if tty is not None:
            try:
                tty.close()
            except OSError:
                pass


def _metadata(version: str) -> str:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {version}\n"
        f"Summary: {SUMMARY}\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.10\n"
    )


def _dist_info_files(version: str, tag: str) -> dict[str, bytes]:
    info = f"{NAME}-{version}.dist-info"
    return {
        f"{info}/METADATA": _metadata(version).encode(),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\n"
            "Generator: kvoffload_build\n"
            "Root-Is-Purelib: false\n"
            f"Tag: {tag}\n"
        ).encode(),
        f"{info}/entry_points.txt": b"[console_scripts]\nkvoffload = kvoffload._cli:main\n",
    }


def _package_files(package_dir: Path) -> dict[str, Path]:
    """Wheel path -> file, for what the install put in <stage>/kvoffload. A shared library goes in
    once, under its SONAME link's name (what the loader asks for: libkvoffload.so.0); the other
    links (libkvoffload.so) and the CMake and pkg-config files stay out."""
    soname = re.compile(r"\.so\.\d+$")
    paths = sorted(p for p in package_dir.rglob("*")
                   if p.relative_to(package_dir).parts[0] not in ("cmake", "pkgconfig", "__pycache__"))
    by_soname = {p.resolve() for p in paths if p.is_symlink() and soname.search(p.name)}
    out: dict[str, Path] = {}
    for path in paths:
        name = f"{NAME}/{path.relative_to(package_dir).as_posix()}"
        if path.is_symlink():
            if soname.search(path.name):
                out[name] = path.resolve()
        elif path.is_file() and path not in by_soname:
            out[name] = path
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_dir: Path, version: str, files: dict[str, Path]) -> str:
    tag = _tag()
    name = f"{NAME}-{version}-{tag}.whl"
    info = f"{NAME}-{version}.dist-info"
    records = []
    tmp = wheel_dir / (name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, src in files.items():
            data = src.read_bytes()
            zi = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            # pip restores the executable bit only for entries marked as regular files.
            mode = 0o755 if os.access(src, os.X_OK) else 0o644
            zi.external_attr = (stat.S_IFREG | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
            records.append(_record_line(arcname, data))
        for arcname, data in _dist_info_files(version, tag).items():
            zf.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        records.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    tmp.rename(wheel_dir / name)
    return name


def _build(build_dir: Path, stage: Path, settings) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("kvoffload_build: cmake is not on PATH (Debian: tools/setup/install-deps.sh)")
    extra = shlex.split(os.environ.get("KVOFFLOAD_CMAKE_ARGS", ""))
    extra += shlex.split(_setting(settings, "cmake-args", "") or "")
    generator = ["-G", "Ninja"] if shutil.which("ninja") and not (build_dir / "Makefile").exists() else []
    env = dict(os.environ)
    # A kept build dir may have been configured for another interpreter: FindPython and pybind11
    # keep that interpreter's headers and module suffix in the cache even when Python_EXECUTABLE
    # changes, so forget them and let this configure find this interpreter's. Only the extension
    # rebuilds; the library and the program do not depend on Python.
    forget = []
    if (build_dir / "CMakeCache.txt").exists():
        forget = ["-U_Python_*", "-UPYBIND11_PYTHON_EXECUTABLE_LAST", "-UPYTHON_MODULE_EXTENSION",
                  "-UPYTHON_IS_DEBUG", "-Upybind11_INCLUDE_DIRS"]
    # nvcc is looked up under /usr/local/cuda too (cmake/KvoffloadGpu.cmake).
    _run([cmake, "-S", str(ROOT), "-B", str(build_dir), *generator, *forget,
          "-DCMAKE_BUILD_TYPE=Release",
          f"-DPython_EXECUTABLE={sys.executable}",
          "-DKVOFFLOAD_PYTHON_NEEDS_NUMPY=OFF",
          "-DKVOFFLOAD_BUILD_TESTS=OFF", "-DKVOFFLOAD_BUILD_BENCH=OFF",
          # Everything the package needs lands in <prefix>/kvoffload: the library next to the
          # extension ($ORIGIN), the program in kvoffload/bin ($ORIGIN/..).
          f"-DCMAKE_INSTALL_PREFIX={stage}", f"-DCMAKE_INSTALL_LIBDIR={NAME}",
          f"-DCMAKE_INSTALL_BINDIR={NAME}/bin", "-DKVOFFLOAD_PYTHON_INSTALL_DIR=.",
          *extra], env=env)
    jobs = str(_setting(settings, "jobs", os.cpu_count() or 1))
    print(f"kvoffload_build: building in {build_dir} with {jobs} jobs (several minutes)", flush=True)
    _build_with_progress([cmake, "--build", str(build_dir), "-j", jobs], build_dir, env)
    _run([cmake, "--install", str(build_dir), "--prefix", str(stage)], env=env)


# --- PEP 517 hooks ---

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """The wheel's .dist-info without building anything: pip asks for it first ("Preparing
    metadata"), and without this hook it runs the whole CMake build to get it, showing nothing but
    "Preparing metadata ... still running" for as long as the build takes. build_wheel then writes
    the same files (_dist_info_files)."""
    version = _version()
    info = f"{NAME}-{version}.dist-info"
    for name, data in _dist_info_files(version, _tag()).items():
        path = Path(metadata_directory) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    keep = _setting(config_settings, "build-dir")
    with tempfile.TemporaryDirectory(prefix="kvoffload-build-") as tmp:
        build_dir = Path(keep).resolve() if keep else Path(tmp) / "build"
        if keep and not build_dir.is_absolute():
            build_dir = ROOT / build_dir
        stage = Path(tmp) / "stage"
        _build(build_dir, stage, config_settings)
        package_dir = stage / NAME
        files = _package_files(package_dir)
        missing = [f for f in ("__init__.py", "vllm/__init__.py", "vllm/spec.py", "_cli.py")
                   if f"{NAME}/{f}" not in files]
        if missing or not any(re.match(rf"{NAME}/_kvoffload\..*so$", k) for k in files):
            raise RuntimeError(f"kvoffload_build: the install in {package_dir} lacks the package "
                               f"files ({missing or '_kvoffload*.so'}); found {sorted(files)}")
        return _write_wheel(Path(wheel_directory), version, files)
