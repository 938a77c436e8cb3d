"""kvoffload as a drop-in backend for vLLM's OffloadingConnector.

(Over ~500 lines: the three classes vLLM loads from this one module path, the spec, its manager
and its worker, share the import checks of vLLM's interface and the metric names below.)

Select it with ``spec_name="KvoffloadSpec"`` and ``spec_module_path="kvoffload.vllm"`` in the
connector's ``kv_connector_extra_config`` (docs/VLLM.md, "vLLM integration", has the whole
``--kv-transfer-config``).

- :class:`KvoffloadManager` is vLLM's ``OffloadingManager`` with the observable behaviour of
  ``CPUOffloadingManager`` (same constructor keywords, same lookups, block ids, evictions, events,
  store threshold and statistics), backed by kvoffload's C++ Manager in its vLLM semantics
  (``ManagerSemantics::kVllm``). Keys cross the binding a call at a time, hashed to 128 bits in C++.
- :class:`KvoffloadSpec` is an ``OffloadingSpec``: the scheduler side gets a KvoffloadManager, the
  worker side a :class:`KvoffloadWorker` that moves blocks between the KV-cache tensors and
  kvoffload's shared host Region with a TransferEngine (CUDA, HIP, or for tests host and sim).
- ``remote`` and ``file`` (:class:`KvoffloadRemoteTier`, :class:`KvoffloadFileTier`, from
  ``kvoffload.vllm_tiers``) are secondary tiers for vLLM's own ``TieringOffloadingSpec``:
  ``{"type": "remote", "module_path": "kvoffload.vllm", "url": "redis://..."}``.

Importing this module needs vLLM; without it the import fails with an ImportError that says so.
"""

from __future__ import annotations

import collections
import importlib
import itertools
import logging
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

try:
    importlib.import_module("vllm")  # vLLM itself first, for the clearer message below
except ImportError as _err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "kvoffload.vllm is the vLLM offloading backend and needs vLLM installed "
        "(pip install vllm); the rest of kvoffload works without it"
    ) from _err

try:
    from vllm.v1.kv_offload.base import (
        LookupResult,
        Medium,
        OffloadingCounterMetadata,
        OffloadingEvent,
        OffloadingGaugeMetadata,
        OffloadingHistogramMetadata,
        OffloadingManager,
        OffloadingMetricMetadata,
        OffloadingSpec,
        OffloadingWorker,
        PrepareStoreOutput,
        RequestOffloadingContext,
        TransferResult,
    )
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics
except ImportError as _err:  # pragma: no cover - depends on the installed vLLM
    raise ImportError(
        "kvoffload.vllm supports vLLM's offloading API in vllm/v1/kv_offload/base.py and "
        "vllm/v1/kv_offload/cpu/common.py (OffloadingManager, OffloadingSpec, OffloadingWorker, "
        f"CPULoadStoreSpec, the offloading metric metadata); the installed vLLM lacks part of it: {_err}"
    ) from _err

from . import _kvoffload as _ext
from . import vllm_pool
from .vllm_compat import SUPPORTED_VLLM_COMMITS, check_block_hashes_shareable, check_vllm_version

# The tier classes are exported but resolved lazily by __getattr__ below (a linter sees no
# definition of them, hence the unpacking).
_TIER_CLASSES = ("KvoffloadRemoteTier", "KvoffloadFileTier")
_TIERS = (*_TIER_CLASSES, "remote", "file")

__all__ = ["KvoffloadManager", "KvoffloadSpec", "KvoffloadWorker", "check_block_hashes_shareable",
           *_TIER_CLASSES]


def __getattr__(name: str):
    # The secondary tiers need vLLM's tiering framework (vllm/v1/kv_offload/tiering/), which older
    # vLLMs lack: they are imported when vLLM's SecondaryTierFactory asks for them, so the spec
    # above keeps working without it.
    if name in _TIERS:
        try:
            from . import vllm_tiers
        except ImportError as err:
            raise ImportError(
                f"kvoffload.vllm.{name} is a secondary tier for vLLM's TieringOffloadingSpec and "
                f"needs vLLM's tiering framework (vllm/v1/kv_offload/tiering/): {err}") from err
        return getattr(vllm_tiers, name)
    raise AttributeError(f"module 'kvoffload.vllm' has no attribute {name!r}")

logger = logging.getLogger(__name__)

# The vLLM commits whose offloading interface and engine loop this module is tested against
# (docs/VLLM.md); VLLM_COMMIT is the first. A vLLM naming another commit is logged once here.
VLLM_COMMIT = next(iter(SUPPORTED_VLLM_COMMITS))
check_vllm_version(getattr(importlib.import_module("vllm"), "__version__", "unknown"))

# VllmManagerCore.lookup's codes, in order.
_LOOKUP_RESULTS = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)
_POLICIES = ("lru", "arc")


_PLAIN_RESULTS = None


def _plain_results():
    """(new_array, plain_output) for VllmManagerCore.fast_methods: build CPULoadStoreSpec and
    PrepareStoreOutput without their constructors (Note [Plain result objects] in
    python/src/vllm_manager.cpp) when, and only when, that gives what vLLM's constructors give.
    Checked once per process against objects built by vLLM's own classes."""
    global _PLAIN_RESULTS
    if _PLAIN_RESULTS is None:
        _PLAIN_RESULTS = (_check_plain_spec(), _check_plain_output())
    return _PLAIN_RESULTS


