# kvoffload.vllm.KvoffloadSpec and KvoffloadWorker on the host backend (and `sim` when built):
# numpy-backed stand-ins for torch tensors expose data_ptr / shape / stride / element_size, and
# every byte that crosses is checked, in the region and back on the "device".
import os
import sys
import types
import uuid

import numpy as np
import pytest

STANDIN = os.path.join(os.path.dirname(__file__), "vllm_standin")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)

from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    OffloadingSpec,
    OffloadingWorker,
    ReqContext,
    TransferResult,
    make_offload_key,
)

import kvoffload  # noqa: E402
from kvoffload.vllm import KvoffloadManager, KvoffloadSpec, KvoffloadWorker  # noqa: E402

NUM_GPU_BLOCKS, BPC = 16, 2
PAGES = (192, 64)  # bytes per block of the two KV tensors
PAD = 32  # block stride = page + PAD: padded pages, as vLLM's canonical tensors may have
CTX = ReqContext(req_id="w")


class FakeTensor:
    """What the worker uses of a torch tensor, over a numpy array."""

    def __init__(self, array):
        self.array = array

    def data_ptr(self):
        return self.array.ctypes.data

    @property
    def shape(self):
        return self.array.shape

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def element_size(self):
        return self.array.itemsize


def backends():
    names = {b.name for b in kvoffload.list_backends() if b.built}
    out = ["host"]
    if "sim" in names:
        out.append("sim")
    return out


def kv_caches(seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 256, size=(NUM_GPU_BLOCKS, p + PAD), dtype=np.uint8) for p in PAGES]
    tensors = [CanonicalKVCacheTensor(FakeTensor(a), p) for a, p in zip(arrays, PAGES)]
    refs = [[CanonicalKVCacheRef(0, PAGES[0]), CanonicalKVCacheRef(1, PAGES[1]), CanonicalKVCacheRef(0, PAGES[0])]]
    return arrays, CanonicalKVCaches(tensors=tensors, group_data_refs=refs)


def config(shm_dir, backend, chunks=8, **extra):
    slot = BPC * sum(PAGES)
    row = -(-slot // os.sysconf("SC_PAGE_SIZE")) * os.sysconf("SC_PAGE_SIZE")
    extra_config = {
        "cpu_bytes_to_use": chunks * row,
        "eviction_policy": "arc",
        "kvoffload_engine_id": "vllm-" + uuid.uuid4().hex[:12],
        "kvoffload_backend": backend,
        "kvoffload_shm_dir": shm_dir,
    }
    extra_config.update(extra)
    return types.SimpleNamespace(
        extra_config=extra_config,
        enable_kv_cache_events=True,
        groups=[types.SimpleNamespace(tokens_per_block=16)],
        cache=types.SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=BPC),
        parallel=types.SimpleNamespace(world_size=1, rank=0),
        worker_kv_bytes_per_block=sum(PAGES),
    )


def slot_bytes_of(arrays, blocks):
    """What a slot holds for GPU blocks `blocks` (BPC of them): tensor after tensor, pages in order."""
    return np.concatenate([a[b, :p] for a, p in zip(arrays, PAGES) for b in blocks])


