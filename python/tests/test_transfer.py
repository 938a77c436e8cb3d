# A host-backend round trip: numpy arrays stand in for device KV caches, their addresses are the
# "device pointers" (as tensor.data_ptr() would be on a GPU).
import os

import numpy as np
import pytest

import kvoffload

NBLOCKS, PAGE0, PAGE1, BPC = 8, 256, 128, 2


def caches():
    rng = np.random.default_rng(5)
    k = rng.integers(0, 256, size=(NBLOCKS, PAGE0), dtype=np.uint8)
    v = rng.integers(0, 256, size=(NBLOCKS, PAGE1), dtype=np.uint8)
    return k, v


def groups_of(k, v):
    return [[kvoffload.DeviceTensor(k.ctypes.data, NBLOCKS, PAGE0),
             (v.ctypes.data, NBLOCKS, PAGE1, PAGE1)]]


def test_runtime_basics():
    names = [b.name for b in kvoffload.list_backends()]
    assert "host" in names
    rt = kvoffload.make_runtime("host")
    assert rt.name == "host"
    s = rt.create_stream()
    e = rt.create_event()
    rt.record_event(e, s)
    rt.synchronize_event(e)
    assert rt.query_event(e)
    buf = rt.allocate_device(64)
    rt.memset_sync(buf.address, 0x11, 64)
    out = np.zeros(64, dtype=np.uint8)
    rt.memcpy_sync(out.ctypes.data, buf.address, 64)
    assert (out == 0x11).all()
    with pytest.raises(kvoffload.Error) as err:
        kvoffload.make_runtime("bogus")
    assert err.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT and "bogus" in str(err.value)


def test_round_trip_through_region(shm_dir):
    k, v = caches()
    rt = kvoffload.make_runtime("host")
    compute = rt.create_stream()
    region = kvoffload.Region.create_or_join(engine_id="py-xfer", num_chunks=4,
                                             slot_bytes=BPC * (PAGE0 + PAGE1), rank=0, shm_dir=shm_dir)
    engine = kvoffload.TransferEngine(rt, region, 0, groups_of(k, v), BPC)

    engine.submit(1, "store", [1, 2], [[0, 1, 2, 3]], wait_stream=compute)
    (r,) = engine.wait([1])
    assert r.success and r.job_id == 1 and r.direction == "store" and r.bytes == 4 * (PAGE0 + PAGE1)

    # The slot of chunk 2 holds blocks 2, 3 of k, then of v (zero-copy numpy view).
    slot = np.asarray(region.slot(2))
    assert (slot[:PAGE0] == k[2]).all() and (slot[PAGE0:2 * PAGE0] == k[3]).all()
    assert (slot[2 * PAGE0:2 * PAGE0 + PAGE1] == v[2]).all()
    del slot

    engine.submit(2, kvoffload.Direction.LOAD, [1, 2], [[4, 5, 6, 7]], wait_stream=compute.native)
    results = engine.wait_all()
    assert [x.job_id for x in results] == [2] and results[0].success
    assert (k[4:8] == k[0:4]).all() and (v[4:8] == v[0:4]).all()

    # Mid-chunk start: block 0 at position 1 of chunk 3.
    engine.submit(3, "store", [3], [[5]], skip=1)
    engine.wait([3])
    assert (np.asarray(region.slot(3))[PAGE0:2 * PAGE0] == k[5]).all()
    assert engine.poll() == []

    stats = engine.stats()
    assert stats["jobs_succeeded"] == 3 and stats["jobs_failed"] == 0

    # Errors come back as kvoffload.Error with the engine's message.
    with pytest.raises(kvoffload.Error) as e:
        engine.submit(4, "store", [9], [[0]])
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT and "out of range" in str(e.value)
    with pytest.raises(kvoffload.Error) as e:
        engine.wait([99])
    assert e.value.code == kvoffload.ErrorCode.NOT_FOUND
    with pytest.raises(kvoffload.Error, match="direction must be 'store' or 'load', got 'sideways'") as e:
        engine.submit(4, "sideways", [1], [[0]])
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    engine.shutdown()
    with pytest.raises(kvoffload.Error) as e:
        engine.submit(5, "store", [1], [[0]])
    assert e.value.code == kvoffload.ErrorCode.STATE
    del engine
    region.close()


def test_an_engine_on_a_closed_region_is_refused(shm_dir):
    k, v = caches()
    rt = kvoffload.make_runtime("host")
    region = kvoffload.Region.create_or_join(engine_id="py-closed", num_chunks=4,
                                             slot_bytes=BPC * (PAGE0 + PAGE1), rank=0, shm_dir=shm_dir)
    region.close()
    with pytest.raises(kvoffload.Error, match="the region is closed") as e:
        kvoffload.TransferEngine(rt, region, 0, groups_of(k, v), BPC)
    assert e.value.code == kvoffload.ErrorCode.STATE
    assert os.listdir(shm_dir) == []  # the refused engine created nothing


def test_engine_over_a_numpy_buffer():
    k, v = caches()
    rt = kvoffload.make_runtime("host")
    slot_bytes = BPC * (PAGE0 + PAGE1)
    host = np.zeros(4 * slot_bytes, dtype=np.uint8)
    with kvoffload.TransferEngine.for_buffer(rt, host, slot_bytes, groups_of(k, v), BPC,
                                             register_host=False) as engine:
        engine.submit(10, "store", [0], [[6, 7]])
        assert engine.wait([10])[0].success
    assert (host[:PAGE0] == k[6]).all() and (host[PAGE0:2 * PAGE0] == k[7]).all()


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_job_timing_off_leaves_seconds_zero(backend):
    # Issue 25 (8): job_timing=False records no timing event (counted on the simulated device by
    # sim_device_test's TimingEventsAreRecordedOnlyForTimedJobs), so a result's seconds is 0; by
    # default each job's copies are timed.
    rt = kvoffload.make_runtime(backend)
    page = 4096
    dev = rt.allocate_device(4 * page)
    rt.memset_sync(int(dev), 0x5A, 4 * page)
    host = np.zeros(4 * page, dtype=np.uint8)
    groups = [[kvoffload.DeviceTensor(int(dev), 4, page, page)]]
    for timing in (True, False):
        with kvoffload.TransferEngine.for_buffer(rt, host, 2 * page, groups, 2, register_host=False,
                                                 allow_kernel=False, job_timing=timing) as engine:
            engine.submit(1, "store", [0, 1], [[0, 1, 2, 3]])
            (r,) = engine.wait([1])
            assert r.success and r.bytes == 4 * page
            assert (r.seconds > 0.0) if timing else (r.seconds == 0.0)
        assert (host == 0x5A).all()
        host[:] = 0