def _check_plain_spec():
    import numpy as np

    new_array = (np.empty, np.dtype(np.int64))
    try:
        ref = CPULoadStoreSpec([5, 3])
        plain = _ext.VllmManagerCore.plain_spec(CPULoadStoreSpec, new_array, [5, 3])
        a, b = ref.block_ids, plain.block_ids
        same = (type(plain) is type(ref) and vars(plain).keys() == vars(ref).keys() == {"block_ids"}
                and type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and a.flags.c_contiguous == b.flags.c_contiguous and a.flags.writeable == b.flags.writeable
                and a.flags.owndata == b.flags.owndata and a.tolist() == b.tolist())
    except Exception:  # noqa: BLE001 - any difference means: use the constructor
        same = False
    if not same:
        logger.info("kvoffload: CPULoadStoreSpec is built through its constructor")
    return new_array if same else None


def _check_plain_output():
    if hasattr(PrepareStoreOutput, "__post_init__") or hasattr(PrepareStoreOutput, "__slots__"):
        return False
    try:
        spec = CPULoadStoreSpec([])
        ref = PrepareStoreOutput(keys_to_store=[b"k"], store_spec=spec, evicted_keys=[])
        plain = _ext.VllmManagerCore.plain_output(PrepareStoreOutput, [b"k"], spec, [])
        return type(plain) is type(ref) and vars(plain) == vars(ref) and plain == ref
    except Exception:  # noqa: BLE001
        return False


class _ThresholdCounts:
    """CPUOffloadingManager.counts, read-only: how often lookup() has seen each tracked key.

    The tracker lives in C++ and keeps 128-bit hashes of the keys, not the keys themselves, so
    membership and counts can be asked (``key in counts``, ``counts[key]``, ``counts.get(key)``)
    but the keys cannot be listed or counted.
    """

    def __init__(self, core):
        self._core = core

    def __getitem__(self, key) -> int:
        n = self._core.threshold_count(key)
        if n == 0:
            raise KeyError(key)
        return n

    def get(self, key, default=None):
        n = self._core.threshold_count(key)
        return default if n == 0 else n

    def __contains__(self, key) -> bool:
        return self._core.threshold_count(key) > 0

    def __len__(self) -> int:
        raise TypeError("KvoffloadManager.counts cannot count its keys (the tracker is C++)")

    def __iter__(self) -> Iterator:
        raise TypeError("KvoffloadManager.counts cannot list its keys: the C++ tracker keeps "
                        "128-bit hashes")


class KvoffloadManager(OffloadingManager):
    """vLLM's CPUOffloadingManager, backed by kvoffload's C++ Manager.

    Keys are vLLM OffloadKeys (bytes); block ids are the region's chunk indices, handed out as
    vLLM's block pool does (never-used ids ascending, then the most recently freed first).
    """

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        ready_region=None,
    ):
        """ready_region: an unranked kvoffload.Region mapped in background mode (the workers'
        region with kvoffload_bringup='background'): only the chunks every rank has brought up
        are handed out (Note [Ready prefix] in python/src/vllm_manager.cpp). The manager takes
        it over and drops it once the whole pool is up."""
        if cache_policy_module_path is not None:
            raise ValueError(
                f"KvoffloadManager: cache_policy_module_path={cache_policy_module_path!r}: "
                "kvoffload implements the lru and arc policies in C++ and cannot load a Python "
                "policy module; leave it unset (or use CPUOffloadingManager for a custom policy)"
            )
        if not isinstance(cache_policy, str) or cache_policy.lower() not in _POLICIES:
            raise ValueError(
                f"KvoffloadManager: cache_policy={cache_policy!r} is not one of {list(_POLICIES)}"
            )
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"KvoffloadManager: num_blocks={num_blocks!r} must be an int >= 0")
        # vLLM counts lookups only for a threshold of 2 or more (1 stores everything).
        threshold = int(store_threshold) if int(store_threshold) >= 2 else 0
        if threshold and int(max_tracker_size) < 1:
            raise ValueError(
                f"KvoffloadManager: max_tracker_size={max_tracker_size!r} must be >= 1 "
                f"with store_threshold={store_threshold}"
            )
        self.medium = Medium.CPU
        self._num_blocks = num_blocks
        self._policy_name = cache_policy.lower()
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.allocation_sizes_in_current_batch: list[int] = []
        self._core = _ext.VllmManagerCore(
            num_blocks, self._policy_name, threshold, int(max_tracker_size) if threshold else 0,
            ready_chunks=None if ready_region is None else 0,
        )
        if ready_region is not None:
            self._core.follow_readiness(ready_region)
        self.counts: _ThresholdCounts | None = _ThresholdCounts(self._core) if threshold else None
        # The hot methods are C functions building vLLM's result objects; as instance attributes
        # they replace the class's methods below for every call (Note [Fast entry points] in
        # python/src/vllm_manager.cpp): no Python frame between vLLM and the C++ Manager.
        new_array, plain_output = _plain_results()
        fast = self._core.fast_methods(
            _ext.Error, _LOOKUP_RESULTS, CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent,
            self.medium, self.events, self.allocation_sizes_in_current_batch,
            new_array=new_array, plain_output=plain_output,
        )
        self.__dict__.update(fast)
        # Stores skipped by the threshold, cumulative in C++, at the last get_stats.
        self._skipped_reported = 0

    # --- OffloadingManager interface ---
    # lookup, touch, prepare_load, complete_load, prepare_store and complete_store are the C
    # functions installed in __init__; these class-level definitions satisfy the abstract base
    # and forward to them (for calls through the class, e.g. super()).

    def on_new_request(self, req_context) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context) -> None:
        return None

    def lookup(self, key, req_context) -> LookupResult:
        return self.__dict__["lookup"](key, req_context)

    def prepare_load(self, keys: Collection, req_context) -> CPULoadStoreSpec:
        return self.__dict__["prepare_load"](keys, req_context)

    def touch(self, keys: Collection, req_context) -> None:
        self.__dict__["touch"](keys, req_context)

    def complete_load(self, keys: Collection, req_context) -> None:
        self.__dict__["complete_load"](keys, req_context)

    def prepare_store(self, keys: Collection, req_context) -> PrepareStoreOutput | None:
        return self.__dict__["prepare_store"](keys, req_context)

    def complete_store(self, keys: Collection, req_context, success: bool = True) -> None:
        self.__dict__["complete_store"](keys, req_context, success=success)

    def reset_cache(self) -> None:
        self._core.reset()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is not None:
            yield from self.events
            self.events.clear()

    def get_stats(self):
        """CPUOffloadingManager.get_stats: the same metrics, names and values (vLLM's scheduler
        calls it every step and OffloadPromMetrics accepts only names the spec defined)."""
        pending, pinned, skipped = self._occupancy()  # a fast entry point: counters()
        n = self._num_blocks
        usage = (pending + pinned) / n if n > 0 else 0.0
        write_usage = pending / n if n > 0 else 0.0
        sizes = self.allocation_sizes_in_current_batch
        skipped_now = None
        if self.store_threshold >= 2:
            skipped_now = skipped - self._skipped_reported
            self._skipped_reported = skipped
        stats = _stats_builder()(usage, write_usage, max(usage - write_usage, 0.0), sizes,
                                 skipped_now)
        sizes.clear()
        return stats

    def shutdown(self) -> None:
        self._core.follow_readiness(None)  # drops the scheduler's mapping of the region, if any


