import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import kvoffload


def make(shm_dir, rank=0, engine_id="py-region", **kw):
    args = dict(engine_id=engine_id, num_chunks=4, slot_bytes=3000, world_size=2, rank=rank,
                shm_dir=shm_dir, join_timeout=5.0)
    args.update(kw)
    return kvoffload.Region.create_or_join(**args)


def test_slot_align_is_validated_recorded_and_must_match(shm_dir):
    g = kvoffload.compute_geometry(num_chunks=2, slot_bytes=1000, world_size=4, slot_align=512)
    assert (g.slot_align, g.slot_stride, g.slot_offset(1, 3)) == (512, 1024, g.row_stride + 3 * 1024)
    with pytest.raises(kvoffload.Error) as e:
        kvoffload.compute_geometry(num_chunks=2, slot_bytes=1000, slot_align=100)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT and "slot_align 100 " in str(e.value)
    creator = make(shm_dir, rank=0, engine_id="py-align", slot_align=1024)
    assert creator.geometry.slot_align == 1024
    with pytest.raises(kvoffload.Error) as e:
        make(shm_dir, rank=1, engine_id="py-align")
    assert e.value.code == kvoffload.ErrorCode.MISMATCH
    assert "slot_align=1024" in str(e.value) and "slot_align=256" in str(e.value)
    creator.close()


def test_create_then_join_share_memory(shm_dir):
    creator = make(shm_dir, rank=0)
    joiner = make(shm_dir, rank=1)
    assert creator.role == "creator" and joiner.role == "joiner"
    assert creator.path == joiner.path and os.path.exists(creator.path)
    assert str(creator.path).startswith(shm_dir)
    g = creator.geometry
    assert (g.num_chunks, g.slot_bytes, g.world_size, g.copies) == (4, 3000, 2, 2)
    assert g.row_stride % g.page_size == 0 and g.data_bytes == 4 * g.row_stride
    assert g == joiner.geometry
    assert creator.rank == 0 and joiner.rank == 1 and creator.engine_id == "py-region"
    assert creator.populate_report.method in ("madvise", "fallback")

    # Rank 1 writes its own slot; rank 0 sees it through its mapping of rank 1's slot.
    np.asarray(joiner.slot(2))[:] = 0x5A
    seen = np.asarray(creator.slot(2, rank=1))
    assert seen.shape == (3000,) and seen.dtype == np.uint8 and (seen == 0x5A).all()
    assert not np.asarray(creator.slot(2)).any()
    # Slots are aligned (default 256 B): rank 1's slot starts at slot_stride = 3072, not 3000.
    assert (g.slot_align, g.slot_stride) == (256, 3072)
    assert creator.slot_address(2, rank=1) == creator.address + 2 * g.row_stride + 3072
    assert len(creator.row(3)) == g.row_stride
    assert creator.data().nbytes == g.data_bytes
    del seen
    path = creator.path
    assert joiner.close() and not joiner.is_open
    assert os.path.exists(path)
    assert creator.close()
    assert not os.path.exists(path)
    assert creator.close()  # idempotent


def test_slot_is_a_zero_copy_view(shm_dir):
    with make(shm_dir, world_size=1, slot_bytes=4096) as region:
        view = np.asarray(region.slot(1))
        view[:4] = [1, 2, 3, 4]
        addr = view.__array_interface__["data"][0]
        assert addr == region.slot_address(1)
        assert bytes(memoryview(region.slot(1))[:4]) == b"\x01\x02\x03\x04"
        # A typed view over the same bytes.
        as_f32 = np.frombuffer(region.slot(1), dtype=np.float32)
        assert as_f32.size == 1024
        del view, as_f32
        gc.collect()


def test_views_keep_the_region_mapped(shm_dir):
    region = make(shm_dir, world_size=1, slot_bytes=4096)
    path = region.path
    view = np.asarray(region.slot(0))
    assert region.live_views == 1
    # Closing while a view exists would leave it dangling: refused, naming the views.
    with pytest.raises(kvoffload.Error) as e:
        region.close()
    assert e.value.code == kvoffload.ErrorCode.STATE and "view" in str(e.value)
    # Dropping the Region object keeps the mapping alive for the view.
    del region
    gc.collect()
    view[:] = 7
    assert (view == 7).all() and os.path.exists(path)
    del view
    gc.collect()
    assert not os.path.exists(path)


def test_unranked_mapper_and_listing(shm_dir):
    with make(shm_dir, rank=0) as r0, make(shm_dir, rank=None) as sched:
        assert sched.rank is None and sched.role == "joiner"
        with pytest.raises(kvoffload.Error) as e:
            sched.slot(0)
        assert e.value.code == kvoffload.ErrorCode.STATE
        infos = kvoffload.list_regions(shm_dir)
        assert [i.engine_id for i in infos] == ["py-region"]
        assert infos[0].attached == 2 and not infos[0].stale and infos[0].problem == ""
        removed, kept = kvoffload.clean_regions(shm_dir)
        assert removed == [] and len(kept) == 1
        assert str(kvoffload.region_path(shm_dir, "py-region")) == str(r0.path)


