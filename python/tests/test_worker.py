# kvoffload.OffloadWorker (Note [Rank assembly]): one rank assembled by the library, in both
# bring-up modes, on the host backend. numpy arrays stand in for the device KV caches.
import numpy as np
import pytest

import kvoffload

NBLOCKS, PAGE, BPC = 16, 4096, 2
SLOT = BPC * PAGE  # one tensor: a slot is two blocks


def worker(shm_dir, engine_id, caches, **kw):
    return kvoffload.OffloadWorker(engine_id=engine_id, num_chunks=8, slot_bytes=SLOT,
                                   world_size=1, rank=0,
                                   groups=[[(caches.ctypes.data, NBLOCKS, PAGE)]],
                                   blocks_per_chunk=BPC, backend="host", shm_dir=shm_dir, **kw)


@pytest.mark.parametrize("bringup", ["blocking", "background"])
def test_worker_registers_each_piece_and_round_trips(shm_dir, bringup):
    caches = np.random.default_rng(3).integers(0, 256, size=(NBLOCKS, PAGE), dtype=np.uint8)
    # Pieces of 1, 2, 4 and then the 1 row left (Note [Growing pieces]).
    w = worker(shm_dir, "py-worker-" + bringup, caches, bringup=bringup,
               bringup_first_piece_bytes=SLOT, bringup_piece_bytes=4 * SLOT)
    w.wait_bringup()
    st = w.bringup_status()
    assert st["state"] == "ready" and st["ready_chunks"] == 8 and st["error"] is None
    reg = w.registration()
    assert reg["pieces"] == 4 and reg["bytes"] == w.geometry.data_bytes
    assert w.backend == "host" and w.device == 0
    engine = w.engine
    assert engine.host_registered  # told of every piece: they cover the region

    engine.submit(1, "store", [3, 4], [[0, 1, 2, 3]])
    (r,) = engine.wait([1])
    assert r.success and r.bytes == 4 * PAGE
    expect = caches[:4].copy()
    caches[:4] = 0
    engine.submit(2, "load", [3, 4], [[0, 1, 2, 3]])
    (r,) = engine.wait([2])
    assert r.success and (caches[:4] == expect).all()

    with pytest.raises(kvoffload.Error) as err:
        w.close()
    assert err.value.code == kvoffload.ErrorCode.STATE and "worker.engine" in str(err.value)
    del engine
    assert w.close() is True
    assert w.close() is True
    with pytest.raises(kvoffload.Error):
        w.bringup_status()


def test_worker_refuses_bad_configuration_before_anything_exists(shm_dir):
    caches = np.zeros((NBLOCKS, PAGE), dtype=np.uint8)
    with pytest.raises(kvoffload.Error) as err:
        worker(shm_dir, "py-worker-bad", caches, bringup="lazy")
    assert err.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT and "'lazy'" in str(err.value)
    with pytest.raises(kvoffload.Error) as err:
        worker(shm_dir, "py-worker-bad", caches, bringup_first_piece_bytes=0)
    assert "bringup_first_piece_bytes is 0" in str(err.value)
    assert kvoffload.list_regions(shm_dir) == []