def _stats_by_methods(usage, write_usage, read_usage, sizes, skipped):
    """The stats as CPUOffloadingManager.get_stats builds them, through vLLM's methods."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )

    stats = OffloadingConnectorStats()
    stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
    for allocation_size in sizes:
        stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, allocation_size)
    stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
    stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, read_usage)
    if skipped is not None:
        stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, skipped)
    return stats


def _stats_direct():
    """A builder of the same stats that fills OffloadingConnectorStats.data's two dicts (metric
    types, values per label tuple) directly, with the key names and type strings read off stats
    built by vLLM's methods; None when vLLM's stats do not have that shape."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )

    m = CPUOffloadingMetrics
    probe = _stats_by_methods(0.5, 0.25, 0.25, [1, 4], 3)
    data = getattr(probe, "data", None)
    if not isinstance(data, dict) or len(data) != 2:
        return None
    (types_key, types), (values_key, values) = data.items()
    if set(types) != {m.CPU_CACHE_USAGE_PERC, m.CPU_ALLOCATION_SIZE, m.CPU_CACHE_WRITE_USAGE_PERC,
                      m.CPU_CACHE_READ_USAGE_PERC, m.STORES_SKIPPED}:
        return None
    gauge, histogram, counter = (types[m.CPU_CACHE_USAGE_PERC], types[m.CPU_ALLOCATION_SIZE],
                                 types[m.STORES_SKIPPED])
    gauges = {m.CPU_CACHE_USAGE_PERC: gauge, m.CPU_CACHE_WRITE_USAGE_PERC: gauge,
              m.CPU_CACHE_READ_USAGE_PERC: gauge}

    def build(usage, write_usage, read_usage, sizes, skipped):
        t = {m.CPU_CACHE_USAGE_PERC: gauge}
        v = {m.CPU_CACHE_USAGE_PERC: {(): usage}}
        if sizes:
            t[m.CPU_ALLOCATION_SIZE] = histogram
            v[m.CPU_ALLOCATION_SIZE] = {(): list(sizes)}
        t.update(gauges)
        v[m.CPU_CACHE_WRITE_USAGE_PERC] = {(): write_usage}
        v[m.CPU_CACHE_READ_USAGE_PERC] = {(): read_usage}
        if skipped is not None:
            t[m.STORES_SKIPPED] = counter
            v[m.STORES_SKIPPED] = {(): skipped}
        return OffloadingConnectorStats(data={types_key: t, values_key: v})

    for sample in ((0.75, 0.5, 0.25, [1, 4], 3), (0.0, 0.0, 0.0, [], None), (1.0, 0.125, 0.875, [7], 0)):
        a, b = _stats_by_methods(*sample), build(*sample)
        if type(a) is not type(b) or a.data != b.data or list(a.data) != list(b.data):
            return None
    return build


_STATS_BUILDER = None


def _stats_builder():
    # Note [Stats without methods]: get_stats runs every scheduler step; vLLM's set_gauge /
    # observe_histogram / increase_counter calls (and an import statement) were most of its
    # time. The direct builder is used only when, checked once per process against stats built
    # by vLLM's methods, it gives the same objects; otherwise the methods are used.
    global _STATS_BUILDER
    if _STATS_BUILDER is None:
        try:
            direct = _stats_direct()
        except Exception:  # noqa: BLE001 - any difference means: use vLLM's methods
            direct = None
        if direct is None:
            logger.info("kvoffload: manager stats are built through vLLM's methods")
        _STATS_BUILDER = direct or _stats_by_methods
    return _STATS_BUILDER


