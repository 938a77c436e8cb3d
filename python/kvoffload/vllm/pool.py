"""The node pool behind kvoffload.vllm: ``"kvoffload_pool": "node"`` in kv_connector_extra_config.

Every engine of a model on the node (the data-parallel replicas of one ``vllm serve``, several
``vllm serve``) attaches one :class:`kvoffload.NodePool` (docs/DESIGN.md section 6.6) instead of
a private region: a prefix one replica stored is a hit for the others, with no server process,
and a replica that dies (even SIGKILL) leaves the others serving and its stored chunks readable.

- :func:`pool_settings`: the pool's name, fingerprint and geometry from the spec's config; the
  fingerprint covers everything that makes two engines' chunks interchangeable (model, KV dtype,
  block size and blocks per chunk, layout, world size, block-hash function), so engines that
  differ in any of them are refused by the pool (kMismatch) rather than served wrong bytes.
- :class:`PoolManager`: the scheduler half, vLLM's OffloadingManager over the pool's index. Block
  ids are the pool's chunk slots. A load pins its chunks (prepare_load .. complete_load), a store
  holds writing slots (prepare_store .. complete_store), both per this engine's tenant, so the
  pool's repair drops them if this process dies.
- :func:`attach_worker_pool`: the worker half's attachment; the worker's TransferEngine copies
  into the pool's chunk bytes (kvoffload.vllm.KvoffloadWorker).
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from .. import _kvoffload as _ext
from ..vllm_compat import check_block_hashes_shareable

logger = logging.getLogger("kvoffload.vllm")

POOL_MODES = ("private", "node")


def pool_mode(extra: Mapping[str, Any]) -> str:
    mode = str(extra.get("kvoffload_pool", "private"))
    if mode not in POOL_MODES:
        raise ValueError(f"KvoffloadSpec: kvoffload_pool={mode!r} is not one of {list(POOL_MODES)}")
    return mode


def hash_function_name(extra: Mapping[str, Any]) -> str:
    """vLLM's prefix_caching_hash_algo: the current vLLM config's, or kvoffload_hash_algo."""
    given = extra.get("kvoffload_hash_algo")
    if given:
        return str(given)
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    algo = getattr(getattr(config, "cache_config", None), "prefix_caching_hash_algo", None)
    if algo is None:
        raise ValueError(
            "KvoffloadSpec: kvoffload_pool='node' needs vLLM's prefix_caching_hash_algo (the keys "
            "of every engine on the pool must be hashed alike), and no vLLM config is current; "
            "set kvoffload_hash_algo in kv_connector_extra_config to the engines' algorithm")
    return str(algo)


@dataclass(frozen=True)
class PoolSettings:
    name: str
    fingerprint: str
    slot_bytes: int
    slot_count: int
    world_size: int
    layout: str
    dtype: str
    shm_dir: str

    def attach(self, engine_id: str):
        return _ext.NodePool.attach(
            self.name, engine_id, slot_bytes=self.slot_bytes, slot_count=self.slot_count,
            world_size=self.world_size, layout=self.layout, dtype=self.dtype,
            fingerprint=self.fingerprint, shm_dir=self.shm_dir)


def pool_settings(spec) -> PoolSettings:
    """The node pool `spec` (a KvoffloadSpec with kvoffload_pool='node') attaches. Refuses, with
    vLLM's reason and what to set, where vLLM's block hashes differ between processes."""
    extra = spec.extra_config
    config = spec.config
    hash_fn = hash_function_name(extra)
    check_block_hashes_shareable(hash_fn)
    layout = "replicated" if spec.replicated_layout else "ranked"
    dtype = str(config.model.dtype)
    # One slot per rank in the ranked layout; the replicated one keeps a single copy.
    world = 1 if spec.replicated_layout else spec.world_size
    fingerprint = (f"vllm model={config.model.name} dtype={dtype} "
                   f"block={int(config.cache.tokens_per_hash)}x{int(spec.blocks_per_chunk)} "
                   f"layout={layout} world={int(spec.world_size)} hash={hash_fn} "
                   f"kv_bytes={int(config.worker_kv_bytes_per_block)}")
    name = extra.get("kvoffload_pool_name")
    if not name:
        # One pool per model and configuration by default: engines that may share find each
        # other without being told, and others never meet a pool they would be refused from.
        name = "vllm-" + hashlib.blake2b(fingerprint.encode(), digest_size=8).hexdigest()
    row = world * int(spec.slot_bytes)
    slot_count = int(extra["cpu_bytes_to_use"]) // row if row > 0 else 0
    if slot_count < 1:
        raise ValueError(
            f"KvoffloadSpec: kvoffload_pool='node': cpu_bytes_to_use={extra['cpu_bytes_to_use']} "
            f"holds no chunk of {row} bytes ({world} slots of {spec.slot_bytes})")
    return PoolSettings(name=str(name), fingerprint=fingerprint, slot_bytes=int(spec.slot_bytes),
                        slot_count=slot_count, world_size=world, layout=layout, dtype=dtype,
                        shm_dir=str(extra.get("kvoffload_shm_dir") or ""))


def pool_key(key: bytes) -> int:
    """vLLM's OffloadKey (block hash and group index, bytes) as the pool's 128-bit key: the same
    in every process (Python's own hash() is seeded per process)."""
    return int.from_bytes(hashlib.blake2b(bytes(key), digest_size=16).digest(), "little")


class PoolManager(OffloadingManager):
    """vLLM's OffloadingManager over the node pool; block ids are chunk slots of the pool.

    lookup is HIT for a ready chunk (any engine's), HIT_PENDING for one this manager is storing,
    MISS otherwise (a chunk another engine is writing is invisible until it commits; prepare_store
    then skips it). Eviction is the pool's node-wide LRU, so evicted_keys name only keys this
    manager knows (those it stored or loaded).

    Note [Held from lookup]: vLLM counts a HIT as external computed tokens and loads it in a later
    call (prepare_load, the same step or after); on a shared pool another engine could evict the
    chunk in between. A HIT therefore pins the chunk for the request (once per key), prepare_load
    turns that pin into the load's, and on_request_finished (or reset_cache) drops what was never
    loaded, so a looked-up chunk is always there to load.
    """

    def __init__(self, pool, num_blocks: int, enable_events: bool = False):
        self.medium = Medium.CPU
        self._pool = pool
        self._num_blocks = num_blocks
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._writing: dict[bytes, int] = {}  # vLLM key -> writing slot
        self._pins: dict[bytes, list[int]] = defaultdict(list)  # vLLM key -> pinned slots
        self._known: dict[int, bytes] = {}  # pool key -> vLLM key, for evicted_keys
        self._held: dict[str, dict[bytes, int]] = {}  # request -> key -> slot pinned by lookup
        self.allocation_sizes: list[int] = []

    def _remember(self, key: bytes) -> int:
        pk = pool_key(key)
        if len(self._known) > 4 * max(self._num_blocks, 1):
            self._known.clear()  # bounded: evicted_keys then miss older keys (events only)
        self._known[pk] = key
        return pk

    def on_new_request(self, req_context) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context) -> None:
        held = self._held.pop(_request_of(req_context), None)
        if held:
            self._pool.unpin(list(held.values()))

    def lookup(self, key, req_context) -> LookupResult:
        if key in self._writing:
            return LookupResult.HIT_PENDING
        held = self._held.setdefault(_request_of(req_context), {})
        if key in held:
            return LookupResult.HIT
        got = self._pool.lookup([self._remember(key)], pin=True)
        if not got.hits:
            return LookupResult.MISS
        held[key] = got.slots[0]
        return LookupResult.HIT

    def prepare_load(self, keys: Collection, req_context) -> CPULoadStoreSpec:
        keys = list(keys)
        held = self._held.get(_request_of(req_context), {})
        slots = [held.pop(k, None) for k in keys]
        rest = [k for k, s in zip(keys, slots) if s is None]
        if rest:
            got = self._pool.lookup([self._remember(k) for k in rest], pin=True)
            if got.hits != len(rest):
                self._pool.unpin(got.slots + [s for s in slots if s is not None])
                raise RuntimeError(
                    f"kvoffload node pool '{self._pool.path}': {len(rest) - got.hits} of "
                    f"{len(keys)} chunks to load are not in the pool (never looked up by this "
                    "request, and evicted since)")
            fresh = iter(got.slots)
            slots = [s if s is not None else next(fresh) for s in slots]
        for key, slot in zip(keys, slots):
            self._pins[key].append(slot)
        return CPULoadStoreSpec(slots)

    def touch(self, keys: Collection, req_context) -> None:
        self._pool.lookup([pool_key(k) for k in keys])

    def complete_load(self, keys: Collection, req_context) -> None:
        slots = []
        for key in keys:
            pinned = self._pins.get(key)
            if pinned:
                slots.append(pinned.pop())
                if not pinned:
                    del self._pins[key]
        self._pool.unpin(slots)

    def prepare_store(self, keys: Collection, req_context) -> PrepareStoreOutput | None:
        keys = [k for k in keys if k not in self._writing]
        plan = self._pool.prepare_stores([self._remember(k) for k in keys])
        to_store = [keys[p] for p in plan.positions]
        for key, slot in zip(to_store, plan.slots):
            self._writing[key] = slot
        evicted = [self._known.pop(pk) for pk in plan.evicted if pk in self._known]
        if evicted and self.events is not None:
            self.events.append(OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        if to_store:
            self.allocation_sizes.append(len(to_store))
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=CPULoadStoreSpec(list(plan.slots)),
                                  evicted_keys=evicted)

    def complete_store(self, keys: Collection, req_context, success: bool = True) -> None:
        done = [(k, self._writing.pop(k)) for k in keys if k in self._writing]
        slots = [slot for _, slot in done]
        if success:
            self._pool.commit_stores(slots)
            if done and self.events is not None:
                self.events.append(OffloadingEvent(keys=[k for k, _ in done], medium=self.medium,
                                                   removed=False))
        else:
            self._pool.abort_stores(slots)

    def reset_cache(self) -> None:
        # The pool is shared: reset drops only this engine's writes and pins, not others' chunks.
        self._pool.abort_stores(list(self._writing.values()))
        self._writing.clear()
        self._pool.unpin([s for slots in self._pins.values() for s in slots])
        self._pins.clear()
        self._pool.unpin([s for held in self._held.values() for s in held.values()])
        self._held.clear()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is not None:
            yield from self.events
            self.events.clear()

    def get_stats(self):
        from .manager import _stats_builder

        n = self._num_blocks
        pinned = sum(len(s) for s in self._pins.values())
        writing = len(self._writing)
        usage = (writing + pinned) / n if n else 0.0
        write_usage = writing / n if n else 0.0
        stats = _stats_builder()(usage, write_usage, max(usage - write_usage, 0.0),
                                 self.allocation_sizes, None)
        self.allocation_sizes.clear()
        return stats

    def shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.detach()


def _request_of(req_context) -> str:
    return str(getattr(req_context, "req_id", ""))


def worker_host_slots(pool, rank: int) -> dict:
    """TransferEngine.for_buffer's arguments for `rank`'s slots of the pool's chunks: its own
    range of the rank-major pool (rank_range), so the engine registers only that."""
    r = pool.rank_range(int(rank))
    stride = int(r["slot_stride"])
    slot_count = int(pool.stats()["slot_count"])
    return dict(buffer=int(r["address"]), slot_bytes=stride, row_stride=stride, copy_index=0,
                nbytes=stride * slot_count)
