# kvoffload's file secondary tier inside vLLM's own tiering (TieringOffloadingSpec,
# TieringOffloadingManager, SecondaryTierFactory, SharedOffloadRegion from the vLLM tree the harness runs), in
# place of vLLM's fs tier with its keys: round trips, a restarted engine hitting the records it
# left, a corrupted record, one owner per directory, data-parallel replicas, and a full
# filesystem (a small tmpfs the test mounts in a private mount namespace).
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_real

vllm_real.require()

from vllm.v1.kv_offload.base import Locality, LookupResult, Medium  # noqa: E402

import kvoffload  # noqa: E402
from kvoffload.vllm import KvoffloadFileTier  # noqa: E402
import vllm_tiering  # noqa: E402
from vllm_tiering import Engine, key, tiering  # noqa: E402

engines = vllm_tiering.engines  # the fixture: pytest finds fixtures among module globals

HIT, MISS, RETRY, PENDING = (LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY,
                             LookupResult.HIT_PENDING)
TESTS = Path(__file__).resolve().parent


def file_tier(root, **more) -> dict:
    # vLLM's fs tier keys, with kvoffload's tier in place of "fs".
    return {"type": "file", "module_path": "kvoffload.vllm", "root_dir": str(root),
            "n_read_threads": 2, "n_write_threads": 2, **more}


def test_vllms_fs_keys_select_kvoffloads_file_tier(tmp_path, engines):
    fs = {"type": "fs", "root_dir": str(tmp_path), "n_read_threads": 3, "n_write_threads": 1}
    e = engines(tiering({**fs, "type": "file", "module_path": "kvoffload.vllm"}))
    assert isinstance(e.tier, KvoffloadFileTier) and e.tier.tier_type == "file"
    assert e.tier.medium is Medium.STORAGE
    # The records' directory is named after vLLM's run directory (FileMapper, as its fs tier).
    from vllm.v1.kv_offload.file_mapper import FileMapper

    mapper = FileMapper.from_offloading_spec(str(tmp_path), e.spec, 1, parallel_agnostic=True)
    assert e.tier.root == mapper.base_path + ".kvoffload"
    run = json.loads(Path(e.tier.root, "config.json").read_text())
    assert run["model_name"] == "test/model" and run["row_bytes"] == e.row_bytes


def test_round_trip_and_a_restarted_engine_hits_the_records_it_left(tmp_path, engines):
    a = engines(tiering(file_tier(tmp_path)))
    keys = [key(i, b"file") for i in range(10)]
    a.store(keys)
    assert a.tier.stats()["entries"] == len(keys)
    assert all(os.path.exists(a.tier.record_path(k)) for k in keys)
    a.evict_primary()
    # The index answers at once: no RETRY step (vLLM's fs tier asks the filesystem first).
    assert a.first_answers(keys) == [PENDING] * len(keys)
    assert a.lookup(keys) == [HIT] * len(keys)
    a.verify(keys)
    a.shutdown()
    # A new engine (another engine id, the same model and root_dir) finds them at start.
    b = engines(tiering(file_tier(tmp_path)))
    assert b.tier.stats()["entries"] == len(keys)
    assert b.lookup(keys + [key(99, b"file")]) == [HIT] * len(keys) + [MISS]
    b.verify(keys)
    stats = b.stats().data["data"]
    assert stats["vllm:kv_offload_tiering_read_bytes"][("1:file",)] == len(keys) * b.row_bytes
    assert stats["kvoffload:file_tier_records"][("file",)] == len(keys)