@pytest.mark.parametrize("backend", backends())
def test_spec_store_and_load_round_trip(shm_dir, backend):
    spec = KvoffloadSpec(config(shm_dir, backend))
    assert isinstance(spec, OffloadingSpec) and spec.num_blocks == 8
    manager = spec.get_manager()
    assert isinstance(manager, KvoffloadManager) and spec.get_manager() is manager
    arrays, caches = kv_caches(1)
    original = [a.copy() for a in arrays]
    worker = spec.get_worker(caches)
    assert isinstance(worker, KvoffloadWorker) and isinstance(worker, OffloadingWorker)

    keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(3)]
    out = manager.prepare_store(keys, CTX)
    chunks = out.store_spec.block_ids.tolist()
    assert chunks == [0, 1, 2]
    # GPU blocks 4..9 (two per chunk) go to chunks 0, 1, 2.
    gpu = GPULoadStoreSpec([4, 5, 6, 7, 8, 9], group_sizes=[6], block_indices=[0])
    assert worker.submit_store(7, gpu, out.store_spec)
    worker.wait({7})
    (res,) = worker.get_finished()
    assert isinstance(res, TransferResult)
    assert res.job_id == 7 and res.success and res.transfer_size == 6 * sum(PAGES)
    assert worker.get_finished() == []
    manager.complete_store(out.keys_to_store, CTX)
    region = worker._region
    for c, blocks in zip(chunks, ([4, 5], [6, 7], [8, 9])):
        assert (np.asarray(region.slot(c)) == slot_bytes_of(original, blocks)).all()

    # Load chunks 1, 2 into GPU blocks 12..15; the padding between pages is never written.
    load = manager.prepare_load(keys[1:], CTX)
    assert load.block_ids.tolist() == [1, 2]
    dst = GPULoadStoreSpec([12, 13, 14, 15], group_sizes=[4], block_indices=[2])
    assert worker.submit_load(8, load, dst)
    results = []
    while not results:
        results = worker.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(8, True)]
    manager.complete_load(keys[1:], CTX)
    for a, o, p in zip(arrays, original, PAGES):
        assert (a[12:16, :p] == o[6:10, :p]).all()
        assert (a[12:16, p:] == o[12:16, p:]).all()
        assert (a[:12] == o[:12]).all()
    worker.shutdown()
    worker.shutdown()  # idempotent


@pytest.mark.parametrize("backend", backends())
def test_mid_chunk_start_uses_block_indices(shm_dir, backend):
    spec = KvoffloadSpec(config(shm_dir, backend))
    arrays, caches = kv_caches(2)
    original = [a.copy() for a in arrays]
    worker = spec.get_worker(caches)
    # The request's blocks 3, 4, 5 (block index 3 = position 1 of its chunk) into chunks 5, 6.
    cpu = kvoffload.vllm.CPULoadStoreSpec([5, 6])
    assert worker.submit_store(1, GPULoadStoreSpec([2, 3, 11], group_sizes=[3], block_indices=[3]), cpu)
    worker.wait({1})
    assert [r.success for r in worker.get_finished()] == [True]
    slot5 = np.asarray(worker._region.slot(5))
    off = 0
    for o, p in zip(original, PAGES):
        assert (slot5[off + p: off + 2 * p] == o[2, :p]).all()  # position 1 of chunk 5
        off += BPC * p
    assert (np.asarray(worker._region.slot(6))[: PAGES[0]] == original[0][3, : PAGES[0]]).all()
    assert (np.asarray(worker._region.slot(6))[PAGES[0]: 2 * PAGES[0]] == original[0][11, : PAGES[0]]).all()
    del slot5  # a live view keeps the region from closing
    worker.shutdown()


def test_refused_job_returns_false(shm_dir):
    spec = KvoffloadSpec(config(shm_dir, "host"))
    _, caches = kv_caches(3)
    worker = spec.get_worker(caches)
    bad = kvoffload.vllm.CPULoadStoreSpec([99])  # no such chunk
    assert worker.submit_store(3, GPULoadStoreSpec([0, 1], group_sizes=[2], block_indices=[0]), bad) is False
    assert worker.get_finished() == []
    worker.shutdown()


def test_failed_job_is_reported_failed(shm_dir):
    spec = KvoffloadSpec(config(shm_dir, "host"))
    _, caches = kv_caches(4)
    worker = spec.get_worker(caches)
    real = worker._engine

    class FailingEngine:
        # The engine's own failure reporting is tested in C++; here: its failed result stays failed.
        def poll(self):
            return [types.SimpleNamespace(job_id=5, success=False, bytes=0, seconds=0.0,
                                          direction="load", error="injected")]

        def wait(self, ids):
            return [types.SimpleNamespace(job_id=i, success=False, bytes=0, seconds=0.0,
                                          direction="store", error="injected") for i in ids]

        def shutdown(self):
            real.shutdown()

    worker._engine = FailingEngine()
    worker.wait({6})
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(6, False), (5, False)]
    worker.shutdown()


