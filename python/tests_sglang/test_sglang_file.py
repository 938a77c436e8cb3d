# kvoffload.sglang.KvoffloadStorage's file backend (kvoffload's file tier) against SGLang's real
# code (factory, MHA/MLA host pools on CPU tensors, HiCacheController storage paths), on the
# test's own directories: a disk directory, a tmpfs directory, and a 1 MiB tmpfs in a private
# mount namespace for the full filesystem (Note [Private tmpfs for a full disk]); two instances
# (processes) on one directory.
import glob
import json
import os
import shutil
import subprocess
import sys

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


# A second SGLang instance (another process) on the same root_dir, both live: pages one backs up
# are hits for the other, both ways, without a restart (Note [Shared root] of the file tier).
INSTANCE = r"""
import sys
sys.path.insert(0, {here!r})
import sglang_env as env
pool = env.host_pool("mha", "page_first")
b = env.backend(pool, {cfg!r})
ctl = env.Controller(pool, b)
mine = list(range(10**6, 10**6 + 30 * env.PAGE))
hi = pool.alloc(len(mine))
ref = pool.kv_buffer.clone()
for line in sys.stdin:
    if line.strip() == "backup":
        print("backed up", ctl.backup(hi, mine), flush=True)
    elif line.strip() == "prefetch":
        theirs = list(range(20 * env.PAGE))
        hi2 = pool.alloc(len(theirs))
        print("prefetched", *ctl.prefetch(theirs, hi2), flush=True)
b.close()
"""