def test_a_corrupted_record_is_a_miss_and_is_dropped(tmp_path, engines):
    a = engines(tiering(file_tier(tmp_path)))
    keys = [key(i, b"bad") for i in range(4)]
    a.store(keys)
    path = a.tier.record_path(keys[1])
    a.shutdown()
    with open(path, "r+b") as f:
        f.seek(4096 + 100)
        byte = f.read(1)
        f.seek(4096 + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    b = engines(tiering(file_tier(tmp_path)))
    assert b.lookup(keys) == [HIT, MISS, HIT, HIT]
    b.verify([keys[0], keys[2], keys[3]])
    assert b.tier.stats()["corrupt"] == 1
    assert not os.path.exists(path)
    assert b.lookup([keys[1]]) == [MISS]
    stats = b.stats().data["data"]
    assert stats["kvoffload:file_tier_corrupt_records"][("file",)] == 1
    assert stats["vllm:kv_offload_tiering_promotion_job_failures"][("1:file",)] == 1


def test_one_engine_per_directory_and_data_parallel_replicas_get_their_own(tmp_path, engines):
    a = engines(tiering(file_tier(tmp_path)))
    with pytest.raises(kvoffload.Error, match="is in use by another file tier"):
        Engine(tiering(file_tier(tmp_path)))
    dp0 = engines(tiering(file_tier(tmp_path)), dp_index=0, dp_size=2)
    dp1 = engines(tiering(file_tier(tmp_path)), dp_index=1, dp_size=2)
    assert len({a.tier.root, dp0.tier.root, dp1.tier.root}) == 3
    assert dp1.tier.root.endswith(".kvoffload_dp1")
    dp0.store([key(1, b"dp")])
    assert dp1.lookup([key(1, b"dp")]) == [MISS]


def test_events_and_locality_as_vllms_fs_tier(tmp_path, engines):
    a = engines(tiering(file_tier(tmp_path, enable_kv_events=True, locality="LOCAL")), events=True)
    keys = [key(i, b"fev") for i in range(3)]
    a.store(keys)
    ev = [e for e in a.manager.take_events() if e.medium is Medium.STORAGE]
    assert len(ev) == 1 and list(ev[0].keys) == keys and ev[0].locality is Locality.LOCAL
    assert not ev[0].removed


def test_bad_configurations_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="'root_dir' is required"):
        Engine(tiering({"type": "file", "module_path": "kvoffload.vllm"}))
    with pytest.raises(ValueError, match="n_read_threads \\+ n_write_threads = 0 must be 1 to 256"):
        Engine(tiering(file_tier(tmp_path, n_read_threads=0, n_write_threads=0)))
    with pytest.raises(ValueError, match=r"unknown keys \['n_threads'\]"):
        Engine(tiering(file_tier(tmp_path, n_threads=4)))
    with pytest.raises(kvoffload.Error, match="fsync 'always' is not one of"):
        Engine(tiering(file_tier(tmp_path, fsync="always")))


# --- a full filesystem --------------------------------------------------------------------------

