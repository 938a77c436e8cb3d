"""SGLang's real HiCache modules in kvoffload's tests: finds SGLang's source tree, installs
import-time stand-ins for the SGLang modules that tree lacks, and skips (with the reason) where
there is no tree.

- The tree is named by KVOFFLOAD_SGLANG_SRC: a directory holding
  python/sglang/srt/mem_cache/hicache_storage.py (SGLang's HiCache files at one commit; .ci/run
  points it at ../shared/sglang-17313cf4b2). Unset: require() skips the calling module with the
  tag [no-sglang-src], which CI does not accept (tests/accepted_skips.txt), so a CI run without
  the tree fails. Set but wrong: require() raises.
- torch is Debian's python3-torch (real: SGLang's host pools allocate and index real tensors).
  torch 1.13 lacks torch.dtype.itemsize and torch.uint64, which SGLang's pools use: shim_torch()
  adds both for this process.
- The stand-ins (install_stubs) are names the imports need, not SGLang behaviour: device pool
  classes the host pools test with isinstance, platform probes that say "no GPU", JIT kernels that
  refuse to run, a process-group getter, the StorageMetrics record and, for the controller, a
  CPU device module whose events are always complete. SGLang's logic runs unchanged.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import types
import unittest
from pathlib import Path

ENV = "KVOFFLOAD_SGLANG_SRC"
_MARKER = Path("python/sglang/srt/mem_cache/hicache_storage.py")
_installed: Path | None = None


class SglangTreeError(RuntimeError):
    pass


def tree() -> Path | None:
    value = os.environ.get(ENV)
    if not value:
        return None
    path = Path(value).resolve()
    if not (path / _MARKER).is_file():
        raise SglangTreeError(f"{ENV}={value}: {path / _MARKER} does not exist; point {ENV} at "
                              "SGLang's source tree (the directory that contains python/sglang/)")
    return path


def require() -> Path:
    """Makes SGLang's modules importable (once per process) and returns the tree."""
    global _installed
    src = tree()
    if src is None:
        reason = (f"[no-sglang-src] SGLang's sources are needed: set {ENV} to an SGLang source "
                  "tree (.ci/run uses ../shared/sglang-17313cf4b2)")
        if "pytest" in sys.modules:
            import pytest

            pytest.skip(reason, allow_module_level=True)
        raise SglangTreeError(reason)
    if _installed is not None:
        return src
    # SGLang's files must not be compiled into the shared tree (its README asks for this).
    sys.dont_write_bytecode = True
    shim_torch()
    install_stubs()
    sys.path.insert(0, str(src / "python"))
    import sglang.srt.mem_cache.hicache_storage as hs

    if not Path(hs.__file__).resolve().is_relative_to(src):
        raise SglangTreeError(f"sglang was imported from {hs.__file__}, not from {ENV}={src}")
    _installed = src
    return src


def shim_torch() -> None:
    import torch

    if not hasattr(torch, "uint64"):
        torch.uint64 = torch.int64  # SGLang only stores data_ptr() values in it
    if not hasattr(torch.float32, "itemsize"):
        d = gc.get_referents(torch.dtype.__dict__)[0]
        d["itemsize"] = property(lambda self: torch.empty((), dtype=self).element_size())
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(torch.dtype))


def _mod(name: str, **attrs) -> types.ModuleType:
    m = sys.modules.get(name)
    if m is None:
        m = types.ModuleType(name)
        sys.modules[name] = m
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, m)
    m.__dict__.update(attrs)
    return m


class StorageMetrics:
    """sglang.srt.observability.metrics_collector.StorageMetrics: the four lists backends fill."""

    def __init__(self):
        self.prefetch_pgs: list = []
        self.backup_pgs: list = []
        self.prefetch_bandwidth: list = []
        self.backup_bandwidth: list = []


def install_stubs() -> None:
    import re

    def human_readable_int(value):
        value = str(value).strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
        if not m:
            return int(value)
        n, s = m.groups()
        iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
        return int(n) * iec[s] if s in iec else int(float(n) * si[s])

    class _Event:
        def record(self, *a, **k): pass
        def query(self): return True
        def synchronize(self): pass
        def wait(self, *a, **k): pass

    device = types.SimpleNamespace(
        Event=_Event, Stream=lambda *a, **k: None,
        current_stream=lambda: types.SimpleNamespace(wait_event=lambda e: None))
    utils = _mod("sglang.srt.utils", __path__=[], get_device_module=lambda: device,
                 **{n: (lambda: False) for n in ("is_cuda", "is_hip", "is_mps", "is_npu",
                                                 "is_xpu")})
    utils.common = _mod("sglang.srt.utils.common", human_readable_int=human_readable_int)
    _mod("sglang.test.test_utils", CustomTestCase=unittest.TestCase)
    _mod("sglang.srt.observability", __path__=[])
    _mod("sglang.srt.observability.metrics_collector", StorageMetrics=StorageMetrics)

    def _no_kernel(*a, **k):
        raise RuntimeError("SGLang's JIT kernels need a GPU (not in these tests)")

    for name in ("sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.kvcache"):
        _mod(name, __path__=[])
    _mod("sglang.kernels.ops.kvcache.hicache",
         can_use_hicache_jit_kernel=lambda **k: False,
         can_use_write_back_jit_kernel=lambda **k: False,
         **{n: _no_kernel for n in (
             "transfer_hicache_all_layer", "transfer_hicache_all_layer_mla",
             "transfer_hicache_all_layer_mla_staged_lf_pf",
             "transfer_hicache_all_layer_staged_lf_pf", "transfer_hicache_one_layer",
             "transfer_hicache_one_layer_mla")})

    class KVCache:
        pass

    class MHATokenToKVPool(KVCache):
        pass

    class MHATokenToKOnlyPool(KVCache):
        pass

    class MLATokenToKVPool(KVCache):
        pass

    _mod("sglang.srt.mem_cache.memory_pool", KVCache=KVCache, MHATokenToKVPool=MHATokenToKVPool,
         MHATokenToKOnlyPool=MHATokenToKOnlyPool, MLATokenToKVPool=MLATokenToKVPool)
    _mod("sglang.srt.distributed", __path__=[])

    def get_world_group():
        raise AssertionError("no process group in these tests")

    _mod("sglang.srt.distributed.parallel_state", get_world_group=get_world_group)
    _mod("sglang.srt.runtime_context", get_parallel=lambda: types.SimpleNamespace(nnodes=1))
    _mod("sglang.srt.layers", __path__=[])
    _mod("sglang.srt.layers.dp_attention", get_attention_dp_rank=lambda: 0,
         get_attention_dp_size=lambda: 1, is_dp_attention_enabled=lambda: False)

    class L2Transfer:
        pass

    class L2TransferEngine:
        def __init__(self, *a, **k):
            pass

    _mod("sglang.srt.mem_cache.l2_transfer", L2Transfer=L2Transfer,
         L2TransferEngine=L2TransferEngine)
