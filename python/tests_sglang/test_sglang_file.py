# kvoffload.sglang.KvoffloadStorage's file backend (kvoffload's file tier) against SGLang's real
# code (factory, MHA/MLA host pools on CPU tensors, HiCacheController storage paths), on the
# test's own directories: a disk directory, a tmpfs directory, and a 1 MiB tmpfs mounted by the
# test for the full filesystem.
import glob
import os
import subprocess

import pytest
import sglang_env as env
import torch

LAYOUTS = [("mha", "page_first"), ("mha", "page_first_direct"), ("mla", "page_first"),
           ("mla", "page_first_direct")]


def file_cfg(root, **extra):
    return {"kvoffload_backend": "file", "root_dir": str(root), **extra}


def records(b):
    return sorted(glob.glob(os.path.join(b.root, "??", "*.kvb")))


@pytest.fixture
def tmpfs_dir():
    d = f"/dev/shm/kvo-sglang-test-{os.getpid()}-{os.urandom(4).hex()}"
    os.makedirs(d)
    yield d
    subprocess.run(["rm", "-rf", d], check=True)


@pytest.mark.parametrize("kind,layout", LAYOUTS)
@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_controller_backup_then_prefetch_restores_every_page(tmp_path, tmpfs_dir, where, kind,
                                                             layout):
    root = tmp_path if where == "disk" else tmpfs_dir
    pool = env.host_pool(kind, layout)
    b = env.backend(pool, file_cfg(root))
    ctl = env.Controller(pool, b)
    tokens = list(range(300 * env.PAGE))
    hi = pool.alloc(len(tokens))
    ref = pool.kv_buffer.clone()
    assert ctl.backup(hi, tokens) == len(tokens)
    pool.kv_buffer.zero_()
    assert ctl.prefetch(tokens, hi) == (len(tokens), len(tokens))
    assert env.pages_equal(pool, ref, hi)
    assert len(records(b)) == 300 * b.pieces
    b.close()


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_a_restarted_instance_finds_its_pages(tmp_path, kind, layout):
    pool = env.host_pool(kind, layout)
    first = env.backend(pool, file_cfg(tmp_path))
    tokens = list(range(50 * env.PAGE))
    hi = pool.alloc(len(tokens))
    ref = pool.kv_buffer.clone()
    assert env.Controller(pool, first).backup(hi, tokens) == len(tokens)
    root = first.root
    first.close()
    # The restarted server: a new pool (zeros), a new backend on the same root_dir, re-indexed.
    pool2 = env.host_pool(kind, layout)
    pool2.kv_buffer.zero_()
    again = env.backend(pool2, file_cfg(tmp_path))
    assert again.root == root
    assert again.stats()["entries"] == 50 * again.pieces
    hi2 = pool2.alloc(len(tokens))
    assert env.Controller(pool2, again).prefetch(tokens, hi2) == (len(tokens), len(tokens))
    p1, sizes = pool.get_page_buffer_meta(hi)
    p2, _ = pool2.get_page_buffer_meta(hi2)
    r, n = ref.view(torch.uint8).flatten(), env.buffer(pool2).flatten()
    b1, b2 = pool.kv_buffer.data_ptr(), pool2.kv_buffer.data_ptr()
    for x, y, s in zip(p1, p2, sizes):
        assert torch.equal(r[x - b1:x - b1 + s], n[y - b2:y - b2 + s])
    again.close()


def test_a_second_live_instance_on_the_same_directory_is_refused(tmp_path):
    a = env.backend(env.host_pool(), file_cfg(tmp_path))
    with pytest.raises(Exception, match="in use by another file tier"):
        env.backend(env.host_pool(), file_cfg(tmp_path))
    a.close()


def test_a_flipped_byte_is_a_miss_and_the_record_is_dropped(tmp_path):
    pool = env.host_pool()
    b = env.backend(pool, file_cfg(tmp_path))
    keys = env.page_hashes(list(range(2 * env.PAGE)))
    hi = pool.alloc(2 * env.PAGE)
    assert b.batch_set_v1(keys, hi) == [True, True]
    path = b.record_path(keys[0], piece=1)
    with open(path, "r+b") as f:
        f.seek(7)
        byte = f.read(1)
        f.seek(7)
        f.write(bytes([byte[0] ^ 0x10]))
    assert b.batch_get_v1(keys, hi) == [False, True]
    st = b.stats()
    assert st["corrupt"] == 1
    assert b.batch_exists(keys) == 0  # dropped: page 0 is gone, so nothing from the start
    b.close()


@pytest.mark.parametrize("other", [{"model": "org/other-model"}, {"tp_size": 2},
                                   {"tp_rank": 1, "tp_size": 2}])