def _full_disk_child(mount: str) -> None:
    """Runs in a private mount namespace with a 1 MiB tmpfs at `mount` (see the test below);
    prints one JSON object."""
    sys.path.insert(0, str(TESTS))
    import vllm_real as vr

    vr.require()
    from vllm_tiering import Engine as E, key as k

    extra = tiering(file_tier(mount, capacity_bytes=1 << 40))
    out = {}
    a = E(extra)
    try:
        # 1) Records that fit (20 of ~20 KiB on a 1 MiB tmpfs).
        a.store([k(i, b"full") for i in range(20)])
        s = a.tier.stats()
        out["phase1"] = {"puts_ok": s["puts_ok"], "puts_failed": s["puts_failed"],
                         "evictions": s["evictions"]}
        # 2) Another writer takes every byte that is left.
        try:
            with open(os.path.join(mount, "filler"), "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError as err:
            out["filler_errno"] = err.errno
        # 3) Five times more records than the disk has room for: the capacity follows the free
        # space (none), the tier's oldest records make room, every store succeeds.
        for batch in range(10):
            a.store([k(100 + batch * 10 + i, b"full") for i in range(10)])
        latest = [k(195 + i, b"full") for i in range(5)]
        s = a.tier.stats()
        out["phase2"] = {"puts_ok": s["puts_ok"], "puts_failed": s["puts_failed"],
                         "evictions": s["evictions"], "bytes": s["bytes"]}
        a.evict_primary()
        out["latest_hits"] = [r.name for r in a.lookup(latest)]
        a.verify(latest)
        out["oldest"] = [r.name for r in a.lookup([k(0, b"full")])]
    finally:
        a.shutdown()
    # 3) A restarted engine on the full disk indexes what is there and hits it.
    b = E(extra)
    try:
        out["restart_entries"] = b.tier.stats()["entries"]
        out["restart_hits"] = [r.name for r in b.lookup(latest)]
        b.verify(latest)
    finally:
        b.shutdown()
    print(json.dumps(out))


def test_a_full_filesystem_evicts_the_oldest_records_and_stores_go_on(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
            f"import test_vllm_file_tier as t; t._full_disk_child({str(mount)!r})")
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=1m,mode=0700 tmpfs "$1" || exit 77; exec "$2" -c "$3"',
            "sh", str(mount), sys.executable, code]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if proc.returncode == 77 or "unshare failed" in proc.stderr:
        pytest.skip(f"a private tmpfs needs CAP_SYS_ADMIN (unshare + mount): {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    p1, p2 = out["phase1"], out["phase2"]
    assert p1 == {"puts_ok": 20, "puts_failed": 0, "evictions": 0}, out
    assert out["filler_errno"] == 28  # ENOSPC: the disk was full before the next stores
    assert p2["puts_ok"] == 120 and p2["puts_failed"] == 0 and p2["evictions"] >= 100, out
    assert p2["bytes"] < 1 << 20, out
    assert out["latest_hits"] == ["HIT"] * 5 and out["oldest"] == ["MISS"], out
    assert out["restart_entries"] > 0 and out["restart_hits"] == ["HIT"] * 5, out


def test_the_readme_configuration_is_what_these_tests_run(tmp_path):
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm_readme import readme_tier_config

    config = readme_tier_config("file")
    extra = json.loads(json.dumps(config["kv_connector_extra_config"]))
    assert extra["spec_name"] == "TieringOffloadingSpec"
    tier = extra["secondary_tiers"][0]
    assert SecondaryTierFactory.get_tier_class(tier) is KvoffloadFileTier
    tier["root_dir"] = str(tmp_path)
    extra["cpu_bytes_to_use"] = 32 * 4 * 4096
    e = Engine(extra)
    try:
        keys = [key(i, b"readme") for i in range(3)]
        e.store(keys)
        assert e.tier.stats()["entries"] == 3
    finally:
        e.shutdown()


def test_a_refused_job_comes_back_failed_once_and_block_ids_end_at_the_primary(tmp_path, engines):
    # A job naming a block one past the primary tier's rows is refused (nothing read from past
    # the buffer) and handed back to vLLM as failed exactly once, so vLLM frees its slots once;
    # the last row itself is a row like any other.
    import numpy as np
    from vllm.v1.kv_offload.tiering.base import TransferJob

    e = engines(tiering(file_tier(tmp_path)))
    t = e.tier
    rows = t._core.rows
    keys = [key(i, b"refuse") for i in range(2)]
    t.submit_store(TransferJob(job_id=901, keys=keys, block_ids=np.array([0, rows]),
                               is_promotion=False, req_context=None))
    assert t.has_pending_work()
    assert [(r.job_id, r.success) for r in t.get_finished_jobs()] == [(901, False)]
    assert list(t.get_finished_jobs()) == []
    assert not t.has_pending_work()
    assert t.stats()["entries"] == 0
    t.submit_store(TransferJob(job_id=902, keys=keys, block_ids=np.array([0, rows - 1]),
                               is_promotion=False, req_context=None))
    t.drain_jobs()
    assert [(r.job_id, r.success) for r in t.get_finished_jobs()] == [(902, True)]
    assert t.stats()["entries"] == 2


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_a_tier_warns_when_its_chunks_cannot_be_found_by_another_process(tmp_path, engines,
                                                                          monkeypatch, caplog, algo):
    # Whether another process computes the same keys depends on the vLLM commit (the tree under
    # test): 017e9f4448 draws NONE_HASH from os.urandom unless PYTHONHASHSEED is set, whatever the
    # hash; 7cfb97e3 seeds the cryptographic ones from a fixed default (DEFAULT_NONE_HASH_SEED).
    from vllm.v1.core import kv_cache_utils

    from kvoffload import vllm_tiers

    monkeypatch.setattr(vllm_tiers, "_prefix_caching_hash_algo", lambda: algo)
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    engines(tiering(file_tier(tmp_path / "a")))
    assert "found only by this process" not in caplog.text
    monkeypatch.delenv("PYTHONHASHSEED")
    engines(tiering(file_tier(tmp_path / "b")))
    if not hasattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED"):  # 017e9f4448
        assert ("kvoffload file tier: chunks this engine stores can be found only by this process: "
                "this vLLM seeds the block-hash chain (NONE_HASH) with os.urandom") in caplog.text
        assert f"whatever the hash function ({algo} here)" in caplog.text
    elif algo == "sha256":  # 7cfb97e3: a fixed default seed
        assert "found only by this process" not in caplog.text
    else:
        assert ("kvoffload file tier: chunks this engine stores can be found only by this process: "
                "vLLM seeds the block-hash chain of the non-cryptographic xxhash with random bytes"
                ) in caplog.text
    if "found only by this process" in caplog.text:
        assert "set PYTHONHASHSEED to one value in the environment of every process" in caplog.text
