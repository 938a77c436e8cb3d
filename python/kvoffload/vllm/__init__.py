"""kvoffload as a drop-in backend for vLLM's OffloadingConnector.

Select it with ``spec_name="KvoffloadSpec"`` and ``spec_module_path="kvoffload.vllm"`` in the
connector's ``kv_connector_extra_config`` (docs/VLLM.md, "vLLM integration", has the whole
``--kv-transfer-config``). The package's modules:

- :mod:`kvoffload.vllm.spec`: :class:`KvoffloadSpec`, the ``OffloadingSpec``: the scheduler side
  gets a KvoffloadManager (or the node pool's PoolManager), the worker side a KvoffloadWorker.
- :mod:`kvoffload.vllm.manager`: :class:`KvoffloadManager`, vLLM's ``OffloadingManager`` with the
  observable behaviour of ``CPUOffloadingManager``, backed by kvoffload's C++ Manager.
- :mod:`kvoffload.vllm.worker`: :class:`KvoffloadWorker`, moving blocks between the KV-cache
  tensors and kvoffload's shared host Region with a TransferEngine (CUDA, HIP, or for tests host
  and sim).
- :mod:`kvoffload.vllm.pool` (also ``kvoffload.vllm_pool``): the node pool,
  ``"kvoffload_pool": "node"``.
- :mod:`kvoffload.vllm.tiers` (also ``kvoffload.vllm_tiers``): ``remote`` and ``file``
  (:class:`KvoffloadRemoteTier`, :class:`KvoffloadFileTier`), secondary tiers for vLLM's own
  ``TieringOffloadingSpec``: ``{"type": "remote", "module_path": "kvoffload.vllm", "url": ...}``.
- ``kvoffload.vllm_compat`` stays outside the package: it names the supported vLLM commits and
  judges block-hash sharing without importing vLLM (this package's import needs vLLM).

Importing this package needs vLLM; without it the import fails with an ImportError that says so.
"""

from __future__ import annotations

import importlib

try:
    importlib.import_module("vllm")  # vLLM itself first, for the clearer message below
except ImportError as _err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "kvoffload.vllm is the vLLM offloading backend and needs vLLM installed "
        "(pip install vllm); the rest of kvoffload works without it"
    ) from _err

# Every name of vLLM's offloading API the modules below use, checked once, here.
_VLLM_API = {
    "vllm.v1.kv_offload.base": (
        "LookupResult", "Medium", "OffloadingCounterMetadata", "OffloadingEvent",
        "OffloadingGaugeMetadata", "OffloadingHistogramMetadata", "OffloadingManager",
        "OffloadingMetricMetadata", "OffloadingSpec", "OffloadingWorker", "PrepareStoreOutput",
        "RequestOffloadingContext", "TransferResult"),
    "vllm.v1.kv_offload.cpu.common": ("CPULoadStoreSpec", "CPUOffloadingMetrics"),
}


def _check_vllm_api() -> None:
    missing = []
    for module, names in _VLLM_API.items():
        try:
            found = importlib.import_module(module)
        except ImportError as err:  # pragma: no cover - depends on the installed vLLM
            missing.append(f"{module} ({err})")
            continue
        missing += [f"{module}.{n}" for n in names if not hasattr(found, n)]
    if missing:  # pragma: no cover - depends on the installed vLLM
        raise ImportError(
            "kvoffload.vllm supports vLLM's offloading API in vllm/v1/kv_offload/base.py and "
            "vllm/v1/kv_offload/cpu/common.py (OffloadingManager, OffloadingSpec, "
            "OffloadingWorker, CPULoadStoreSpec, the offloading metric metadata); the installed "
            "vLLM lacks part of it: " + ", ".join(missing))


_check_vllm_api()

from ..vllm_compat import SUPPORTED_VLLM_COMMITS, check_block_hashes_shareable, check_vllm_version
from .manager import KvoffloadManager, metric_definitions
from .spec import KvoffloadSpec, bringup_settings
from .worker import KvoffloadWorker

# The tier classes are exported but resolved lazily by __getattr__ below (a linter sees no
# definition of them, hence the unpacking).
_TIER_CLASSES = ("KvoffloadRemoteTier", "KvoffloadFileTier")
_TIERS = (*_TIER_CLASSES, "remote", "file")

__all__ = ["KvoffloadManager", "KvoffloadSpec", "KvoffloadWorker", "bringup_settings",
           "check_block_hashes_shareable", "metric_definitions", *_TIER_CLASSES]


def __getattr__(name: str):
    # The secondary tiers need vLLM's tiering framework (vllm/v1/kv_offload/tiering/), which older
    # vLLMs lack: they are imported when vLLM's SecondaryTierFactory asks for them, so the spec
    # above keeps working without it.
    if name in _TIERS:
        try:
            from . import tiers
        except ImportError as err:
            raise ImportError(
                f"kvoffload.vllm.{name} is a secondary tier for vLLM's TieringOffloadingSpec and "
                f"needs vLLM's tiering framework (vllm/v1/kv_offload/tiering/): {err}") from err
        return getattr(tiers, name)
    raise AttributeError(f"module 'kvoffload.vllm' has no attribute {name!r}")


# The vLLM commits whose offloading interface and engine loop this package is tested against
# (docs/VLLM.md); VLLM_COMMIT is the first. A vLLM naming another commit is logged once here.
VLLM_COMMIT = next(iter(SUPPORTED_VLLM_COMMITS))
check_vllm_version(getattr(importlib.import_module("vllm"), "__version__", "unknown"))
