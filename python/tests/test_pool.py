"""kvoffload.NodePool: one chunk pool per node shared by engines (docs/DESIGN.md §6.6)."""

import os
import subprocess
import sys
import tempfile
import shutil

import pytest

import kvoffload

GEOMETRY = dict(slot_bytes=64, slot_count=8, world_size=2, layout="layer_major", dtype="bf16",
                fingerprint="llama/ns0")


@pytest.fixture
def pool_dir():
    # On tmpfs, as /dev/shm is (the pool file is created with O_TMPFILE).
    d = tempfile.mkdtemp(dir="/dev/shm", prefix="kvoffload-pytest-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def chunk_bytes(key, rank):
    return bytes((key * 7 + rank * 13 + i) % 256 for i in range(64))


def store(pool, keys):
    plan = pool.prepare_stores(keys)
    for slot, pos in zip(plan.slots, plan.positions):
        for rank in range(2):
            pool.write_chunk(slot, chunk_bytes(keys[pos], rank), rank)
    pool.commit_stores(plan.slots)
    return plan


def test_a_chunk_stored_by_one_engine_is_a_verified_hit_for_another(pool_dir):
    with kvoffload.NodePool.attach("p", "engine-a", shm_dir=pool_dir, **GEOMETRY) as a, \
            kvoffload.NodePool.attach("p", "engine-b", shm_dir=pool_dir, **GEOMETRY) as b:
        assert os.path.exists(a.path) and a.attached
        assert len(store(a, [1, 2, 3]).slots) == 3
        got = b.lookup([1, 2, 3, 4], pin=True)
        assert got.hits == 3 and got.cross_engine_hits == 3
        for key, slot in zip([1, 2, 3], got.slots):
            assert b.read_chunk(slot, 1) == chunk_bytes(key, 1)
        b.unpin(got.slots)
        lk, st = b.lookup_and_prepare([1, 2, 9], pin=False)
        assert lk.hits == 2 and st.positions == [2] and len(st.slots) == 1
        b.abort_stores(st.slots)
        stats = a.stats()
        assert [t["engine_id"] for t in stats["tenants"]] == ["engine-a", "engine-b"]
        assert stats["tenants"][1]["cross_engine_hits"] == 5 and stats["ready"] == 3
        assert a.check_invariants() == []
        path = a.path
    assert not os.path.exists(path)  # the last tenant out removed it


def test_another_fingerprint_is_refused_naming_both(pool_dir):
    with kvoffload.NodePool.attach("p", "a", shm_dir=pool_dir, **GEOMETRY):
        other = dict(GEOMETRY, fingerprint="mistral/ns0")
        with pytest.raises(kvoffload.Error) as e:
            kvoffload.NodePool.attach("p", "b", shm_dir=pool_dir, **other)
        assert e.value.code == kvoffload.ErrorCode.MISMATCH
        assert "'llama/ns0' in the pool, 'mistral/ns0'" in str(e.value)
    with pytest.raises(kvoffload.Error) as e:
        kvoffload.NodePool.attach("p", "a", shm_dir=pool_dir, lock_timeout=-1, **GEOMETRY)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT


def test_an_arc_pool_refuses_an_lru_tenant_and_reports_its_lists(pool_dir):
    with kvoffload.NodePool.attach("p", "a", shm_dir=pool_dir, policy="arc", **GEOMETRY) as a:
        with pytest.raises(kvoffload.Error) as e:
            kvoffload.NodePool.attach("p", "b", shm_dir=pool_dir, **GEOMETRY)
        assert e.value.code == kvoffload.ErrorCode.MISMATCH
        assert "policy is 'arc' in the pool, 'lru'" in str(e.value)
        store(a, [1, 2])
        a.unpin(a.lookup([1], pin=True).slots)  # seen twice: T1 -> T2
        stats = a.stats()
        assert stats["policy"] == "arc"
        assert (stats["recent"], stats["frequent"], stats["arc_target"]) == (1, 1, 0)
        assert a.check_invariants() == []
    with pytest.raises(kvoffload.Error) as e:
        kvoffload.NodePool.attach("p", "a", shm_dir=pool_dir, policy="mru", **GEOMETRY)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT


def test_a_second_python_process_shares_the_pool(pool_dir):
    with kvoffload.NodePool.attach("p", "parent", shm_dir=pool_dir, **GEOMETRY) as p:
        child = f"""
import kvoffload, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_pool import GEOMETRY, store
with kvoffload.NodePool.attach("p", "child", shm_dir={pool_dir!r}, **GEOMETRY) as c:
    store(c, [10, 11])
"""
        subprocess.run([sys.executable, "-c", child], check=True, env=dict(os.environ))
        got = p.lookup([10, 11], pin=True)
        assert got.hits == 2 and got.cross_engine_hits == 2
        assert [p.read_chunk(s, 0) for s in got.slots] == [chunk_bytes(10, 0), chunk_bytes(11, 0)]
        p.unpin(got.slots)
        assert len(p.stats()["tenants"]) == 1
    with pytest.raises(kvoffload.Error) as e:
        p.read_chunk(0)
    assert e.value.code == kvoffload.ErrorCode.STATE


def test_chunk_addresses_are_where_a_transfer_engine_finds_the_slots(pool_dir):
    # kvoffload.vllm's node pool builds TransferEngine.for_buffer over these (kvoffload.vllm_pool).
    # Rank-major: rank r's slot of every chunk is one range, rank_range(r).
    with kvoffload.NodePool.attach("p", "a", shm_dir=pool_dir, **GEOMETRY) as p:
        assert p.slot_stride >= GEOMETRY["slot_bytes"] and p.slot_stride % 256 == 0
        assert p.row_stride == p.slot_stride
        r0, r1 = p.rank_range(0), p.rank_range(1)
        assert r0["bytes"] == r1["bytes"] == p.rank_stride >= GEOMETRY["slot_count"] * p.slot_stride
        assert r1["address"] == r0["address"] + p.rank_stride
        assert r1["file_offset"] == r0["file_offset"] + p.rank_stride
        assert os.path.getsize(p.path) == r1["file_offset"] + p.rank_stride
        base = p.chunk_address(0, 0)
        assert base == r0["address"]
        assert p.chunk_address(3, 1) == r1["address"] + 3 * p.slot_stride
        p.write_chunk(3, chunk_bytes(3, 1), 1)
        import ctypes
        assert ctypes.string_at(r1["address"] + 3 * p.slot_stride, 64) == chunk_bytes(3, 1)
        with pytest.raises(kvoffload.Error):
            p.rank_range(GEOMETRY["world_size"])
        with pytest.raises(kvoffload.Error):
            p.chunk_address(GEOMETRY["slot_count"], 0)