def test_listing_and_cleaning_default_to_the_default_shm_dir(shm_dir, monkeypatch):
    # No argument: the directory every other entry point uses ($KVOFFLOAD_SHM_DIR, else /dev/shm).
    monkeypatch.setenv("KVOFFLOAD_SHM_DIR", shm_dir)
    assert str(kvoffload.default_shm_dir()) == shm_dir
    with make(shm_dir, rank=0, engine_id="py-default-dir") as r0:
        infos = kvoffload.list_regions()
        assert [i.engine_id for i in infos] == ["py-default-dir"]
        assert str(infos[0].path) == str(r0.path)
        assert kvoffload.clean_regions() == ([], [infos[0].path])
        assert kvoffload.list_regions(shm_dir=None)[0].engine_id == "py-default-dir"


def test_errors_carry_code_and_message(shm_dir):
    with pytest.raises(kvoffload.Error) as e:
        make(shm_dir, engine_id="bad/id")
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    assert e.value.code_name == "invalid_argument" and "bad/id" in str(e.value)
    assert isinstance(e.value, RuntimeError)

    with pytest.raises(kvoffload.Error) as e:
        make("/nonexistent/kvoffload-py")
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    assert "/nonexistent/kvoffload-py does not exist" in str(e.value)

    with make(shm_dir, rank=0):
        with pytest.raises(kvoffload.Error) as e:
            make(shm_dir, rank=1, slot_bytes=4096)
        assert e.value.code == kvoffload.ErrorCode.MISMATCH and "4096" in str(e.value)

    with make(shm_dir, rank=0, engine_id="other") as r:
        with pytest.raises(kvoffload.Error) as e:
            r.slot(4)
        assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(kvoffload.Error) as e:
        r.geometry
    assert e.value.code == kvoffload.ErrorCode.STATE


def test_join_from_another_process(shm_dir):
    # The scheduler's mapper in another interpreter sees what this rank wrote.
    with make(shm_dir, rank=0, world_size=1, slot_bytes=4096) as region:
        np.asarray(region.slot(3))[:] = 0xA7
        code = (
            "import numpy as np, kvoffload\n"
            f"r = kvoffload.Region.create_or_join(engine_id='py-region', num_chunks=4, slot_bytes=4096,"
            f" world_size=1, rank=None, shm_dir={shm_dir!r})\n"
            "assert r.role == 'joiner'\n"
            "assert (np.asarray(r.slot(3, rank=0)) == 0xA7).all()\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_one_holder_per_rank_and_one_scheduler(shm_dir):
    # Two create_or_join(engine_id=X, rank=0) would share rank 0's slots: the second is refused.
    with make(shm_dir, rank=0) as r0, make(shm_dir, rank=None):
        with pytest.raises(kvoffload.Error) as e:
            make(shm_dir, rank=0)
        assert e.value.code == kvoffload.ErrorCode.IN_USE and e.value.code_name == "in_use"
        message = str(e.value)
        assert "rank 0 of engine 'py-region'" in message and f"is held by PID {os.getpid()}." in message
        assert str(r0.path) in message and "its own engine id" in message
        with pytest.raises(kvoffload.Error) as e:
            make(shm_dir, rank=None)
        assert e.value.code == kvoffload.ErrorCode.IN_USE
        assert "the scheduler role of engine 'py-region'" in str(e.value)
        # The listing shows the holders and takes no role; the refused calls left nothing attached.
        (info,) = kvoffload.list_regions(shm_dir)
        assert info.owners == [(0, os.getpid()), (None, os.getpid())]
        assert info.attached == 2
    # Closed: the roles are free again (and the last one out removed the file).
    with make(shm_dir, rank=0) as again:
        assert again.role == "creator"


HOLD_RANK_0 = (
    "import sys, kvoffload\n"
    "r = kvoffload.Region.create_or_join(engine_id='py-region', num_chunks=4, slot_bytes=3000,"
    " world_size=2, rank=0, shm_dir=sys.argv[1])\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_another_process_on_a_held_rank_is_refused_until_the_holder_is_killed(shm_dir):
    with make(shm_dir, rank=1):  # keeps the region while rank 0's holders come and go
        holder = subprocess.Popen([sys.executable, "-c", HOLD_RANK_0, shm_dir], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(kvoffload.Error) as e:
                make(shm_dir, rank=0)
            assert e.value.code == kvoffload.ErrorCode.IN_USE
            assert f"is held by PID {holder.pid}." in str(e.value)
            (info,) = kvoffload.list_regions(shm_dir)
            assert (0, holder.pid) in info.owners
        finally:
            holder.kill()  # kill -9: the role dies with the process
            holder.wait(timeout=60)
        with make(shm_dir, rank=0, join_timeout=0.0) as restarted:
            assert restarted.role == "joiner" and restarted.rank == 0