def metric_definitions(extra_config: Mapping[str, Any]) -> dict[str, OffloadingMetricMetadata]:
    """The Prometheus metrics KvoffloadManager.get_stats reports: CPUOffloadingManager's, defined
    as CPUOffloadingSpec.build_metric_definitions defines them."""
    definitions: dict[str, OffloadingMetricMetadata] = {
        CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC: OffloadingGaugeMetadata(
            documentation="Fraction of CPU KV-cache space (kvoffload's region) pinned by active "
            "transfers (0.0 = idle, 1.0 = saturated)."
        ),
        CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC: OffloadingGaugeMetadata(
            documentation="Fraction of CPU KV-cache space pinned by in-flight stores."
        ),
        CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC: OffloadingGaugeMetadata(
            documentation="Fraction of CPU KV-cache space pinned by in-flight loads."
        ),
        CPUOffloadingMetrics.CPU_ALLOCATION_SIZE: OffloadingHistogramMetadata(
            documentation="Number of CPU blocks requested by each KV offload prepare_store call.",
            buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144),
        ),
    }
    if int(extra_config.get("store_threshold", 0)) >= 2:
        definitions[CPUOffloadingMetrics.STORES_SKIPPED] = OffloadingCounterMetadata(
            documentation="Number of KV offload stores skipped because the reuse threshold was "
            "not reached."
        )
    return definitions


# Region names: kvoffload's engine-id alphabet (docs/DESIGN.md section 3).
_ENGINE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _device_of(kv_caches) -> tuple[str, int | None]:
    """(type, index) of the KV-cache tensors' device; they must all be on one device."""
    devices = {(t.tensor.device.type, t.tensor.device.index) for t in kv_caches.tensors}
    if len(devices) != 1:
        names = sorted(f"{t}" + ("" if i is None else f":{i}") for t, i in devices)
        raise ValueError(f"KvoffloadWorker: the KV-cache tensors are on several devices {names}; "
                         "one worker serves one device")
    return devices.pop()


# The backends make_runtime knows; "host" and "sim" are for tests.
_BACKENDS = ("auto", "cuda", "hip", "host", "sim")


def _torch_gpu_backend() -> str:
    """The GPU backend matching torch's build: a ROCm torch names its devices "cuda" too, and
    only torch.version.hip tells it apart. Opening the other vendor's module would load a second
    GPU runtime into the engine's process."""
    import torch

    version = getattr(torch, "version", None)
    return "hip" if getattr(version, "hip", None) else "cuda"


def _select_backend(requested: str, device_type: str, device_name: str) -> str:
    """The backend to run, refusing any that cannot address the tensors' memory. Only the module
    of the backend chosen is opened (probe_backend), never every module, and "auto" never
    creates a simulated device in the engine's process."""
    if requested not in _BACKENDS:
        raise ValueError(f"KvoffloadSpec: kvoffload_backend={requested!r} is not one of "
                         f"{list(_BACKENDS)}")
    if requested == "auto":
        if device_type == "cpu":
            return "host"
        gpu = _torch_gpu_backend()
        info = _ext.probe_backend(gpu)
        if not info.built or info.device_count <= 0:
            raise ValueError(
                f"KvoffloadWorker: the KV-cache tensors are on {device_name} (torch built for "
                f"{gpu.upper()}), but this kvoffload has no usable {gpu} backend ({gpu}: "
                f"{info.detail or 'not built'}), and the host backend would memcpy from device "
                f"pointers. Install a kvoffload built with {gpu.upper()} for this machine "
                "(docs/VLLM.md: 'Building for a vLLM environment': pip install . with nvcc or hipcc on "
                f"PATH), or set KVOFFLOAD_BACKEND_DIR to the directory holding libkvoffload_{gpu}.so"
            )
        return gpu
    if requested == "host" and device_type != "cpu":
        raise ValueError(
            f"KvoffloadWorker: kvoffload_backend='host' copies with memcpy, but the KV-cache "
            f"tensors are on {device_name}; use 'auto' (or 'cuda' / 'hip')"
        )
    if requested != "host" and device_type == "cpu":
        raise ValueError(
            f"KvoffloadWorker: kvoffload_backend={requested!r} needs KV-cache tensors on a GPU; "
            "they are on the CPU (use 'host' for host tensors)"
        )
    if requested in ("cuda", "hip") and requested != (gpu := _torch_gpu_backend()):
        raise ValueError(
            f"KvoffloadWorker: kvoffload_backend={requested!r}, but torch is built for "
            f"{gpu.upper()}: the KV-cache tensors on {device_name} are {gpu} memory; use 'auto' "
            f"(or {gpu!r})"
        )
    return requested


