# kvoffload.sglang.KvoffloadStorage's pool backend (kvoffload's node pool as the L3 shared by
# every SGLang instance of the model on the node) against SGLang's real code (factory, MHA/MLA
# host pools on CPU tensors, HiCacheController storage paths), in the test's own /dev/shm dir:
# two instances share pages, another model or TP layout never reads them, an MLA model's TP ranks
# share one pool (rank 0 writing), an instance killed with SIGKILL leaves the other serving, and
# the C++ page copy (sglang_pool_copy) checks a whole batch before it copies.
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
import sglang_env as env
import torch  # noqa: E402  (after sglang_env's shims)

LAYOUTS = [("mha", "page_first"), ("mha", "page_first_direct"), ("mla", "page_first"),
           ("mla", "page_first_direct")]


@pytest.fixture
def shm_dir():
    d = tempfile.mkdtemp(dir="/dev/shm", prefix="kvo-sglang-pool-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pool_cfg(shm_dir, **extra):
    return {"kvoffload_backend": "pool", "capacity_bytes": 8 << 20, "shm_dir": shm_dir, **extra}


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_a_page_one_instance_backed_up_is_prefetched_by_another(shm_dir, kind, layout):
    pool_a, pool_b = env.host_pool(kind, layout), env.host_pool(kind, layout)
    a = env.backend(pool_a, pool_cfg(shm_dir))
    b = env.backend(pool_b, pool_cfg(shm_dir))
    tokens = list(range(100 * env.PAGE))
    hi_a = pool_a.alloc(len(tokens))
    assert env.Controller(pool_a, a).backup(hi_a, tokens) == len(tokens)
    pool_b.kv_buffer.zero_()
    hi_b = pool_b.alloc(len(tokens))
    assert env.Controller(pool_b, b).prefetch(tokens, hi_b) == (len(tokens), len(tokens))
    pa, sizes = pool_a.get_page_buffer_meta(hi_a)
    pb, _ = pool_b.get_page_buffer_meta(hi_b)
    assert all(ctypes.string_at(x, s) == ctypes.string_at(y, s) for x, y, s in zip(pa, pb, sizes))
    assert b.stats()["cross_instance_hits"] >= 100
    assert a.stats()["entries"] == 100
    a.close()
    b.close()
    assert os.listdir(shm_dir) == []  # the last instance out removed the pool


def test_another_model_or_tp_layout_never_reads_the_pages(shm_dir):
    pool = env.host_pool("mha", "page_first")
    a = env.backend(pool, pool_cfg(shm_dir))
    tokens = list(range(20 * env.PAGE))
    hi = pool.alloc(len(tokens))
    assert env.Controller(pool, a).backup(hi, tokens) == len(tokens)
    keys = env.page_hashes(tokens)
    other_model = env.backend(env.host_pool("mha", "page_first"), pool_cfg(shm_dir), model="org/other")
    other_tp = env.backend(env.host_pool("mha", "page_first"), pool_cfg(shm_dir), tp_rank=1, tp_size=2)
    same = env.backend(env.host_pool("mha", "page_first"), pool_cfg(shm_dir))
    assert other_model.batch_exists(keys) == 0 and other_tp.batch_exists(keys) == 0
    assert same.batch_exists(keys) == 20
    assert same.batch_exists(keys[:5] + ["nope"] + keys[5:]) == 5  # consecutive from the first
    for b in (a, other_model, other_tp, same):
        b.close()


def test_bad_pool_settings_are_refused_naming_the_key(shm_dir):
    pool = env.host_pool("mha", "page_first")
    with pytest.raises(ValueError, match="'capacity_bytes' is required"):
        env.backend(pool, {"kvoffload_backend": "pool"})
    with pytest.raises(ValueError, match=r"unknown keys \['root_dir'\]"):
        env.backend(pool, pool_cfg(shm_dir, root_dir="/tmp"))
    with pytest.raises(ValueError, match="cap_fraction=2 must be a number in"):
        env.backend(pool, pool_cfg(shm_dir, cap_fraction=2))


INSTANCE = r"""
import sys
sys.path.insert(0, {here!r})
import sglang_env as env
pool = env.host_pool("mha", "page_first")
b = env.backend(pool, {cfg!r})
tokens = list(range(40 * env.PAGE))
hi = pool.alloc(len(tokens))
ctl = env.Controller(pool, b)
assert ctl.backup(hi, tokens) == len(tokens)
print("stored", flush=True)
i = 0
while True:  # backs up and prefetches until killed
    more = list(range(10**6 + i * 4 * env.PAGE, 10**6 + (i + 1) * 4 * env.PAGE))
    ctl.backup(hi[:len(more)], more)
    ctl.prefetch(tokens, hi)
    i += 1
"""


def test_an_instance_killed_mid_run_leaves_the_other_serving(shm_dir, tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    err = open(tmp_path / "instance.err", "w")
    child = subprocess.Popen([sys.executable, "-c", INSTANCE.format(here=here, cfg=pool_cfg(shm_dir))],
                             stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        if not any(line.strip() == "stored" for line in child.stdout):
            raise AssertionError((tmp_path / "instance.err").read_text()[-3000:])
        pool = env.host_pool("mha", "page_first")
        b = env.backend(pool, pool_cfg(shm_dir))
        tokens = list(range(40 * env.PAGE))
        hi = pool.alloc(len(tokens))
        ctl = env.Controller(pool, b)
        assert ctl.prefetch(tokens, hi) == (len(tokens), len(tokens))
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        # Its committed pages are still served; the pool repairs its pins and writes away.
        assert ctl.prefetch(tokens, hi) == (len(tokens), len(tokens))
        mine = list(range(5 * 10**6, 5 * 10**6 + 30 * env.PAGE))
        hi2 = pool.alloc(len(mine))
        assert ctl.backup(hi2, mine) == len(mine)
        assert ctl.prefetch(mine, hi2) == (len(mine), len(mine))
        b._core.pool.reclaim_dead_tenants()
        assert b._core.pool.check_invariants() == []
        assert child.pid not in [t["pid"] for t in b._core.pool.stats()["tenants"]]
        b.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        err.close()


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_mla_with_tensor_parallelism_rank_zero_writes_and_every_rank_reads(shm_dir, layout):
    pools = [env.host_pool("mla", layout) for _ in range(2)]
    ranks = [env.backend(pools[r], pool_cfg(shm_dir), tp_rank=r, tp_size=2) for r in (0, 1)]
    assert ranks[0]._core.name == ranks[1]._core.name  # one pool for the ranks' identical pages
    tokens = list(range(20 * env.PAGE))
    hi = [p.alloc(len(tokens)) for p in pools]
    # Rank 1 first: SGLang skips its backup (backup_skip), and a direct call writes nothing.
    assert env.Controller(pools[1], ranks[1]).backup(hi[1], tokens) == 0
    assert ranks[1].batch_set_v1(env.page_hashes(tokens), hi[1]) == [True] * 20
    assert ranks[1].stats()["entries"] == 0
    assert env.Controller(pools[0], ranks[0]).backup(hi[0], tokens) == len(tokens)
    ref = pools[0].kv_buffer.clone()
    pools[1].kv_buffer.zero_()
    assert env.Controller(pools[1], ranks[1]).prefetch(tokens, hi[1]) == (len(tokens), len(tokens))
    p0, sizes = pools[0].get_page_buffer_meta(hi[0])
    p1, _ = pools[1].get_page_buffer_meta(hi[1])
    r0, r1 = ref.view(torch.uint8).flatten(), env.buffer(pools[1]).flatten()
    b0, b1 = pools[0].kv_buffer.data_ptr(), pools[1].kv_buffer.data_ptr()
    for x, y, s in zip(p0, p1, sizes):
        assert torch.equal(r0[x - b0:x - b0 + s], r1[y - b1:y - b1 + s])
    assert ranks[1].stats()["cross_instance_hits"] >= 20
    for r in ranks:
        r.close()


def test_a_get_loads_the_pages_held_after_a_miss(shm_dir):
    pool = env.host_pool("mha", "page_first")
    b = env.backend(pool, pool_cfg(shm_dir))
    keys = env.page_hashes(list(range(4 * env.PAGE)))
    hi = pool.alloc(4 * env.PAGE)
    ref = pool.kv_buffer.clone()
    assert b.batch_set_v1([keys[0], keys[2], keys[3]],
                          torch.cat([hi[:env.PAGE], hi[2 * env.PAGE:]])) == [True] * 3
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(keys, hi) == [True, False, True, True]
    held = torch.cat([hi[:env.PAGE], hi[2 * env.PAGE:]])
    assert env.pages_equal(pool, ref, held)
    assert b._core.pool.stats()["pinned"] == 0  # every pin of the call released
    b.close()


def test_the_copy_checks_every_page_before_copying_any(shm_dir):
    from kvoffload import _kvoffload as ext

    pool = env.host_pool("mha", "page_first")
    b = env.backend(pool, pool_cfg(shm_dir))
    npool = b._core.pool
    slots = b._core.pool.prepare_stores([1, 2]).slots
    src = torch.randint(0, 256, (2, b.pieces * b.piece_bytes), dtype=torch.uint8)
    half = b.piece_bytes
    ptrs = [src[i].data_ptr() + j * half for i in range(2) for j in range(b.pieces)]
    sizes = [half] * len(ptrs)
    before = [npool.read_chunk(s) for s in slots]
    bad_cases = [
        (list(slots[:1]) + [npool.stats()["slot_count"]], ptrs, sizes, "out of range"),
        (list(slots), ptrs[:-1] + [0], sizes, "has pointer 0"),
        (list(slots), ptrs, sizes[:-1] + [b._core.page_bytes + 1], "bytes for a slot of"),
        (list(slots), ptrs[:-1], sizes[:-1], "the same number of pieces for every page"),
    ]
    for s, p, z, match in bad_cases:
        with pytest.raises(Exception, match=match):
            ext.sglang_pool_copy(npool, s, p, z, to_pool=True)
        assert [npool.read_chunk(x) for x in slots] == before  # nothing copied
    with pytest.raises(TypeError, match="expected a kvoffload.NodePool, got object"):
        ext.sglang_pool_copy(object(), list(slots), ptrs, sizes, to_pool=True)
    ext.sglang_pool_copy(npool, list(slots), ptrs, sizes, to_pool=True)
    page = b.pieces * half
    assert [npool.read_chunk(x)[:page] for x in slots] == [bytes(src[i].numpy()) for i in range(2)]
    npool.abort_stores(list(slots))
    b.close()
    with pytest.raises(Exception, match="after detach"):
        ext.sglang_pool_copy(npool, list(slots), ptrs, sizes, to_pool=False)
