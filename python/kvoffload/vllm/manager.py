"""The scheduler half: :class:`KvoffloadManager`, vLLM's ``OffloadingManager`` with the observable
behaviour of ``CPUOffloadingManager`` (same constructor keywords, same lookups, block ids,
evictions, events, store threshold and statistics), backed by kvoffload's C++ Manager in its vLLM
semantics (``ManagerSemantics::kVllm``). Keys cross the binding a call at a time, hashed to 128
bits in C++ (python/src/vllm_manager.cpp); :func:`metric_definitions` are its Prometheus metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingManager,
    OffloadingMetricMetadata,
    PrepareStoreOutput,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics

from .. import _kvoffload as _ext

__all__ = ["KvoffloadManager", "metric_definitions"]

logger = logging.getLogger("kvoffload.vllm")

# VllmManagerCore.lookup's codes, in order.
_LOOKUP_RESULTS = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)
_POLICIES = ("lru", "arc")


_PLAIN_RESULTS = None
_FAST_SETTINGS = None


def _fast_settings() -> dict:
    """The keyword arguments of VllmManagerCore.fast_methods beyond vLLM's classes, each checked
    once per process against what vLLM's own classes and methods give (Note [Plain result
    objects], Note [Stats in C] in python/src/vllm_manager.cpp)."""
    global _FAST_SETTINGS
    if _FAST_SETTINGS is None:
        new_array, plain_output = _plain_results()
        _FAST_SETTINGS = {
            "new_array": new_array, "plain_output": plain_output,
            "context_cls": RequestOffloadingContext, "context_fields": _plain_context(),
            "stats_template": _stats_template(), "step_hooks": _constant_hooks(),
        }
    return _FAST_SETTINGS


def _plain_context() -> dict | None:
    """The attributes RequestOffloadingContext() holds, when it is a plain class whose instances
    hold only constant defaults: on_new_request then builds it as a bare instance given them.
    None: it is built through its constructor."""
    import enum

    cls = RequestOffloadingContext
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):
        return None
    try:
        ref = cls()
        fields = dict(vars(ref))
        constant = (bool, int, float, str, bytes, type(None), enum.Enum)
        plain = cls.__new__(cls)
        plain.__dict__.update(fields)
        same = (all(isinstance(v, constant) for v in fields.values())
                and type(plain) is type(ref) and vars(plain) == vars(ref) and plain == ref
                and vars(cls()) == fields)
    except Exception:  # noqa: BLE001 - any difference means: use the constructor
        same = False
    return fields if same else None


def _constant_hooks() -> list[str]:
    """The hooks of vLLM's OffloadingManager (on_schedule_end, has_pending_work: 7cfb97e3 on)
    whose default returns a constant and reads nothing: these become C functions returning it."""
    found = []
    for name, args, value in (("on_schedule_end", (None,), None), ("has_pending_work", (), False)):
        f = getattr(OffloadingManager, name, None)
        code = getattr(f, "__code__", None)
        if code is None or code.co_names or code.co_freevars or code.co_argcount != 1 + len(args):
            continue
        try:
            if f(None, *args) is value:
                found.append(name)
        except Exception:  # noqa: BLE001 - a default that does more: leave it to vLLM's
            pass
    return found


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
        live_region=None,
    ):
        """ready_region: an unranked kvoffload.Region mapped in background mode (the workers'
        region with kvoffload_bringup='background'): only the chunks every rank has brought up
        are handed out (Note [Ready prefix] in python/src/vllm_manager.cpp). The manager takes
        it over and drops it once the whole pool is up.
        live_region: such a Region whose live statistics page gets the manager's occupancy and
        counters, as `kvoffload run`'s scheduler publishes them (`kvoffload top`, `region list`,
        the exporter); held until shutdown (Note [Live page of a vLLM scheduler])."""
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
        if live_region is not None:
            self._core.publish_live_stats(live_region)
        self.counts: _ThresholdCounts | None = _ThresholdCounts(self._core) if threshold else None
        # The hot methods are C functions building vLLM's result objects; as instance attributes
        # they replace the class's methods below for every call (Note [Fast entry points] in
        # python/src/vllm_manager.cpp): no Python frame between vLLM and the C++ Manager.
        # So are the per-request and per-step hooks, take_events and get_stats (Note [Stats in
        # C]), each where vLLM's types allow it (checked once per process, _fast_settings).
        # A subclass's override of any of them is kept.
        settings = _fast_settings()
        fast = self._core.fast_methods(
            _ext.Error, _LOOKUP_RESULTS, CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent,
            self.medium, self.events, self.allocation_sizes_in_current_batch, **settings,
        )
        cls = type(self)
        self.__dict__.update({name: f for name, f in fast.items()
                              if getattr(cls, name, None) is getattr(KvoffloadManager, name, None)})
        # Stores skipped by the threshold, cumulative in C++, at the last get_stats (the Python
        # get_stats only; the C one keeps its own).
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
        fast = self.__dict__.get("get_stats")
        if fast is not None:
            return fast()  # Note [Stats in C]
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
        # Drops the scheduler's mapping of the region, if any: the live page's scheduler block
        # is marked detached (its counters final) when the mapping closes.
        self._core.follow_readiness(None)
        self._core.publish_live_stats(None)


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


def _stats_template():
    """The template of Note [Stats in C] (python/src/vllm_manager.cpp): the stats class, its data
    dict's two keys, the metric names and type strings, read off stats vLLM's methods built; None
    unless VllmManagerCore.build_stats then gives what vLLM's methods give."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )

    m = CPUOffloadingMetrics
    try:
        data = getattr(_stats_by_methods(0.5, 0.25, 0.25, [1, 4], 3), "data", None)
        if not isinstance(data, dict) or len(data) != 2:
            return None
        (types_key, types), (values_key, _) = data.items()
        if set(types) != {m.CPU_CACHE_USAGE_PERC, m.CPU_ALLOCATION_SIZE, m.CPU_CACHE_WRITE_USAGE_PERC,
                          m.CPU_CACHE_READ_USAGE_PERC, m.STORES_SKIPPED}:
            return None
        names = (m.CPU_CACHE_USAGE_PERC, m.CPU_ALLOCATION_SIZE, m.CPU_CACHE_WRITE_USAGE_PERC,
                 m.CPU_CACHE_READ_USAGE_PERC, m.STORES_SKIPPED)
        kinds = (types[m.CPU_CACHE_USAGE_PERC], types[m.CPU_ALLOCATION_SIZE], types[m.STORES_SKIPPED])
        samples = ((0.75, 0.5, 0.25, [1, 4], 3), (0.0, 0.0, 0.0, [], None), (1.0, 0.125, 0.875, [7], 0))
        slots = hasattr(OffloadingConnectorStats, "__slots__")
        for plain in (False,) if slots else (True, False):
            template = (OffloadingConnectorStats, plain, types_key, values_key, *names, *kinds)
            for sample in samples:
                a = _stats_by_methods(*sample)
                sizes = list(sample[3])
                b = _ext.VllmManagerCore.build_stats(template, *sample[:3], sizes, sample[4])
                if (type(a) is not type(b) or a.data != b.data or list(a.data) != list(b.data)
                        or vars(a) != vars(b) or sizes
                        or any(list(a.data[k]) != list(b.data[k]) for k in a.data)):
                    break
            else:
                return template
    except Exception:  # noqa: BLE001 - any difference means: the Python builder
        pass
    logger.info("kvoffload: manager stats are built in Python")
    return None


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
