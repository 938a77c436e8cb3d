"""vLLM's real modules in kvoffload's tests, run under the vLLM harness (../shared/vllm-harness in
this workplace): vLLM's code from one of the engine trees (vLLM's files at one commit with the
whole import chain), with the harness's stand-ins for the third-party libraries Debian lacks
(torch, msgspec, ...). Nothing of vLLM is stubbed or re-declared here.

    import vllm_real
    vllm_real.require()        # at the top of a test module, before importing vllm
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager   # vLLM's own file

- The harness's boot module (its sitecustomize, PYTHONPATH=<harness>/boot) must have run in this
  interpreter: tools/vllm-engine-tests.sh runs python/tests/test_vllm_*.py that way on every
  supported commit's tree, and tools/vllm-python.sh runs a script (the benches) that way. Without
  it require() skips the calling module with a tagged reason that CI does not accept (outside
  pytest it raises), so a CI run that forgets the harness fails instead of skipping.
- torch is the harness's stand-in (numpy-backed tensors); sim_tensor() makes one of its tensors
  over device memory of kvoffload's simulated GPU (the `sim` backend), which the host never reads.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np


class VllmTreeError(RuntimeError):
    pass


def _skip(reason: str):
    if "pytest" in sys.modules:
        import pytest

        pytest.skip(reason, allow_module_level=True)
    raise VllmTreeError(reason)


def tree() -> Path | None:
    """The vLLM tree the harness booted this interpreter with, or None outside the harness."""
    boot = sys.modules.get("vllm_harness_boot")
    return None if boot is None else Path(boot.TREE).resolve()


def require() -> Path:
    """Checks that vLLM's modules come from the harness's tree and torch is its stand-in, and
    returns the tree. Skips the calling test module (raises outside pytest) without the harness."""
    src = tree()
    if src is None:
        # Tagged for the CI skip policy (tests/accepted_skips.txt does not accept it).
        _skip("[no-vllm-src] vLLM's engine loop is needed: run these tests under the vLLM harness "
              "(tools/vllm-engine-tests.sh runs python/tests/test_vllm_*.py on every supported "
              "vLLM commit; tools/vllm-python.sh TREE runs a script)")
    stubs = Path(sys.modules["vllm_harness_boot"].STUBS).resolve()
    import torch

    if not Path(torch.__file__).resolve().is_relative_to(stubs):
        raise VllmTreeError(f"torch was imported from {torch.__file__}, not from the vLLM harness's "
                            f"stand-in in {stubs}: the tests' tensors are the harness's")
    base = importlib.import_module("vllm.v1.kv_offload.base")
    if not Path(base.__file__).resolve().is_relative_to(src):
        raise VllmTreeError(
            f"vllm.v1.kv_offload.base was imported from {base.__file__}, not from the harness's "
            f"tree {src}: an installed vLLM shadows the tree (run the tests without it)")
    return src


class _DeviceMemory:
    """numpy's array interface over memory at an address the host never dereferences."""

    def __init__(self, address: int, shape, strides, np_dtype, owner):
        self.__array_interface__ = {
            "version": 3, "data": (int(address), False), "typestr": np.dtype(np_dtype).str,
            "shape": tuple(int(s) for s in shape), "strides": tuple(int(s) for s in strides),
        }
        self.owner = owner  # keeps the device memory alive as long as the array


def device_tensor(address: int, shape, strides, dtype, device, owner):
    """A harness torch tensor at `address` on `device` (strides in elements, as torch's), whose
    memory `owner` keeps alive. Its data_ptr(), shape, stride(), dtype and device are torch's;
    the host must never read its elements (device memory)."""
    import torch

    np_dtype = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    mem = _DeviceMemory(address, shape, [s * np_dtype.itemsize for s in strides], np_dtype, owner)
    return torch.Tensor(np.asarray(mem), dtype, torch.device(device))


def sim_tensor(runtime, shape, dtype=None, device_index: int = 0):
    """A C-contiguous torch tensor in a simulated GPU's memory (kvoffload's `sim` backend).

    The memory is a DeviceBuffer of `runtime` (kept alive by the tensor); read and write it with
    runtime.memcpy_sync. Its device is cuda:<device_index>, as torch would name it.
    """
    import torch

    dtype = dtype or torch.int8
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= int(s)
    buf = runtime.allocate_device(nbytes)
    strides = []
    step = 1
    for s in reversed(shape):
        strides.append(step)
        step *= int(s)
    return device_tensor(buf.address, shape, tuple(reversed(strides)), dtype,
                         torch.device("cuda", device_index), owner=buf)
