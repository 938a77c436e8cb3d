# kvoffload_bringup='background' through vLLM's real types (the tree named by KVOFFLOAD_VLLM_SRC):
# the workers (kvoffload.OffloadWorker underneath) serve while their pool comes up, the
# scheduler's manager hands out only chunks every rank has brought up (Note [Ready prefix] in
# python/src/vllm_manager.cpp), and every byte stored while the pool grows is checked against the
# model of vLLM's CPU layout in test_vllm_worker.py.
import uuid

import pytest

import vllm_real

vllm_real.require()

from vllm.v1.kv_offload.base import GPULoadStoreSpec, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

from kvoffload.vllm import KvoffloadSpec, bringup_settings  # noqa: E402
from test_vllm_worker import CTX, ONE_GROUP, Device, KvCaches, backends, offloading_config  # noqa: E402

CHUNKS = 2048  # 4 KiB rows (two ranks' 512-byte slots): 8 MiB, two rows a piece
PIECE = 2 * 4096


def key(i):
    return make_offload_key(i.to_bytes(4, "little") * 8, 0)


def store(worker, kv, job, slot, i):
    """Rank `worker` stores GPU blocks 2(i%8), 2(i%8)+1 into chunk `slot`; the model follows."""
    gpu = GPULoadStoreSpec([2 * (i % 8), 2 * (i % 8) + 1], group_sizes=[2], block_indices=[0])
    cpu = CPULoadStoreSpec([slot])
    assert worker.submit_store(job, gpu, cpu)
    kv.model_store(gpu, cpu)
    worker.wait({job})
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(job, True)]


@pytest.mark.parametrize("backend", backends())
def test_a_background_pool_serves_while_it_grows_and_no_slot_beyond_the_ready_prefix(
        shm_dir, backend):
    kv0 = KvCaches(Device(backend), bpc=2, seed=21, **ONE_GROUP)
    kv1 = KvCaches(Device(backend), bpc=2, seed=22, **ONE_GROUP)
    engine_id = "bringup-" + uuid.uuid4().hex[:8]
    specs = [KvoffloadSpec(offloading_config(
        shm_dir, kv0, backend, chunks=CHUNKS, world_size=2, rank=r, engine_id=engine_id,
        kvoffload_bringup="background", kvoffload_bringup_piece=PIECE)) for r in (0, 1)]
    assert specs[0].num_blocks == CHUNKS and specs[0].bringup == "background"
    manager = specs[0].get_manager()  # the scheduler maps the region first: nothing is up
    assert manager.prepare_store([key(0)], CTX) is None
    assert manager._core.following_readiness and manager._core.ready_chunks == 0
    w0 = specs[0].get_worker(kv0.caches)
    w0._worker.wait_bringup()
    assert w0._worker.bringup_status()["ready_chunks"] == CHUNKS
    # Rank 0 is up, rank 1 has not joined: no chunk is up on every rank, none is handed out.
    assert w0._worker.chunks_ready_on_all_ranks() == 0
    assert manager.prepare_store([key(0)], CTX) is None
    w1 = specs[1].get_worker(kv1.caches)

    job, i, stored_while_growing, slots = 0, 0, 0, {}
    while i < 4 * CHUNKS:
        before = w0._worker.chunks_ready_on_all_ranks()
        out = manager.prepare_store([key(i)], CTX)
        after = w0._worker.chunks_ready_on_all_ranks()
        if out is None:
            # Only while nothing is up on both ranks: from the first piece on, a store is served.
            assert before == 0, f"no store with {before} chunks up on every rank"
            continue
        (slot,) = out.store_spec.block_ids.tolist()
        assert slot < after, f"chunk {slot} handed out with only {after} up on every rank"
        for w, kv in ((w0, kv0), (w1, kv1)):
            job += 1
            store(w, kv, job, slot, i)
        manager.complete_store(out.keys_to_store, CTX)
        slots[i] = slot
        stored_while_growing += after < CHUNKS
        i += 1
        if after == CHUNKS and i >= 64:
            break
    assert w1._worker.bringup_status()["state"] == "ready"
    # Every byte of both ranks' slots, the chunks stored while the pool grew included.
    kv0.check_region(w0._worker, rank=0, num_chunks=CHUNKS)
    kv1.check_region(w0._worker, rank=1, num_chunks=CHUNKS)
    # Once the pool is up the scheduler drops its mapping (the next plan costs nothing more).
    assert manager.prepare_store([key(i)], CTX) is not None
    assert not manager._core.following_readiness and manager._core.ready_chunks == CHUNKS
    # Loaded back from the first chunk stored (it came from the first piece).
    (loaded,) = manager.prepare_load([key(0)], CTX).block_ids.tolist()
    assert loaded == slots[0]
    dst = GPULoadStoreSpec([14, 15], group_sizes=[2], block_indices=[0])
    for w, kv in ((w0, kv0), (w1, kv1)):
        job += 1
        assert w.submit_load(job, CPULoadStoreSpec([loaded]), dst)
        kv.model_load(CPULoadStoreSpec([loaded]), dst)
        w.wait({job})
        assert [r.success for r in w.get_finished()] == [True]
        kv.check_device()
    print(f"stores served while the pool grew: {stored_while_growing} of {i}")
    manager.shutdown()
    w1.shutdown()
    w0.shutdown()


