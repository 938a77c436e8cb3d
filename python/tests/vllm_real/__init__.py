"""vLLM's real modules in kvoffload's tests: one place that finds the vLLM source tree, stubs what
cannot be imported here, and skips (with the reason) where there is no tree.

    import vllm_real
    vllm_real.require()        # at the top of a test module, before importing vllm
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager   # vLLM's own file

- The tree is named by KVOFFLOAD_VLLM_SRC (a directory holding vllm/v1/kv_offload/, such as the
  vLLM sources at one commit that .ci/run points at). Unset: require() skips the calling module
  with a message naming the variable. Set but wrong (no such directory, or a vLLM installed
  elsewhere would shadow it): require() raises, so a misconfigured CI fails instead of skipping.
- torch is replaced by vllm_real.torch_stub (a real torch, if one was imported already, is an
  error: the stub's tensors are what the tests hand to kvoffload). vLLM modules the tree lacks are
  the minimal stand-ins in vllm_real.vllm_stubs. Everything else is vLLM's code from the tree.
- sim_tensor() makes a torch-like tensor on a simulated GPU (kvoffload's `sim` backend), so the
  worker runs its GPU path on device memory the host cannot dereference.

Also used outside pytest (python/bench/vllm_manager_bench.py): require() then raises instead of
skipping when the variable is unset.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from . import torch_stub, vllm_stubs

ENV = "KVOFFLOAD_VLLM_SRC"
_installed: Path | None = None


class VllmTreeError(RuntimeError):
    pass


def tree() -> Path | None:
    """The vLLM source tree named by KVOFFLOAD_VLLM_SRC, or None when the variable is unset."""
    value = os.environ.get(ENV)
    if not value:
        return None
    path = Path(value).resolve()
    marker = path / "vllm" / "v1" / "kv_offload" / "base.py"
    if not marker.is_file():
        raise VllmTreeError(
            f"{ENV}={value}: {marker} does not exist; point {ENV} at a vLLM source tree "
            "(the directory that contains vllm/v1/kv_offload/)"
        )
    return path


def _skip(reason: str):
    if "pytest" in sys.modules:
        import pytest

        pytest.skip(reason, allow_module_level=True)
    raise VllmTreeError(reason)


def require() -> Path:
    """Makes vLLM's modules from the tree importable (once per process) and returns the tree.

    Skips the calling test module when KVOFFLOAD_VLLM_SRC is unset; raises when it is wrong.
    """
    global _installed
    src = tree()
    if src is None:
        # Tagged for the CI skip policy (tests/accepted_skips.txt does not accept it): in CI a
        # missing tree fails these tests instead of letting them pass as skipped.
        _skip(f"[no-vllm-src] vLLM's sources are needed: set {ENV} to a vLLM source tree "
              "(tools/test.sh copies the kv_offload part of each ../shared/vllm-*-engine tree into "
              "build/cpu/vllm-src/ with tools/vllm_src_view.py and points it there)")
    if _installed is not None:
        if _installed != src:
            raise VllmTreeError(f"{ENV} changed from {_installed} to {src} within one process")
        return src
    _install_torch()
    sys.path.insert(0, str(src))
    for name, build in vllm_stubs.STUBS.items():
        sys.modules[name] = build(src)
    for name in vllm_stubs.STUBS:  # `import a.b.c` then `a.b.c` works, as for real submodules
        parent, _, child = name.rpartition(".")
        setattr(importlib.import_module(parent), child, sys.modules[name])
    base = importlib.import_module("vllm.v1.kv_offload.base")
    if not Path(base.__file__).resolve().is_relative_to(src):
        raise VllmTreeError(
            f"vllm.v1.kv_offload.base was imported from {base.__file__}, not from {ENV}={src}: "
            "an installed vLLM shadows the tree (run the tests in an environment without it)"
        )
    _installed = src
    return src


def _install_torch() -> None:
    real = sys.modules.get("torch")
    if real is not None and real is not torch_stub:
        raise VllmTreeError(
            "torch was imported before vllm_real.require(): the vLLM tests hand kvoffload "
            "tensors of vllm_real.torch_stub and cannot mix them with a real torch"
        )
    sys.modules["torch"] = torch_stub
    sys.modules["torch.cuda"] = torch_stub.cuda
    sys.modules["torch.accelerator"] = torch_stub.accelerator


def sim_tensor(runtime, shape, dtype=None, device_index: int = 0):
    """A C-contiguous torch-like tensor in a simulated GPU's memory (kvoffload's `sim` backend).

    The memory is a DeviceBuffer of `runtime` (kept alive by the tensor); read and write it with
    runtime.memcpy_sync. Its device is cuda:<device_index>, as torch would name it.
    """
    dtype = dtype or torch_stub.int8
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= int(s)
    buf = runtime.allocate_device(nbytes)
    strides = []
    step = 1
    for s in reversed(shape):
        strides.append(step)
        step *= int(s)
    return torch_stub.Tensor(address=buf.address, shape=shape, strides=tuple(reversed(strides)),
                             dtype=dtype, device=torch_stub.device("cuda", device_index),
                             owner=buf)