class KvoffloadWorker(OffloadingWorker):
    """Moves KV blocks between the engine's KV-cache tensors and kvoffload's shared Region.

    The slot of each chunk is laid out as vLLM's CPU worker lays out its rows: one section per
    unique KV tensor (kv_caches.tensors), in order, each blocks_per_chunk padded pages long
    (CanonicalKVCacheTensor.page_size_bytes); a KV-cache group copies, for each of its layer
    references, the reference's unpadded page into the section of the tensor it points at. A
    chunk holds one group's blocks (vLLM's keys carry the group index), so groups that share
    tensors share sections. A store or load is one asynchronous TransferEngine job.
    """

    def __init__(
        self,
        kv_caches,
        *,
        engine_id: str,
        num_blocks: int,
        blocks_per_chunk: int,
        slot_bytes: int,
        rank: int,
        world_size: int,
        replicated: bool = False,
        backend: str = "auto",
        device: int | None = None,
        shm_dir: str | None = None,
        join_timeout: float = 30.0,
        register_host: bool = True,
        pool_settings=None,
        bringup: str = "blocking",
        bringup_piece_bytes: int | None = None,
        job_timing: bool = True,
    ):
        self._bpc = int(blocks_per_chunk)
        self._job_timing = bool(job_timing)  # kvoffload_job_timing: transfer_time, else None
        self._engine = None
        self._worker = None  # kvoffload.OffloadWorker: this rank's runtime, region and engine
        self._runtime = None
        self._pool = None
        # Job ids per direction in submission order, until vLLM has their results; results
        # collected from the engine wait in _done until get_finished hands them out in that order
        # (Note [Completion order] below).
        self._queues: dict[str, collections.deque[int]] = {
            "store": collections.deque(), "load": collections.deque()}
        self._done: dict[int, TransferResult] = {}
        device_type, device_index = _device_of(kv_caches)
        device_name = device_type if device_index is None else f"{device_type}:{device_index}"
        self._groups, needed = self._layout(kv_caches)
        if needed > slot_bytes:
            raise ValueError(
                f"KvoffloadWorker: the KV-cache tensors need {needed} bytes per chunk "
                f"({self._bpc} blocks of {needed // self._bpc} bytes), but the region's slot, "
                f"from vLLM's worker_kv_bytes_per_block, is {slot_bytes} bytes"
            )
        self._backend = _select_backend(backend, device_type, device_name)
        if device is not None and device_index is not None and int(device) != device_index:
            # The engine copies from and to the tensors' own memory: a runtime on another device
            # would hand the kernel and the DMA engine addresses of another GPU.
            raise ValueError(
                f"KvoffloadWorker: kvoffload_device={int(device)}, but the KV-cache tensors are "
                f"on {device_name}; leave kvoffload_device unset (it defaults to the tensors' "
                f"device) or set it to {device_index}"
            )
        if device is None:
            device = device_index or 0
        self._num_blocks = int(num_blocks)
        if pool_settings is not None:
            # The node pool (kvoffload_pool='node'): this rank's slots of the pool's chunks; the
            # scheduler's PoolManager hands out the pool's slots as block ids. The worker is a
            # tenant of its own (it holds no pins or writes), so the pool stays mapped while the
            # engine copies, and its death is one the pool repairs like any other.
            from .vllm_pool import worker_host_slots

            self._runtime = _ext.make_runtime(self._backend, device=int(device))
            self._pool = pool_settings.attach(f"{engine_id}.rank{rank}")
            try:
                self._engine = _ext.TransferEngine.for_buffer(
                    self._runtime, groups=self._groups, blocks_per_chunk=self._bpc,
                    register_host=register_host, job_timing=self._job_timing,
                    **worker_host_slots(self._pool, 0 if replicated else rank))
            except BaseException:
                self._pool.detach()
                raise
        elif self._num_blocks == 0:
            # vLLM's spec sized the cache to 0 blocks; its manager never stores, so no job comes.
            logger.warning("kvoffload: cpu_bytes_to_use holds no chunk; offloading is off")
        else:
            # The rank assembled by the library (kvoffload.OffloadWorker, docs/DESIGN.md 7.4):
            # the runtime on the tensors' device, the region with each bring-up piece registered
            # as it comes up, the engine told of each piece, and the one safe teardown order.
            # "background" returns once the region is mapped: the scheduler hands out only the
            # chunks every rank has brought up (Note [Ready prefix] in KvoffloadSpec).
            # The worker's own rank even in the replicated layout (where every rank's slot is copy
            # 0): each rank slot has one holder at a time, so a second process on this rank, or a
            # data-parallel replica given the same kvoffload_engine_id, is refused here with
            # kvoffload.Error(IN_USE) naming the holder's PID instead of sharing its slots.
            piece = {} if bringup_piece_bytes is None else {
                "bringup_piece_bytes": int(bringup_piece_bytes),
                "bringup_first_piece_bytes": min(int(bringup_piece_bytes), 64 << 20)}
            self._worker = _ext.OffloadWorker(
                engine_id=engine_id,
                num_chunks=self._num_blocks,
                slot_bytes=int(slot_bytes),
                world_size=world_size,
                rank=rank,
                groups=self._groups,
                blocks_per_chunk=self._bpc,
                backend=self._backend,
                devices=[int(device)],
                replicated=replicated,
                shm_dir=shm_dir,
                join_timeout=join_timeout,
                bringup=bringup,
                job_timing=self._job_timing,
                **piece,
            )
            self._engine = self._worker.engine
        try:
            self._stream_of = self._compute_stream_getter(self._backend, device_index)
        except BaseException:
            self.shutdown()  # the rank is free before the error propagates
            raise

    def _layout(self, kv_caches) -> tuple[list, int]:
        """The engine's KV groups (explicit slot sections) and the slot bytes they reach."""
        bpc = self._bpc
        sections = []
        offset = 0
        for t in kv_caches.tensors:
            sections.append(offset)
            offset += int(t.page_size_bytes) * bpc
        if not kv_caches.group_data_refs:
            raise ValueError("KvoffloadWorker: the KV caches have no KV-cache group")
        groups = []
        for g, refs in enumerate(kv_caches.group_data_refs):
            pages: dict[int, int] = {}
            for ref in refs:
                # Two layers of one group on one tensor copy the same bytes: once, the longer page.
                pages[ref.tensor_idx] = max(pages.get(ref.tensor_idx, 0), int(ref.page_size_bytes))
            if not pages:
                raise ValueError(f"KvoffloadWorker: KV-cache group {g} references no tensor")
            group = []
            for idx, page in pages.items():
                canonical = kv_caches.tensors[idx]
                tensor = canonical.tensor
                padded = int(canonical.page_size_bytes)
                if page > padded:
                    raise ValueError(
                        f"KvoffloadWorker: group {g} copies {page} bytes per block of tensor "
                        f"{idx}, whose page is {padded} bytes")
                stride = int(tensor.stride()[0]) * int(tensor.element_size())
                group.append(_ext.DeviceTensor(
                    int(tensor.data_ptr()), int(tensor.shape[0]), page, stride,
                    host_offset=sections[idx], host_page_stride=padded))
            groups.append(group)
        return groups, offset

    @staticmethod
    def _compute_stream_getter(backend: str, device_index: int | None):
        # Transfers wait for the engine's compute stream (the KV a store reads is written there,
        # and a load must not overtake work queued on the blocks it overwrites).
        if backend in ("cuda", "hip"):
            import torch

            return lambda: torch.cuda.current_stream(device_index).cuda_stream
        return lambda: None

    def _submit(self, job_id: int, direction: str, cpu_spec, gpu_spec) -> bool:
        if self._engine is None:
            logger.error("kvoffload: %s job %d refused: the region has no chunk (cpu_bytes_to_use "
                         "is smaller than one chunk)", direction, job_id)
            return False
        gpu_ids = gpu_spec.block_ids.tolist()
        chunks = cpu_spec.block_ids.tolist()
        sizes = list(gpu_spec.group_sizes)
        indices = list(gpu_spec.block_indices)
        bpc = self._bpc
        group_blocks = []
        group_chunks = []
        b = c = 0
        for size, first in zip(sizes, indices):
            size = int(size)
            skip = int(first) % bpc if size else 0
            n = -(-(skip + size) // bpc) if size else 0
            group_blocks.append(gpu_ids[b:b + size])
            group_chunks.append((chunks[c:c + n], skip))
            b += size
            c += n
        try:
            if len(sizes) != len(self._groups) or b != len(gpu_ids) or c != len(chunks):
                raise _ext.Error(
                    f"the job maps {len(gpu_ids)} GPU blocks in {len(sizes)} groups onto "
                    f"{len(chunks)} chunks; the groups' sizes {sizes} and block indices "
                    f"{indices} need {c} chunks (blocks_per_chunk {bpc}), and the model has "
                    f"{len(self._groups)} KV-cache groups")
            self._engine.submit(job_id, direction, [], group_blocks, group_chunks=group_chunks,
                                wait_stream=self._stream_of())
        except _ext.Error as err:
            # The job never started: vLLM gets False.
            logger.error("kvoffload: %s job %d was refused: %s", direction, job_id, err)
            return False
        self._queues[direction].append(job_id)
        return True

    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._submit(job_id, "store", dst_spec, src_spec)

    def submit_load(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._submit(job_id, "load", src_spec, dst_spec)

    def _collect(self, results) -> None:
        for r in results:
            if not r.success:
                logger.error("kvoffload: %s job %d failed: %s", r.direction, r.job_id, r.error)
            self._done[r.job_id] = TransferResult(job_id=r.job_id, success=r.success,
                                                  transfer_size=r.bytes,
                                                  transfer_time=r.seconds if self._job_timing else None)

    # Note [Completion order]
    # vLLM's CPU worker reports its stores, then its loads, each direction in submission order
    # (a job finishes only after the earlier jobs of its direction), and its wait() only blocks:
    # the results still come out of the next get_finished() in that order. The scheduler's
    # connector completes stores in the order it gets them, which sets the manager's LRU/ARC
    # order, so later evictions and block ids depend on it. kvoffload's engine also finishes
    # each direction in order, but its wait() hands the waited results out first; this worker
    # therefore keeps them and reports as vLLM does.
    def get_finished(self) -> list[TransferResult]:
        if self._engine is not None:
            self._collect(self._engine.poll())
        out = []
        done = self._done
        for queue in self._queues.values():  # stores, then loads
            while queue and queue[0] in done:
                out.append(done.pop(queue.popleft()))
        return out

    def wait(self, job_ids: set[int]) -> None:
        # As vLLM's CPU worker: ids this worker never submitted, or whose results it has handed
        # out already, are ignored (the scheduler sends them on preemption, reset_cache, and
        # when ranks finish at different times). A waited job's direction finishes in order, so
        # the jobs submitted before it are waited for too; every one of their results comes out
        # of the next get_finished().
        if self._engine is None:
            return
        wanted = []
        for queue in self._queues.values():
            last = max((i for i, job in enumerate(queue) if job in job_ids), default=-1)
            wanted.extend(job for job in itertools.islice(queue, last + 1)
                          if job not in self._done)
        if wanted:
            self._collect(self._engine.wait(wanted))

    def bringup_status(self) -> dict | None:
        """This rank's bring-up (state, ready_chunks, num_chunks, seconds, ...); None for the node
        pool or a cache of 0 chunks."""
        return None if self._worker is None else self._worker.bringup_status()

    def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
            del engine  # the worker's engine keeps the worker alive: the last reference goes first
        worker, self._worker = self._worker, None
        if worker is not None:
            try:
                worker.close()  # engine drained, pieces unregistered, region unmapped, runtime last
            except _ext.Error as err:
                # A slot() view is still alive: the worker closes when the last one is dropped.
                logger.warning("kvoffload: %s", err)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.detach()  # after the engine: its copies use the pool's mapping


_BRINGUP_MODES = ("blocking", "background")
_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def bringup_settings(extra: Mapping[str, Any]) -> tuple[str, int | None]:
    """(kvoffload_bringup, kvoffload_bringup_piece in bytes or None for the default) from the
    kv_connector_extra_config, refusing a bad value with the key, the value and what is allowed."""
    mode = extra.get("kvoffload_bringup", "blocking")
    if not isinstance(mode, str) or mode.lower() not in _BRINGUP_MODES:
        raise ValueError(f"KvoffloadSpec: kvoffload_bringup={mode!r} is not one of "
                         f"{list(_BRINGUP_MODES)}")
    piece = extra.get("kvoffload_bringup_piece")
    if piece is None:
        return mode.lower(), None
    allowed = ("a positive number of bytes, as an int or a string with a K, M, G or T suffix "
               "(e.g. 268435456 or '256M')")
    value = None
    if isinstance(piece, int) and not isinstance(piece, bool):
        value = piece
    elif isinstance(piece, str):
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", piece, re.IGNORECASE)
        if m:
            value = int(m.group(1)) * _SIZE_SUFFIXES[m.group(2).upper()]
    if value is None or value <= 0:
        raise ValueError(f"KvoffloadSpec: kvoffload_bringup_piece={piece!r} is not {allowed}")
    return mode.lower(), value


class KvoffloadSpec(OffloadingSpec):
    """OffloadingSpec selecting kvoffload: spec_name "KvoffloadSpec", spec_module_path "kvoffload.vllm".

    kv_connector_extra_config keys: cpu_bytes_to_use (required), eviction_policy ("lru" | "arc"),
    store_threshold, max_tracker_size, block_size / blocks_per_chunk (as CPUOffloadingSpec), and
    kvoffload's own: kvoffload_backend ("auto" | "cuda" | "hip"; "host" and "sim" for tests),
    kvoffload_engine_id (the region's name; default: vLLM's engine_id, one per data-parallel
    replica; replicas given one id have their workers refused, kvoffload.Error IN_USE), kvoffload_device (default: the KV tensors' device), kvoffload_rank (default: the
    worker's rank), kvoffload_shm_dir (default /dev/shm or KVOFFLOAD_SHM_DIR), kvoffload_pool
    ("private", the default: a region per engine; "node": one node pool shared by every engine of
    the model on the node, kvoffload.vllm_pool), kvoffload_pool_name (default: derived from the
    model fingerprint), kvoffload_hash_algo (default: vLLM's prefix_caching_hash_algo),
    kvoffload_bringup ("blocking", the default: a worker returns with its pool pinned;
    "background": it serves from the first piece while the rest comes up, and the scheduler hands
    out only chunks every rank has up), kvoffload_bringup_piece (the largest bring-up piece, bytes
    or "256M"; default 1 GiB, the first piece at most 64 MiB).
    The replicated (MLA) layout is vLLM's decision (config.replicated_layout), as for
    CPUOffloadingSpec.
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions(extra_config)

    def __init__(self, config):
        super().__init__(config)
        extra = self.extra_config
        cpu_bytes_to_use = extra.get("cpu_bytes_to_use")
        if not cpu_bytes_to_use:
            raise ValueError("KvoffloadSpec: cpu_bytes_to_use must be specified in kv_connector_extra_config")
        if getattr(config, "canonical_layout", False):
            raise ValueError(
                "KvoffloadSpec: canonical_layout=true is not supported (kvoffload stores each "
                "rank's pages as the GPU holds them, one slot per rank); remove canonical_layout "
                "from kv_connector_extra_config, or use CPUOffloadingSpec for the canonical layout"
            )
        self.eviction_policy: str = extra.get("eviction_policy", "lru")
        if extra.get("cache_policy_module_path") is not None:
            raise ValueError(
                "KvoffloadSpec: cache_policy_module_path is not supported: kvoffload's lru and arc "
                "policies are C++; remove it, or use CPUOffloadingSpec for a custom policy")
        if str(self.eviction_policy).lower() not in _POLICIES:
            raise ValueError(f"KvoffloadSpec: eviction_policy={self.eviction_policy!r} is not one of "
                             f"{list(_POLICIES)}")
        self.world_size = int(config.parallel.world_size)
        # MLA with TP: vLLM's connector decides that every rank holds the same bytes (one copy,
        # written by rank 0); honour it as CPUOffloadingSpec does on a shared region.
        self.replicated_layout = bool(config.replicated_layout)
        # One chunk = blocks_per_chunk GPU blocks of all of a worker's KV tensors (vLLM's
        # worker_kv_bytes_per_block), one slot per rank (one in the replicated layout), in a
        # row of the region (docs/DESIGN.md section 3.1).
        self.slot_bytes = int(config.worker_kv_bytes_per_block) * int(self.blocks_per_chunk)
        self.num_blocks = 0
        if self.slot_bytes > 0 and self.world_size > 0:
            row = _ext.compute_geometry(
                num_chunks=1, slot_bytes=self.slot_bytes, world_size=self.world_size,
                replicated=self.replicated_layout).row_stride
            # As vLLM: a cache smaller than one chunk has 0 blocks and offloads nothing.
            self.num_blocks = int(cpu_bytes_to_use) // row
        self._manager: OffloadingManager | None = None
        self._worker: KvoffloadWorker | None = None
        # kvoffload_bringup / kvoffload_bringup_piece: checked here so a bad value fails at start
        # on the scheduler and on every worker alike.
        self.bringup, self.bringup_piece_bytes = bringup_settings(extra)
        # kvoffload_pool='node': every engine of the model on the node shares one node pool
        # (kvoffload.vllm_pool); checked here so a bad setting fails at start on both sides.
        self._pool_settings = None
        if vllm_pool.pool_mode(extra) == "node":
            if int(extra.get("store_threshold", 0)) >= 2:
                raise ValueError(
                    "KvoffloadSpec: kvoffload_pool='node' does not support store_threshold >= 2 "
                    f"(given {extra.get('store_threshold')}): the pool stores every block; "
                    "remove store_threshold or use the private pool")
            if str(self.eviction_policy).lower() != "lru":
                raise ValueError(
                    f"KvoffloadSpec: kvoffload_pool='node' evicts with the pool's node-wide LRU; "
                    f"eviction_policy={self.eviction_policy!r} is not available there (use 'lru')")
            if self.bringup != "blocking":
                raise ValueError(
                    "KvoffloadSpec: kvoffload_bringup='background' is for the private pool; "
                    "kvoffload_pool='node' maps a pool the node already brought up (remove "
                    "kvoffload_bringup or use kvoffload_pool='private')")
            self._pool_settings = vllm_pool.pool_settings(self)
            self.num_blocks = self._pool_settings.slot_count

    def get_manager(self) -> OffloadingManager:
        if self._manager is None and self._pool_settings is not None:
            self._manager = vllm_pool.PoolManager(
                self._pool_settings.attach(self.engine_id()), self.num_blocks,
                enable_events=self.kv_events_config.enable_kv_cache_events)
        if self._manager is None:
            extra = self.extra_config
            ready_region = None
            if self.bringup == "background" and self.num_blocks > 0:
                # Note [Ready prefix]: the workers bring their pool up while they serve; the
                # scheduler maps the region unranked (populating nothing) to read how far every
                # rank is, and hands out only those chunks.
                ready_region = _ext.Region.create_or_join(
                    engine_id=self.engine_id(), num_chunks=self.num_blocks,
                    slot_bytes=self.slot_bytes, world_size=self.world_size, rank=None,
                    replicated=self.replicated_layout, shm_dir=extra.get("kvoffload_shm_dir"),
                    bringup="background")
            self._manager = KvoffloadManager(
                num_blocks=self.num_blocks,
                cache_policy=self.eviction_policy,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(extra.get("store_threshold", 0)),
                max_tracker_size=int(extra.get("max_tracker_size", 64_000)),
                ready_region=ready_region,
            )
            del ready_region  # the manager's core holds the only reference
        return self._manager

    def engine_id(self) -> str:
        """The region's name: vLLM's engine_id (distinct per data-parallel replica), or
        kvoffload_engine_id, to which a data-parallel replica appends _dp<index> as vLLM does."""
        extra = self.extra_config
        given = extra.get("kvoffload_engine_id")
        if given:
            engine_id, source = str(given), "kvoffload_engine_id"
            parallel = self.config.parallel
            if int(parallel.data_parallel_size) > 1:
                engine_id += f"_dp{int(parallel.data_parallel_index)}"
        else:
            engine_id, source = str(self.config.engine_id or ""), "vLLM's engine_id"
        if not _ENGINE_ID.fullmatch(engine_id) or engine_id in (".", ".."):
            raise ValueError(
                f"KvoffloadSpec: the region name {engine_id!r} ({source}) must be 1 to 128 "
                "letters, digits, '.', '_' or '-' (and not '.' or '..'); set "
                "kvoffload_engine_id in kv_connector_extra_config to such a name"
            )
        return engine_id

    def _rank(self) -> int:
        # This worker's slot in each row: kvoffload_rank if given, else the worker's rank.
        extra = self.extra_config
        if "kvoffload_rank" in extra:
            return int(extra["kvoffload_rank"])
        return int(self.config.parallel.rank)

    def get_worker(self, kv_caches) -> OffloadingWorker:
        if self._worker is None:
            extra = self.extra_config
            device = extra.get("kvoffload_device")
            self._worker = KvoffloadWorker(
                kv_caches,
                engine_id=self.engine_id(),
                num_blocks=self.num_blocks,
                blocks_per_chunk=int(self.blocks_per_chunk),
                slot_bytes=self.slot_bytes,
                rank=self._rank(),
                world_size=self.world_size,
                replicated=self.replicated_layout,
                backend=str(extra.get("kvoffload_backend", "auto")),
                device=None if device is None else int(device),
                shm_dir=extra.get("kvoffload_shm_dir"),
                pool_settings=self._pool_settings,
                bringup=self.bringup,
                bringup_piece_bytes=self.bringup_piece_bytes,
                job_timing=bool(extra.get("kvoffload_job_timing", True)),
            )
        return self._worker
