"""kvoffload as a drop-in backend for vLLM's OffloadingConnector.

Select it with ``spec_name="KvoffloadSpec"`` and ``spec_module_path="kvoffload.vllm"`` in the
connector's ``kv_connector_extra_config`` (the README's "vLLM integration" section has the whole
``--kv-transfer-config``).

- :class:`KvoffloadManager` is vLLM's ``OffloadingManager`` with the observable behaviour of
  ``CPUOffloadingManager`` (same constructor keywords, same lookups, block ids, evictions, events,
  store threshold and statistics), backed by kvoffload's C++ Manager in its vLLM semantics
  (``ManagerSemantics::kVllm``). Keys cross the binding a call at a time, hashed to 128 bits in C++.
- :class:`KvoffloadSpec` is an ``OffloadingSpec``: the scheduler side gets a KvoffloadManager, the
  worker side a :class:`KvoffloadWorker` that moves blocks between the KV-cache tensors and
  kvoffload's shared host Region with a TransferEngine (host, CUDA or HIP backend).

Importing this module needs vLLM; without it the import fails with an ImportError that says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable

try:
    import vllm  # noqa: F401
except ImportError as _err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "kvoffload.vllm is the vLLM offloading backend and needs vLLM installed "
        "(pip install vllm); the rest of kvoffload works without it"
    ) from _err

try:
    from vllm.v1.kv_offload.base import (
        LookupResult,
        Medium,
        OffloadingEvent,
        OffloadingManager,
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
        f"CPULoadStoreSpec); the installed vLLM lacks part of it: {_err}"
    ) from _err

from . import _kvoffload as _ext

__all__ = ["KvoffloadManager", "KvoffloadSpec", "KvoffloadWorker"]

logger = logging.getLogger(__name__)

# VllmManagerCore.lookup's codes, in order.
_LOOKUP_RESULTS = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)
_POLICIES = ("lru", "arc")


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
    ):
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
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"KvoffloadManager: num_blocks={num_blocks!r} must be an int >= 1")
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
            num_blocks, self._policy_name, threshold, int(max_tracker_size) if threshold else 0
        )
        # The hot methods are C functions building vLLM's result objects; as instance attributes
        # they replace the class's methods below for every call (Note [Fast entry points] in
        # python/src/vllm_manager.cpp): no Python frame between vLLM and the C++ Manager.
        fast = self._core.fast_methods(
            _ext.Error, _LOOKUP_RESULTS, CPULoadStoreSpec, PrepareStoreOutput, OffloadingEvent,
            self.medium, self.events, self.allocation_sizes_in_current_batch,
        )
        self.__dict__.update(fast)
        # Cumulative (lookups, hits, misses, evictions, stores skipped) at the last get_stats.
        self._reported = (0, 0, 0, 0, 0)

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
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        stats = OffloadingConnectorStats()
        pending, pinned, lookups, hits, misses, evictions, skipped = self._core.counters()
        n = self._num_blocks
        usage = (pending + pinned) / n
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        for allocation_size in self.allocation_sizes_in_current_batch:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, allocation_size)
        self.allocation_sizes_in_current_batch.clear()
        write_usage = pending / n
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, max(usage - write_usage, 0.0))
        last = self._reported
        if self.store_threshold >= 2:
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, skipped - last[4])
        label = (self._policy_name,)
        stats.increase_counter(CPUOffloadingMetrics.CPU_BLOCK_LOOKUP, lookups - last[0], labelvalues=label)
        stats.increase_counter(CPUOffloadingMetrics.CPU_BLOCK_HIT, hits - last[1], labelvalues=label)
        stats.increase_counter(CPUOffloadingMetrics.CPU_BLOCK_MISS, misses - last[2], labelvalues=label)
        stats.increase_counter(CPUOffloadingMetrics.BLOCK_EVICTION, evictions - last[3], labelvalues=label)
        self._reported = (lookups, hits, misses, evictions, skipped)
        return stats

    def shutdown(self) -> None:
        return None


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


class KvoffloadWorker(OffloadingWorker):
    """Moves KV blocks between the engine's KV-cache tensors and kvoffload's shared Region.

    Tensors are anything with ``data_ptr()``, ``shape``, ``stride()`` and ``element_size()``
    (torch tensors; the tests use numpy-backed stand-ins); their addresses go straight to the
    TransferEngine. A store or load is one asynchronous engine job, polled by get_finished().
    """

    def __init__(
        self,
        kv_caches,
        *,
        engine_id: str,
        num_blocks: int,
        blocks_per_chunk: int,
        rank: int,
        world_size: int,
        replicated: bool = False,
        backend: str = "auto",
        device: int = 0,
        shm_dir: str | None = None,
        join_timeout: float = 30.0,
        register_host: bool = True,
    ):
        if len(kv_caches.group_data_refs) != 1:
            raise ValueError(
                f"KvoffloadWorker: the model has {len(kv_caches.group_data_refs)} KV-cache groups; "
                "kvoffload's vLLM worker supports one (a hybrid model needs CPUOffloadingSpec)"
            )
        self._bpc = int(blocks_per_chunk)
        tensors = []
        seen = set()
        for ref in kv_caches.group_data_refs[0]:
            if ref.tensor_idx in seen:
                continue
            seen.add(ref.tensor_idx)
            t = kv_caches.tensors[ref.tensor_idx]
            tensor = t.tensor
            stride = int(tensor.stride()[0]) * int(tensor.element_size())
            tensors.append(
                _ext.DeviceTensor(int(tensor.data_ptr()), int(tensor.shape[0]), int(t.page_size_bytes), stride)
            )
        if not tensors:
            raise ValueError("KvoffloadWorker: the KV-cache group references no tensor")
        slot_bytes = self._bpc * sum(t.page_bytes for t in tensors)
        self._runtime = _ext.make_runtime(backend, device=device)
        # The worker's own rank even in the replicated layout (where every rank's slot is copy 0):
        # each rank slot has one holder at a time, so a second process on this rank, or a
        # data-parallel replica given the same kvoffload_engine_id, is refused here with
        # kvoffload.Error(IN_USE) naming the holder's PID instead of sharing its slots.
        self._region = _ext.Region.create_or_join(
            engine_id=engine_id,
            num_chunks=num_blocks,
            slot_bytes=slot_bytes,
            world_size=world_size,
            rank=rank,
            replicated=replicated,
            shm_dir=shm_dir,
            join_timeout=join_timeout,
        )
        try:
            self._engine = _ext.TransferEngine(
                self._runtime, self._region, 0 if replicated else rank, [tensors], self._bpc,
                register_host=register_host,
            )
        except BaseException:
            self._region.close()
            raise
        self._finished: list[TransferResult] = []
        self._stream_of = self._compute_stream_getter(self._runtime.name)

    @staticmethod
    def _compute_stream_getter(backend_name: str):
        # Transfers wait for the engine's compute stream (the KV the store reads is written there).
        if backend_name in ("cuda", "hip"):
            import torch

            return lambda: torch.cuda.current_stream().cuda_stream
        return lambda: None

    def _submit(self, job_id: int, direction: str, cpu_spec, gpu_spec) -> bool:
        gpu_ids = [int(b) for b in gpu_spec.block_ids]
        chunks = [int(b) for b in cpu_spec.block_ids]
        indices = getattr(gpu_spec, "block_indices", None)
        skip = int(indices[0]) % self._bpc if indices else 0
        try:
            self._engine.submit(job_id, direction, chunks, [gpu_ids], skip=skip,
                                wait_stream=self._stream_of())
        except _ext.Error as err:
            # The job never started: vLLM gets False and a result that says it failed.
            logger.error("kvoffload: %s job %d was refused: %s", direction, job_id, err)
            return False
        return True

    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._submit(job_id, "store", dst_spec, src_spec)

    def submit_load(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._submit(job_id, "load", src_spec, dst_spec)

    @staticmethod
    def _result(r) -> TransferResult:
        if not r.success:
            logger.error("kvoffload: %s job %d failed: %s", r.direction, r.job_id, r.error)
        return TransferResult(job_id=r.job_id, success=r.success, transfer_size=r.bytes,
                              transfer_time=r.seconds)

    def get_finished(self) -> list[TransferResult]:
        out = self._finished
        self._finished = []
        out.extend(self._result(r) for r in self._engine.poll())
        return out

    def wait(self, job_ids: set[int]) -> None:
        # Results of waited jobs still come out of the next get_finished().
        self._finished.extend(self._result(r) for r in self._engine.wait(sorted(job_ids)))

    def shutdown(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()
            self._engine = None
        region = getattr(self, "_region", None)
        if region is not None:
            region.close()
            self._region = None


class KvoffloadSpec(OffloadingSpec):
    """OffloadingSpec selecting kvoffload: spec_name "KvoffloadSpec", spec_module_path "kvoffload.vllm".

    kv_connector_extra_config keys: cpu_bytes_to_use (required), eviction_policy ("lru" | "arc"),
    store_threshold, max_tracker_size (as CPUOffloadingSpec), and kvoffload's own:
    kvoffload_engine_id (the region's name; default from the config's engine id; one per engine:
    each data-parallel replica needs its own, or its workers are refused, kvoffload.Error IN_USE),
    kvoffload_backend ("auto" | "cuda" | "hip" | "host"), kvoffload_device, kvoffload_rank,
    kvoffload_shm_dir, replicated_layout.
    """

    def __init__(self, config):
        super().__init__(config)
        extra = self.extra_config
        cpu_bytes_to_use = extra.get("cpu_bytes_to_use")
        if not cpu_bytes_to_use:
            raise ValueError("KvoffloadSpec: cpu_bytes_to_use must be specified in kv_connector_extra_config")
        self.eviction_policy: str = extra.get("eviction_policy", "lru")
        self.world_size = int(config.parallel.world_size)
        self.replicated = bool(extra.get("replicated_layout", self.replicated_layout))
        # One chunk = blocks_per_chunk GPU blocks of every KV tensor of every rank (one copy in
        # the replicated layout), in a page-aligned row of the region (DESIGN.md §2).
        self.slot_bytes = int(config.worker_kv_bytes_per_block) * int(self.blocks_per_chunk)
        copies = 1 if self.replicated else self.world_size
        row_stride = _round_up(copies * self.slot_bytes, os.sysconf("SC_PAGE_SIZE")) if self.slot_bytes else 0
        self.num_blocks = int(cpu_bytes_to_use) // row_stride if row_stride else 0
        if self.num_blocks < 1:
            raise ValueError(
                f"KvoffloadSpec: cpu_bytes_to_use={cpu_bytes_to_use} holds no chunk of {row_stride} bytes "
                f"({copies} copies of {self.slot_bytes} bytes per chunk); give at least {row_stride}"
            )
        self._manager: KvoffloadManager | None = None
        self._worker: KvoffloadWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            extra = self.extra_config
            self._manager = KvoffloadManager(
                num_blocks=self.num_blocks,
                cache_policy=self.eviction_policy,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(extra.get("store_threshold", 0)),
                max_tracker_size=int(extra.get("max_tracker_size", 64_000)),
            )
        return self._manager

    def _engine_id(self) -> str:
        extra = self.extra_config
        engine_id = extra.get("kvoffload_engine_id") or getattr(self.config, "engine_id", None)
        if not engine_id:
            raise ValueError(
                "KvoffloadSpec: name the shared region with kvoffload_engine_id in "
                "kv_connector_extra_config (letters, digits, '.', '_', '-'; one per engine)"
            )
        return str(engine_id)

    def _rank(self) -> int:
        # This worker's slot in each row: kvoffload_rank if given, else the config's rank, else
        # the device index modulo the world size (as vLLM's SharedOffloadRegion assigns slots).
        extra = self.extra_config
        if "kvoffload_rank" in extra:
            return int(extra["kvoffload_rank"])
        rank = getattr(self.config.parallel, "rank", None)
        if rank is not None:
            return int(rank)
        try:
            import torch

            return int(torch.cuda.current_device()) % self.world_size
        except (ImportError, RuntimeError, AssertionError):
            return 0

    def get_worker(self, kv_caches) -> OffloadingWorker:
        if self._worker is None:
            extra = self.extra_config
            self._worker = KvoffloadWorker(
                kv_caches,
                engine_id=self._engine_id(),
                num_blocks=self.num_blocks,
                blocks_per_chunk=int(self.blocks_per_chunk),
                rank=self._rank(),
                world_size=self.world_size,
                replicated=self.replicated,
                backend=str(extra.get("kvoffload_backend", "auto")),
                device=int(extra.get("kvoffload_device", 0)),
                shm_dir=extra.get("kvoffload_shm_dir"),
            )
        return self._worker