def test_blocking_is_the_default_and_the_scheduler_maps_nothing(shm_dir):
    kv = KvCaches(Device("host"), bpc=2, seed=23, **ONE_GROUP)
    spec = KvoffloadSpec(offloading_config(shm_dir, kv))
    assert (spec.bringup, spec.bringup_piece_bytes) == ("blocking", None)
    manager = spec.get_manager()
    assert not manager._core.following_readiness
    worker = spec.get_worker(kv.caches)
    assert worker.bringup_status()["state"] == "ready"
    out = manager.prepare_store([key(0)], CTX)
    assert out.store_spec.block_ids.tolist() == [0]
    worker.shutdown()


@pytest.mark.parametrize("given, expected", [
    ({}, ("blocking", None)),
    ({"kvoffload_bringup": "background"}, ("background", None)),
    ({"kvoffload_bringup": "Background", "kvoffload_bringup_piece": "256M"},
     ("background", 256 << 20)),
    ({"kvoffload_bringup_piece": 4096}, ("blocking", 4096)),
    ({"kvoffload_bringup_piece": "1GiB"}, ("blocking", 1 << 30)),
])
def test_bringup_settings(given, expected):
    assert bringup_settings(given) == expected


@pytest.mark.parametrize("given, message", [
    ({"kvoffload_bringup": "fast"},
     r"kvoffload_bringup='fast' is not one of \['blocking', 'background'\]"),
    ({"kvoffload_bringup": 1}, r"kvoffload_bringup=1 is not one of"),
    ({"kvoffload_bringup_piece": 0}, r"kvoffload_bringup_piece=0 is not a positive number of bytes"),
    ({"kvoffload_bringup_piece": -4096}, r"kvoffload_bringup_piece=-4096 is not a positive"),
    ({"kvoffload_bringup_piece": "big"}, r"kvoffload_bringup_piece='big' is not .*'256M'"),
    ({"kvoffload_bringup_piece": True}, r"kvoffload_bringup_piece=True is not"),
])
def test_bad_bringup_settings_are_refused_naming_key_value_and_what_is_allowed(
        shm_dir, given, message):
    kv = KvCaches(Device("host"), bpc=2, seed=24, **ONE_GROUP)
    with pytest.raises(ValueError, match=message):
        KvoffloadSpec(offloading_config(shm_dir, kv, **given))


def test_background_is_refused_on_the_node_pool(shm_dir):
    kv = KvCaches(Device("host"), bpc=2, seed=25, **ONE_GROUP)
    with pytest.raises(ValueError, match=r"kvoffload_bringup='background' is for the private pool"):
        KvoffloadSpec(offloading_config(shm_dir, kv, kvoffload_pool="node", eviction_policy="lru",
                                        kvoffload_bringup="background"))
