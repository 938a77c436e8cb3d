"""One vLLM engine's scheduler-side offloading, for the tests of kvoffload's secondary tiers:
vLLM's own TieringOffloadingSpec built from a --kv-transfer-config's extra config, its
get_manager() creating vLLM's SharedOffloadRegion (in /dev/shm, named by a unique engine id), the
CPU primary tier and the secondary tiers through vLLM's SecondaryTierFactory, and the calls vLLM's
offloading connector makes on it, step by step:

    engine = Engine(extra_config)                  # vllm_real.require() must have run
    engine.store(keys)          # a request computed these blocks: prepare_store, the GPU->CPU
                                # copy (bytes written into the primary rows), complete_store
    engine.settle()             # steps until every cascade/promotion job came back
    hits = engine.lookup(keys)  # steps until no lookup answers RETRY or HIT_PENDING
    engine.load(keys)           # prepare_load: the rows' bytes, as the GPU would receive them

Each block's bytes are a function of its key (row_bytes_of), so a loaded row proves where it came
from. The connector's worker (GPU<->CPU copies) is not involved: the tests write and read the
primary rows directly, as its copies would.
"""

from __future__ import annotations

import hashlib
import time
import uuid

import numpy as np
import pytest

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

PAGE = 4096


def key(i: int, salt: bytes = b"") -> bytes:
    """A vLLM OffloadKey: a 32-byte block hash and KV group 0."""
    return make_offload_key(hashlib.sha256(salt + i.to_bytes(8, "little")).digest(), 0)


def row_bytes_of(k: bytes, n: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def offloading_config(extra: dict, *, engine_id: str | None = None, model: str = "test/model",
                      worker_kv_bytes_per_block: int = 2 * PAGE, world_size: int = 2,
                      dp_index: int = 0, dp_size: int = 1, events: bool = False,
                      dtype: str = "bfloat16") -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1")),),
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=events,
        extra_config=extra,
        engine_id=engine_id or f"kvo-tier-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=world_size, tp_size=world_size, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=dp_index, data_parallel_size=dp_size,
            data_parallel_rank_local=None, is_parallelism_agnostic=False),
    )


def tiering(tier: dict, cpu_blocks: int = 32) -> dict:
    """A TieringOffloadingSpec extra config with one secondary tier; a primary row is 2 ranks x
    8 KiB (offloading_config's default geometry)."""
    return {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": cpu_blocks * 4 * 4096,
            "secondary_tiers": [tier]}


def step_context() -> ScheduleEndContext:
    return ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


class Engine:
    def __init__(self, extra: dict, **config):
        self.spec = TieringOffloadingSpec(offloading_config(extra, **config))
        self.manager = self.spec.get_manager()  # vLLM's TieringOffloadingManager
        self.view = self.manager.primary_tier.get_kv_memoryview()
        self.rows = np.asarray(self.view).view(np.uint8)
        self.row_bytes = self.rows.shape[1]
        self.tiers = self.manager.secondary_tiers
        self._requests = 0
        self.steps = 0

    @property
    def tier(self):
        return self.tiers[0]

    def _ctx(self) -> ReqContext:
        self._requests += 1
        ctx = ReqContext(req_id=f"req-{self._requests}")
        self.manager.on_new_request(ctx)
        return ctx

    def step(self) -> None:
        self.manager.on_schedule_end(step_context())
        self.steps += 1

    def settle(self, timeout: float = 30.0) -> None:
        """Steps until no transfer job is in flight (cascades and promotions came back)."""
        deadline = time.monotonic() + timeout
        while self.manager.has_pending_work():
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs still in flight after {timeout} s: "
                                     f"{dict(self.manager._jobs)}")
            self.step()
            time.sleep(0.002)
        self.step()

    def store(self, keys, *, settle: bool = True) -> list[bytes]:
        """A request stores `keys`: the primary tier allocates rows, the GPU->CPU copy writes each
        block's bytes, complete_store cascades them to every secondary tier. Returns the keys the
        primary tier took."""
        ctx = self._ctx()
        out = self.manager.prepare_store(list(keys), ctx)
        assert out is not None, "the primary tier could not take the store"
        for k, block in zip(out.keys_to_store, out.store_spec.block_ids.tolist()):
            self.rows[block] = row_bytes_of(k, self.row_bytes)
        self.manager.complete_store(out.keys_to_store, ctx)
        self.manager.on_request_finished(ctx)
        if settle:
            self.settle()
        return list(out.keys_to_store)

    def lookup(self, keys, *, timeout: float = 30.0) -> list[LookupResult]:
        """vLLM's scheduler asking for a request's prefix, step after step, until every answer is
        HIT or MISS (RETRY: a tier is still looking; HIT_PENDING: a promotion is in flight)."""
        ctx = self._ctx()
        deadline = time.monotonic() + timeout
        try:
            while True:
                results = [self.manager.lookup(k, ctx) for k in keys]
                self.step()
                if all(r in (LookupResult.HIT, LookupResult.MISS) for r in results):
                    return results
                if time.monotonic() > deadline:
                    raise AssertionError(f"lookups did not settle in {timeout} s: {results}")
                time.sleep(0.002)
        finally:
            self.manager.on_request_finished(ctx)
            self.settle(timeout)

    def first_answers(self, keys) -> list[LookupResult]:
        """What one scheduler step's lookups answer (no waiting)."""
        ctx = self._ctx()
        try:
            results = [self.manager.lookup(k, ctx) for k in keys]
            self.step()
            return results
        finally:
            self.manager.on_request_finished(ctx)

    def load(self, keys) -> list[np.ndarray]:
        """The rows a GPU load of `keys` (all primary hits) reads."""
        ctx = self._ctx()
        spec = self.manager.prepare_load(list(keys), ctx)
        rows = [self.rows[b].copy() for b in spec.block_ids.tolist()]
        self.manager.complete_load(list(keys), ctx)
        self.manager.on_request_finished(ctx)
        return rows

    def verify(self, keys) -> None:
        for k, row in zip(keys, self.load(keys)):
            assert (row == row_bytes_of(k, self.row_bytes)).all(), "a loaded row is not its key's"

    def evict_primary(self) -> None:
        """Empties the CPU primary tier (vLLM's reset_cache: drains the tiers, keeps their data),
        so the next lookups go to the secondary tiers."""
        self.manager.reset_cache()

    def stats(self):
        return self.manager.get_stats()

    def shutdown(self) -> None:
        # Our views of the rows go first: vLLM releases its memoryview and closes the mapping.
        self.rows = self.view = None
        self.manager.shutdown()


@pytest.fixture
def engines():
    """Makes Engines; shuts them all down when the test ends."""
    made = []

    def make(extra, **config):
        e = Engine(extra, **config)
        made.append(e)
        return e

    yield make
    for e in made:
        e.shutdown()