def test_another_model_or_tp_layout_has_its_own_directory(tmp_path, other):
    pool = env.host_pool()
    writer = env.backend(pool, file_cfg(tmp_path))
    keys = env.page_hashes(list(range(3 * env.PAGE)))
    hi = pool.alloc(3 * env.PAGE)
    assert writer.batch_set_v1(keys, hi) == [True] * 3
    reader = env.backend(env.host_pool(), file_cfg(tmp_path), **other)
    assert reader.root != writer.root
    assert reader.batch_exists(keys) == 0
    assert reader.batch_get_v1(keys, hi) == [False] * 3
    writer.close()
    reader.close()


def test_capacity_evicts_the_oldest_pages(tmp_path):
    pool = env.host_pool()
    piece_record = 4096  # one piece (256 bytes) and its header round up to one 4 KiB block
    b = env.backend(pool, file_cfg(tmp_path, capacity_bytes=20 * 2 * piece_record))
    keys = env.page_hashes(list(range(60 * env.PAGE)))
    hi = pool.alloc(60 * env.PAGE)
    for i in range(0, 60, 10):
        assert b.batch_set_v1(keys[i:i + 10], hi[i * env.PAGE:(i + 10) * env.PAGE]) == [True] * 10
    st = b.stats()
    assert st["bytes"] <= 20 * 2 * piece_record and st["evictions"] >= 80
    assert b.batch_exists(keys) == 0  # the first pages went first
    assert b.batch_exists(keys[50:]) == 10
    b.close()


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"[no-mount] mounting a 1 MiB tmpfs needs root: {out.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_full_filesystem_evicts_instead_of_failing(small_fs):
    pool = env.host_pool(tokens=4096)
    b = env.backend(pool, file_cfg(small_fs, capacity_bytes=1 << 40))
    # 400 pages x 2 records of 4 KiB = 3.2 MiB into 1 MiB: the tier keeps below what fits.
    keys = env.page_hashes(list(range(400 * env.PAGE)))
    hi = pool.alloc(400 * env.PAGE)
    ok = []
    for i in range(0, 400, 100):
        ok += b.batch_set_v1(keys[i:i + 100], hi[i * env.PAGE:(i + 100) * env.PAGE])
    assert all(ok[-100:]), "the newest pages must be stored (older ones evicted)"
    st = b.stats()
    assert st["evictions"] > 0 and st["bytes"] <= 1 << 20
    assert b.batch_exists(keys[-50:]) == 50
    assert b.batch_get_v1(keys[-50:], hi[-50 * env.PAGE:]) == [True] * 50
    b.close()


def test_clear_removes_the_records(tmp_path):
    pool = env.host_pool()
    b = env.backend(pool, file_cfg(tmp_path))
    keys = env.page_hashes(list(range(5 * env.PAGE)))
    hi = pool.alloc(5 * env.PAGE)
    assert b.batch_set_v1(keys, hi) == [True] * 5
    assert len(records(b)) == 10
    b.clear()
    assert records(b) == [] and b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, hi) == [True] * 5  # usable again
    b.close()


def test_legacy_interface_and_draft_pages(tmp_path):
    pool = env.host_pool()
    b = env.backend(pool, file_cfg(tmp_path, interface_v1=0))
    ctl = env.Controller(pool, b)
    tokens = list(range(130 * env.PAGE))
    hi = pool.alloc(len(tokens))
    ref = pool.kv_buffer.clone()
    assert ctl.backup(hi, tokens) == len(tokens)
    pool.kv_buffer.zero_()
    assert ctl.prefetch(tokens, hi) == (len(tokens), len(tokens))
    assert env.pages_equal(pool, ref, hi)
    draft = env.host_pool(layers=1)
    keys = [f"{h}.draft" for h in env.page_hashes(tokens[:2 * env.PAGE])]
    pages = [draft.get_data_page(i * env.PAGE) for i in range(2)]
    assert b.batch_set(keys, pages)
    got = b.batch_get(keys, [draft.get_dummy_flat_data_page() for _ in keys])
    assert all(torch.equal(g.view(torch.uint8), p.view(torch.uint8)) for g, p in zip(got, pages))
    b.close()


def test_mla_with_tensor_parallelism_is_refused_naming_why(tmp_path):
    with pytest.raises(ValueError, match="an MLA model with tp_size=2"):
        env.backend(env.host_pool("mla"), file_cfg(tmp_path), tp_size=2)


@pytest.mark.parametrize("extra,match", [
    ({"kvoffload_backend": "file"}, "'root_dir' is required"),
    ({"fsync": "sometimes"}, "fsync='sometimes' must be one of"),
    ({"direct_io": "yes"}, "direct_io='yes' must be true or false"),
    ({"capacity_bytes": -5}, "capacity_bytes=-5 must be"),
    ({"url": "redis://x:1"}, r"unknown keys \['url'\]"),
])
def test_bad_configuration_is_refused_naming_the_value(tmp_path, extra, match):
    cfg = {**file_cfg(tmp_path), **extra}
    if "root_dir" not in extra and extra.get("kvoffload_backend") == "file":
        cfg.pop("root_dir")
    with pytest.raises(ValueError, match=match):
        env.backend(env.host_pool(), cfg)