def test_two_live_instances_on_one_directory_share_their_pages(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.Popen(
        [sys.executable, "-c", INSTANCE.format(here=here, cfg=file_cfg(tmp_path))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pool = env.host_pool("mha", "page_first")
        b = env.backend(pool, file_cfg(tmp_path))  # both open before either has stored a page
        ctl = env.Controller(pool, b)
        tokens = list(range(20 * env.PAGE))
        hi = pool.alloc(len(tokens))
        assert ctl.backup(hi, tokens) == len(tokens)
        child.stdin.write("prefetch\n")
        child.stdin.flush()
        assert child.stdout.readline().split() == ["prefetched", str(len(tokens)), str(len(tokens))]
        child.stdin.write("backup\n")
        child.stdin.flush()
        assert child.stdout.readline().split() == ["backed", "up", str(30 * env.PAGE)]
        theirs = list(range(10**6, 10**6 + 30 * env.PAGE))
        hi2 = pool.alloc(len(theirs))
        assert ctl.prefetch(theirs, hi2) == (len(theirs), len(theirs))
        assert b.stats()["entries"] == (20 + 30) * b.pieces  # the child's pages, indexed on use
        child.stdin.close()
        assert child.wait(timeout=60) == 0, child.stderr.read()[-3000:]
        b.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_mla_with_tensor_parallelism_rank_zero_writes_and_every_rank_reads(tmp_path, layout):
    pools = [env.host_pool("mla", layout) for _ in range(2)]
    ranks = [env.backend(pools[r], file_cfg(tmp_path), tp_rank=r, tp_size=2) for r in (0, 1)]
    assert ranks[0].root == ranks[1].root  # one directory for the ranks' identical pages
    tokens = list(range(20 * env.PAGE))
    hi = [p.alloc(len(tokens)) for p in pools]
    # Rank 1 first: SGLang skips its backup (backup_skip), and a direct call writes nothing.
    assert env.Controller(pools[1], ranks[1]).backup(hi[1], tokens) == 0
    assert ranks[1].batch_set_v1(env.page_hashes(tokens), hi[1]) == [True] * 20
    assert records(ranks[1]) == []
    assert env.Controller(pools[0], ranks[0]).backup(hi[0], tokens) == len(tokens)
    assert len(records(ranks[0])) == 20  # one piece per MLA page
    ref = pools[0].kv_buffer.clone()
    hit, done = env.Controller(pools[1], ranks[1]).prefetch(tokens, hi[1])
    assert hit == done == len(tokens)
    p0, sizes = pools[0].get_page_buffer_meta(hi[0])
    p1, _ = pools[1].get_page_buffer_meta(hi[1])
    r0, r1 = ref.view(torch.uint8).flatten(), env.buffer(pools[1]).flatten()
    b0, b1 = pools[0].kv_buffer.data_ptr(), pools[1].kv_buffer.data_ptr()
    for x, y, s in zip(p0, p1, sizes):
        assert torch.equal(r0[x - b0:x - b0 + s], r1[y - b1:y - b1 + s])
    for r in ranks:
        r.close()


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


def _full_disk_child(mnt):
    """The full-filesystem test's body, in a child inside its own mount namespace, on the 1 MiB
    tmpfs mounted at mnt; prints what the parent checks as JSON."""
    pool = env.host_pool(tokens=4096)
    b = env.backend(pool, file_cfg(mnt, capacity_bytes=1 << 40))
    # 400 pages x 2 records of 4 KiB = 3.2 MiB into 1 MiB: the tier keeps below what fits.
    keys = env.page_hashes(list(range(400 * env.PAGE)))
    hi = pool.alloc(400 * env.PAGE)
    ok = []
    for i in range(0, 400, 100):
        ok += b.batch_set_v1(keys[i:i + 100], hi[i * env.PAGE:(i + 100) * env.PAGE])
    st = b.stats()
    out = {"newest_stored": all(ok[-100:]), "evictions": st["evictions"], "bytes": st["bytes"],
           "exists": b.batch_exists(keys[-50:]),
           "got": b.batch_get_v1(keys[-50:], hi[-50 * env.PAGE:]),
           "fs_bytes": os.statvfs(mnt).f_blocks * os.statvfs(mnt).f_frsize}
    b.close()
    print(json.dumps(out))


# Note [Private tmpfs for a full disk]: only a small filesystem fills (ENOSPC with the machine's
# disks untouched), and making one is a mount, which needs CAP_SYS_ADMIN in some mount namespace.
# A mount in the machine's namespace would need root and outlive a crashed test, so the body runs
# in a child in a private one: first as the caller (root, as CI runs), else in a new user
# namespace (an unprivileged user, where the kernel allows user namespaces). RLIMIT_FSIZE gives
# EFBIG per file, not a full filesystem, and a loop device also needs the mount. Where neither
# namespace can be made the test skips as [no-mount], which CI does not accept
# (tests/accepted_skips.txt): CI runs as root, so there it always runs.
UNSHARE_WAYS = (["unshare", "--mount", "--propagation", "private"],
                ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"])


def run_on_private_tmpfs(mnt, code, size="1m"):
    """Runs `python -c code` in a child with a private tmpfs of `size` at mnt; skips [no-mount]
    naming each way's error when no private mount namespace can be made."""
    errors = []
    for way in UNSHARE_WAYS:
        argv = [*way, "sh", "-c",
                f'mount -t tmpfs -o size={size},mode=0700 tmpfs "$1" || exit 77; exec "$2" -c "$3"',
                "sh", str(mnt), sys.executable, code]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if proc.returncode == 77 or "unshare failed" in proc.stderr:
            errors.append(f"{' '.join(way)}: {proc.stderr.strip()}")
            continue
        return proc
    pytest.skip("[no-mount] a private 1 MiB tmpfs needs a mount namespace of one's own (CAP_SYS_ADMIN, "
                "or unprivileged user namespaces): " + "; ".join(errors))


def test_a_full_filesystem_evicts_instead_of_failing(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    here = os.path.dirname(os.path.abspath(__file__))
    proc = run_on_private_tmpfs(mnt, f"import sys; sys.path.insert(0, {here!r}); "
                                f"import test_sglang_file as t; t._full_disk_child({str(mnt)!r})")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["fs_bytes"] == 1 << 20, out  # the body ran on the private tmpfs
    assert out["newest_stored"], "the newest pages must be stored (older ones evicted)"
    assert out["evictions"] > 0 and out["bytes"] <= 1 << 20, out
    assert out["exists"] == 50 and out["got"] == [True] * 50, out
    assert os.listdir(mnt) == []  # the mount went with the child's namespace


def test_capacity_is_capped_by_the_filesystem_without_a_mount(tmp_path):
    # What holds on any filesystem, no mount needed: a capacity beyond the disk is cut to what the
    # filesystem can hold (held + free), so a full disk is met by evicting, not by failing.
    pool = env.host_pool()
    b = env.backend(pool, file_cfg(tmp_path, capacity_bytes=1 << 60))
    keys = env.page_hashes(list(range(5 * env.PAGE)))
    assert b.batch_set_v1(keys, pool.alloc(5 * env.PAGE)) == [True] * 5
    st = b.stats()
    assert st["capacity_bytes"] <= st["bytes"] + shutil.disk_usage(tmp_path).free + (1 << 20), st
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
