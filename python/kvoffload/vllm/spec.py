""":class:`KvoffloadSpec`, the ``OffloadingSpec`` vLLM loads by ``spec_name="KvoffloadSpec"`` and
``spec_module_path="kvoffload.vllm"``: reads kv_connector_extra_config, sizes the region, and
builds the scheduler side's manager (:class:`~kvoffload.vllm.manager.KvoffloadManager`, or the
node pool's :class:`~kvoffload.vllm.pool.PoolManager`) and each worker's
:class:`~kvoffload.vllm.worker.KvoffloadWorker`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vllm.v1.kv_offload.base import (
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
)

from .. import _kvoffload as _ext
from . import pool as vllm_pool
from .manager import _POLICIES, KvoffloadManager, metric_definitions
from .worker import KvoffloadWorker

__all__ = ["KvoffloadSpec", "bringup_settings"]

# Region names: kvoffload's engine-id alphabet (docs/DESIGN.md section 3).
_ENGINE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


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
    the model on the node, kvoffload.vllm.pool), kvoffload_pool_name (default: derived from the
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
        # (kvoffload.vllm.pool); checked here so a bad setting fails at start on both sides.
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
            region = None
            if self.num_blocks > 0:
                # The scheduler maps the region unranked in background mode (populating nothing,
                # holding no rank's slots) for the region's live statistics page, where the
                # manager publishes its occupancy as `kvoffload run`'s scheduler does (Note [Live
                # page of a vLLM scheduler]), and with kvoffload_bringup='background' to read how
                # far every rank's bring-up is (Note [Ready prefix]): it hands out only those
                # chunks.
                region = _ext.Region.create_or_join(
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
                ready_region=region if self.bringup == "background" else None,
                live_region=region,
            )
            del region  # the manager's core holds the only reference
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