def test_rank_selects_the_slot_of_a_two_rank_region(shm_dir):
    # Rank 1 of 2 writes the second slot of each row; rank 0's slot stays zero.
    cfg = config(shm_dir, "host", kvoffload_rank=1)
    cfg.parallel.world_size = 2
    spec = KvoffloadSpec(cfg)
    arrays, caches = kv_caches(6)
    worker = spec.get_worker(caches)
    assert worker.submit_store(1, GPULoadStoreSpec([0, 1], group_sizes=[2], block_indices=[0]),
                               kvoffload.vllm.CPULoadStoreSpec([3]))
    worker.wait({1})
    assert [r.success for r in worker.get_finished()] == [True]
    region = worker._region
    assert (np.asarray(region.slot(3, rank=1)) == slot_bytes_of(arrays, [0, 1])).all()
    assert not np.asarray(region.slot(3, rank=0)).any()
    worker.shutdown()


def test_spec_configuration_errors(shm_dir):
    with pytest.raises(ValueError, match="cpu_bytes_to_use must be specified"):
        KvoffloadSpec(config(shm_dir, "host", cpu_bytes_to_use=0))
    with pytest.raises(ValueError, match="holds no chunk"):
        KvoffloadSpec(config(shm_dir, "host", cpu_bytes_to_use=100))
    spec = KvoffloadSpec(config(shm_dir, "host", kvoffload_engine_id=""))
    _, caches = kv_caches(5)
    with pytest.raises(ValueError, match="kvoffload_engine_id"):
        spec.get_worker(caches)
    two_groups = CanonicalKVCaches(tensors=caches.tensors, group_data_refs=caches.group_data_refs * 2)
    with pytest.raises(ValueError, match="2 KV-cache groups"):
        KvoffloadSpec(config(shm_dir, "host")).get_worker(two_groups)


def test_data_parallel_replicas_given_one_engine_id_are_refused(shm_dir):
    # Two DP replicas, each with its own rank 0 worker, configured with one kvoffload_engine_id:
    # sharing the region would let each serve the other's KV. The second replica's worker is
    # refused naming the first one's PID; with distinct ids both run.
    first_cfg = config(shm_dir, "host")
    second_cfg = config(shm_dir, "host", kvoffload_engine_id=first_cfg.extra_config["kvoffload_engine_id"])
    _, caches = kv_caches(7)
    first = KvoffloadSpec(first_cfg).get_worker(caches)
    with pytest.raises(kvoffload.Error) as e:
        KvoffloadSpec(second_cfg).get_worker(caches)
    assert e.value.code == kvoffload.ErrorCode.IN_USE
    assert f"rank 0 of engine '{first_cfg.extra_config['kvoffload_engine_id']}'" in str(e.value)
    assert f"is held by PID {os.getpid()}." in str(e.value)
    other = KvoffloadSpec(config(shm_dir, "host")).get_worker(caches)  # its own engine id
    other.shutdown()
    first.shutdown()


def test_replicated_layout_workers_each_hold_their_own_rank(shm_dir):
    # MLA: every rank's slot is copy 0 of the row, but each worker still holds its own rank, so
    # tensor-parallel ranks attach side by side and a second rank-1 worker is refused.
    def replicated(rank):
        cfg = config(shm_dir, "host", replicated_layout=True, kvoffload_rank=rank,
                     kvoffload_engine_id=engine_id)
        cfg.parallel.world_size = 2
        return KvoffloadSpec(cfg)

    engine_id = "vllm-mla-" + uuid.uuid4().hex[:8]
    _, caches = kv_caches(8)
    rank0 = replicated(0).get_worker(caches)
    rank1 = replicated(1).get_worker(caches)
    assert rank0._region.rank == 0 and rank1._region.rank == 1
    np.asarray(rank0._region.slot(2))[:] = 0x3C
    assert (np.asarray(rank1._region.slot(2)) == 0x3C).all()  # rank 1's slot is copy 0 too
    with pytest.raises(kvoffload.Error) as e:
        replicated(1).get_worker(caches)
    assert e.value.code == kvoffload.ErrorCode.IN_USE
    rank1.shutdown()
    rank0.shutdown()
