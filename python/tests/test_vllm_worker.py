# (Over ~500 lines: every case shares the layout model below; split, each file would carry it.)
# kvoffload.vllm.KvoffloadSpec / KvoffloadWorker with vLLM's real types (OffloadingConfig,
# CanonicalKVCaches, GPULoadStoreSpec, CPULoadStoreSpec from the vLLM tree the harness runs):
# every byte that crosses is checked against a model of vLLM's CPU layout (one section per unique
# KV tensor, blocks_per_chunk padded pages each, each group copying its layers' unpadded pages),
# in the region and back on the device. The device is host memory (numpy) on the host backend and
# the simulated GPU's memory, which the host cannot dereference, on `sim`.
import dataclasses
import os
import uuid

import numpy as np
import pytest

import vllm_real
from vllm_readme import readme_transfer_config

vllm_real.require()

import torch  # noqa: E402  (the vLLM harness's stand-in)
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    OffloadingSpec,
    OffloadingWorker,
    ReqContext,
    TransferResult,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

import kvoffload  # noqa: E402
import kvoffload.vllm as kv_vllm  # noqa: E402
from kvoffload.vllm import KvoffloadManager, KvoffloadSpec, KvoffloadWorker  # noqa: E402

CTX = ReqContext(req_id="w")
NUM_GPU_BLOCKS = 16


def backends():
    names = {b.name for b in kvoffload.list_backends() if b.built}
    assert "sim" in names, "the sim backend is always built"
    return ["host", "sim"]


class Device:
    """KV-cache memory on one backend: numpy arrays on `host`, simulated GPU memory on `sim`."""

    def __init__(self, backend, index=0):
        self.backend = backend
        self.runtime = kvoffload.make_runtime("sim", device=index) if backend == "sim" else None
        self.index = index

    def tensor(self, image: np.ndarray, page: int):
        """An int8 (num_blocks, page) tensor over a (num_blocks, stride) image, stride >= page, as
        vLLM's canonical tensors are (as_strided over the layer's storage)."""
        if self.runtime is None:
            array = image.view(np.int8)
            return torch.from_numpy(array[:, :page]), array
        whole = vllm_real.sim_tensor(self.runtime, image.shape, torch.int8, self.index)
        self.runtime.memcpy_sync(whole.data_ptr(), image.ctypes.data, image.nbytes)
        view = vllm_real.device_tensor(whole.data_ptr(), (image.shape[0], page),
                                       (image.shape[1], 1), torch.int8, whole.device, owner=whole)
        return view, whole

    def read(self, owner, shape) -> np.ndarray:
        if self.runtime is None:
            return owner.view(np.uint8).copy()
        out = np.empty(shape, dtype=np.uint8)
        self.runtime.memcpy_sync(out.ctypes.data, owner.data_ptr(), out.nbytes)
        return out


class KvCaches:
    """vLLM CanonicalKVCaches over `tensors` = [(padded page, block stride)] and `groups` =
    [[(tensor index, unpadded page)]], with a byte model of the device and of the region."""

    def __init__(self, device, tensors, groups, bpc, seed):
        rng = np.random.default_rng(seed)
        self.device, self.tensors, self.groups, self.bpc = device, tensors, groups, bpc
        self.images = [rng.integers(0, 256, size=(NUM_GPU_BLOCKS, stride), dtype=np.uint8)
                       for _, stride in tensors]
        built = [device.tensor(img, page) for img, (page, _) in zip(self.images, tensors)]
        self.owners = [owner for _, owner in built]
        canonical = [CanonicalKVCacheTensor(tensor=t, page_size_bytes=page)
                     for (t, _), (page, _) in zip(built, tensors)]
        refs = [[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=p) for i, p in g] for g in groups]
        self.caches = CanonicalKVCaches(tensors=canonical, group_data_refs=refs)
        self.sections = list(np.cumsum([0] + [page * bpc for page, _ in tensors])[:-1])
        self.slot_bytes = sum(page for page, _ in tensors) * bpc
        self.region = {}  # chunk -> expected slot bytes (unknown chunks: zeros)

    def worker_kv_bytes_per_block(self):
        return sum(page for page, _ in self.tensors)

    def _places(self, gpu, cpu):
        """(chunk, slot offset, tensor, block, bytes) of every page a job copies (vLLM's CPU
        worker: group after group, each from position block_indices[g] % bpc of its chunks)."""
        gpu_ids, cpu_ids = gpu.block_ids.tolist(), cpu.block_ids.tolist()
        b = c = 0
        for g, (size, first) in enumerate(zip(gpu.group_sizes, gpu.block_indices)):
            if size == 0:
                continue
            skip = first % self.bpc
            for i in range(size):
                pos = skip + i
                chunk = cpu_ids[c + pos // self.bpc]
                for t, page in self.groups[g]:
                    off = self.sections[t] + (pos % self.bpc) * self.tensors[t][0]
                    yield chunk, off, t, gpu_ids[b + i], page
            b += size
            c += -(-(skip + size) // self.bpc)

    def model_store(self, gpu, cpu):
        for chunk, off, t, block, page in self._places(gpu, cpu):
            slot = self.region.setdefault(chunk, np.zeros(self.slot_bytes, np.uint8))
            slot[off:off + page] = self.images[t][block, :page]

    def model_load(self, cpu, gpu):
        for chunk, off, t, block, page in self._places(gpu, cpu):
            self.images[t][block, :page] = self.region[chunk][off:off + page]

    def check_device(self):
        for t, (img, owner) in enumerate(zip(self.images, self.owners)):
            got = self.device.read(owner, img.shape)
            assert (got == img).all(), f"tensor {t} differs from the model"

    def check_region(self, region, rank=None, num_chunks=8):
        for chunk in range(num_chunks):
            got = np.asarray(region.slot(chunk, rank=rank))[: self.slot_bytes]
            want = self.region.get(chunk, np.zeros(self.slot_bytes, np.uint8))
            assert (got == want).all(), f"chunk {chunk} differs from the model"


def offloading_config(shm_dir, kv, backend="host", chunks=8, world_size=1, rank=0, engine_id=None,
                      replicated=False, dp_index=0, dp_size=1, **extra):
    slot = kv.worker_kv_bytes_per_block() * kv.bpc
    row = kvoffload.compute_geometry(num_chunks=1, slot_bytes=slot, world_size=world_size,
                                     replicated=replicated).row_stride
    extra_config = {
        "spec_name": "KvoffloadSpec",
        "spec_module_path": "kvoffload.vllm",
        "cpu_bytes_to_use": chunks * row,
        "eviction_policy": "arc",
        "blocks_per_chunk": kv.bpc,
        "kvoffload_backend": backend,
        "kvoffload_shm_dir": shm_dir,
    }
    extra_config.update(extra)
    return OffloadingConfig(
        groups=tuple(OffloadingGroupConfig(tokens_per_block=16, layer_names=(f"g{g}",))
                     for g in range(len(kv.groups))),
        worker_kv_bytes_per_block=kv.worker_kv_bytes_per_block(),
        enable_kv_cache_events=True,
        extra_config=extra_config,
        engine_id=engine_id or "vllm-" + uuid.uuid4().hex[:12],
        model=OffloadingModelConfig(name="test-model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=kv.bpc),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=world_size, tp_size=world_size, pp_size=1, pcp_size=1,
            dcp_size=1, data_parallel_index=dp_index, data_parallel_size=dp_size,
            data_parallel_rank_local=None, is_parallelism_agnostic=False),
        replicated_layout=replicated,
    )


# Two tensors with padded pages (the copies take less), the second one strided.
ONE_GROUP = dict(tensors=[(192, 192), (64, 96)], groups=[[(0, 160), (1, 64)]])
# A hybrid model: tensor 0 is shared by a layer of each group (vLLM's hybrid allocator), tensor 1
# belongs to group 0 only; the groups' pages differ.
TWO_GROUPS = dict(tensors=[(128, 128), (64, 64)], groups=[[(0, 96), (1, 64)], [(0, 112)]])


def round_trip(worker, kv, store_jobs, load_jobs, region_rank=None, num_chunks=8):
    job = 100
    for gpu, cpu in store_jobs:
        job += 1
        assert worker.submit_store(job, gpu, cpu)
        kv.model_store(gpu, cpu)
        worker.wait({job})
        (res,) = worker.get_finished()
        assert isinstance(res, TransferResult) and (res.job_id, res.success) == (job, True)
        assert res.transfer_size == sum(p for *_, p in kv._places(gpu, cpu))
    kv.check_region(worker._worker, rank=region_rank, num_chunks=num_chunks)
    for cpu, gpu in load_jobs:
        job += 1
        assert worker.submit_load(job, cpu, gpu)
        kv.model_load(cpu, gpu)
        results = []
        while not results:
            results = worker.get_finished()
        assert [(r.job_id, r.success) for r in results] == [(job, True)]
    kv.check_device()


@pytest.mark.parametrize("backend", backends())
def test_spec_from_vllm_factory_stores_and_loads_every_byte(shm_dir, backend):
    kv = KvCaches(Device(backend), bpc=2, seed=1, **ONE_GROUP)
    spec = OffloadingSpecFactory.create_spec(offloading_config(shm_dir, kv, backend))
    assert isinstance(spec, KvoffloadSpec) and isinstance(spec, OffloadingSpec)
    assert spec.num_blocks == 8
    manager = spec.get_manager()
    assert isinstance(manager, KvoffloadManager) and spec.get_manager() is manager
    worker = spec.get_worker(kv.caches)
    assert isinstance(worker, KvoffloadWorker) and isinstance(worker, OffloadingWorker)
    assert spec.get_worker(kv.caches) is worker

    keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(3)]
    out = manager.prepare_store(keys, CTX)
    assert out.store_spec.block_ids.tolist() == [0, 1, 2]
    # The request's blocks 0..5 in GPU blocks 4..9 (two per chunk), then loaded back from the
    # request's block 2 on (position 0 of chunk 1) into GPU blocks 12..15.
    round_trip(worker, kv,
               [(GPULoadStoreSpec([4, 5, 6, 7, 8, 9], group_sizes=[6], block_indices=[0]),
                 out.store_spec)],
               [(CPULoadStoreSpec([1, 2]),
                 GPULoadStoreSpec([12, 13, 14, 15], group_sizes=[4], block_indices=[2]))])
    manager.complete_store(out.keys_to_store, CTX)
    worker.shutdown()
    worker.shutdown()  # idempotent


@pytest.mark.parametrize("backend", backends())
def test_mid_chunk_start_uses_block_indices(shm_dir, backend):
    kv = KvCaches(Device(backend), bpc=3, seed=2, **ONE_GROUP)
    worker = KvoffloadSpec(offloading_config(shm_dir, kv, backend)).get_worker(kv.caches)
    # The request's blocks 4..7 (block index 4 = position 1 of its chunk) into chunks 5, 6.
    round_trip(worker, kv,
               [(GPULoadStoreSpec([2, 3, 11, 0], group_sizes=[4], block_indices=[4]),
                 CPULoadStoreSpec([5, 6]))],
               [(CPULoadStoreSpec([5, 6]),
                 GPULoadStoreSpec([9, 10, 1, 13], group_sizes=[4], block_indices=[4]))])
    worker.shutdown()


@pytest.mark.parametrize("backend", backends())
def test_two_kv_cache_groups_share_tensor_sections(shm_dir, backend):
    kv = KvCaches(Device(backend), bpc=2, seed=3, **TWO_GROUPS)
    spec = KvoffloadSpec(offloading_config(shm_dir, kv, backend))
    worker = spec.get_worker(kv.caches)
    # vLLM's slot: one section per unique tensor (not per group): 2 x (128 + 64) bytes.
    assert spec.slot_bytes == kv.slot_bytes == 2 * (128 + 64)
    # Group 0: 3 blocks from the request's block 1 (chunks 3, 1); group 1: 2 blocks from block 0
    # (chunk 2). Then group 1 alone, then both back into other blocks.
    store = GPULoadStoreSpec([5, 6, 7, 9, 10], group_sizes=[3, 2], block_indices=[1, 0])
    store1 = GPULoadStoreSpec([11], group_sizes=[0, 1], block_indices=[0, 4])
    load = GPULoadStoreSpec([12, 13, 14, 15, 0], group_sizes=[3, 2], block_indices=[1, 0])
    round_trip(worker, kv,
               [(store, CPULoadStoreSpec([3, 1, 2])), (store1, CPULoadStoreSpec([4]))],
               [(CPULoadStoreSpec([3, 1, 2]), load),
                (CPULoadStoreSpec([4]), GPULoadStoreSpec([1], group_sizes=[0, 1], block_indices=[0, 4]))])
    worker.shutdown()


@pytest.mark.parametrize("backend", backends())
def test_mla_replicated_layout_one_copy_for_all_ranks(shm_dir, backend):
    # One latent tensor (MLA), pages large enough that one copy per row is half of two.
    kv0 = KvCaches(Device(backend), bpc=2, seed=4, tensors=[(4096, 4096)], groups=[[(0, 4096)]])
    kv1 = KvCaches(Device(backend), bpc=2, seed=5, tensors=[(4096, 4096)], groups=[[(0, 4096)]])
    engine_id = "mla-" + uuid.uuid4().hex[:8]
    configs = [offloading_config(shm_dir, kv0, backend, world_size=2, rank=r, engine_id=engine_id,
                                 replicated=True) for r in (0, 1)]
    spec0, spec1 = (KvoffloadSpec(c) for c in configs)
    assert spec0.replicated_layout and spec1.replicated_layout
    # One copy per chunk: the same bytes hold as many chunks as one rank's layout would.
    assert spec0.num_blocks == 8
    split = KvoffloadSpec(offloading_config(shm_dir, kv0, backend, world_size=2, rank=0,
                                            cpu_bytes_to_use=spec0.extra_config["cpu_bytes_to_use"]))
    assert split.num_blocks == 4
    w0, w1 = spec0.get_worker(kv0.caches), spec1.get_worker(kv1.caches)
    assert w0._worker.region_path == w1._worker.region_path
    # Rank 0 writes (vLLM's connector skips the store on the other ranks); rank 1 reads it.
    gpu = GPULoadStoreSpec([3, 4, 5], group_sizes=[3], block_indices=[0])
    assert w0.submit_store(1, gpu, CPULoadStoreSpec([6, 7]))
    kv0.model_store(gpu, CPULoadStoreSpec([6, 7]))
    w0.wait({1})
    assert [r.success for r in w0.get_finished()] == [True]
    kv1.region = kv0.region
    dst = GPULoadStoreSpec([10, 11, 12], group_sizes=[3], block_indices=[0])
    assert w1.submit_load(2, CPULoadStoreSpec([6, 7]), dst)
    kv1.model_load(CPULoadStoreSpec([6, 7]), dst)
    w1.wait({2})
    assert [r.success for r in w1.get_finished()] == [True]
    kv1.check_device()
    assert (kv1.images[0][10:13] == kv0.images[0][3:6]).all()
    w1.shutdown()
    w0.shutdown()


@pytest.mark.parametrize("backend", backends())
def test_two_data_parallel_replicas_never_see_each_others_bytes(shm_dir, backend):
    # docs/VLLM.md's JSON, as vLLM parses it: no region name in it, so each replica's region is
    # named by vLLM's per-replica engine_id (<engine_id>_dp<rank>, set by vLLM's engine core).
    transfer = KVTransferConfig(**readme_transfer_config())
    assert "kvoffload_engine_id" not in transfer.kv_connector_extra_config
    kvs = [KvCaches(Device(backend), bpc=2, seed=10 + r, **ONE_GROUP) for r in (0, 1)]
    workers = []
    for dp, kv in enumerate(kvs):
        cfg = offloading_config(shm_dir, kv, backend, engine_id=f"{transfer.engine_id}_dp{dp}",
                                dp_index=dp, dp_size=2)
        # docs/VLLM.md's keys as written, with this test's backend, directory and a small size.
        extra = dict(transfer.kv_connector_extra_config)
        extra.update({k: cfg.extra_config[k] for k in
                      ("kvoffload_backend", "kvoffload_shm_dir", "blocks_per_chunk", "cpu_bytes_to_use")})
        cfg = dataclasses.replace(cfg, extra_config=extra)
        spec = OffloadingSpecFactory.create_spec(cfg)
        assert spec.engine_id() == f"{transfer.engine_id}_dp{dp}"
        workers.append(spec.get_worker(kv.caches))
    assert workers[0]._worker.region_path != workers[1]._worker.region_path
    # Both replicas store their own KV into the same chunk ids and load it back.
    for w, kv in zip(workers, kvs):
        gpu = GPULoadStoreSpec([0, 1, 2, 3], group_sizes=[4], block_indices=[0])
        assert w.submit_store(1, gpu, CPULoadStoreSpec([0, 1]))
        kv.model_store(gpu, CPULoadStoreSpec([0, 1]))
        w.wait({1})
        assert [r.success for r in w.get_finished()] == [True]
    for w, kv in zip(workers, kvs):
        kv.check_region(w._worker)
        dst = GPULoadStoreSpec([8, 9, 10, 11], group_sizes=[4], block_indices=[0])
        assert w.submit_load(2, CPULoadStoreSpec([0, 1]), dst)
        kv.model_load(CPULoadStoreSpec([0, 1]), dst)
        w.wait({2})
        assert [r.success for r in w.get_finished()] == [True]
        kv.check_device()
    assert not (kvs[0].images[0][8:12] == kvs[1].images[0][8:12]).all()
    for w in workers:
        w.shutdown()


def test_explicit_region_name_gets_the_data_parallel_suffix(shm_dir):
    kv = KvCaches(Device("host"), bpc=1, seed=6, **ONE_GROUP)
    names = [KvoffloadSpec(offloading_config(shm_dir, kv, dp_index=dp, dp_size=2,
                                             kvoffload_engine_id="pool")).engine_id() for dp in (0, 1)]
    assert names == ["pool_dp0", "pool_dp1"]
    assert KvoffloadSpec(offloading_config(shm_dir, kv, kvoffload_engine_id="pool")).engine_id() == "pool"
    with pytest.raises(ValueError, match=r"region name 'a/b' \(vLLM's engine_id\)"):
        KvoffloadSpec(offloading_config(shm_dir, kv, engine_id="a/b")).engine_id()


@pytest.mark.parametrize("timing", [None, False, True])
def test_transfer_time_only_when_kvoffload_job_timing_asks(shm_dir, timing):
    # Issue 25 (8): timing events only when statistics ask for them. vLLM's connector records
    # transfer stats (sizes and times) for every job whose transfer_time is set, as it does for
    # CPUOffloadingSpec, so by default each job is timed; kvoffload_job_timing: false records no
    # timing event and reports transfer_time None (vLLM then records no transfer stats for it).
    kv = KvCaches(Device("sim"), bpc=1, seed=7, **ONE_GROUP)
    extra = {} if timing is None else {"kvoffload_job_timing": timing}
    worker = KvoffloadSpec(offloading_config(shm_dir, kv, "sim", **extra)).get_worker(kv.caches)
    gpu = GPULoadStoreSpec([0], group_sizes=[1], block_indices=[0])
    assert worker.submit_store(1, gpu, CPULoadStoreSpec([0]))
    worker.wait({1})
    (r,) = worker.get_finished()
    assert r.success and r.transfer_size > 0
    if timing is None or timing:
        assert isinstance(r.transfer_time, float) and r.transfer_time > 0.0
    else:
        assert r.transfer_time is None
    worker.shutdown()


def test_wait_ignores_ids_never_submitted_or_already_collected(shm_dir):
    kv = KvCaches(Device("host"), bpc=1, seed=7, **ONE_GROUP)
    worker = KvoffloadSpec(offloading_config(shm_dir, kv)).get_worker(kv.caches)
    gpu = GPULoadStoreSpec([0], group_sizes=[1], block_indices=[0])
    worker.wait({41, 42})  # never submitted: vLLM's worker ignores them, so does this one
    assert worker.submit_store(1, gpu, CPULoadStoreSpec([0]))
    assert worker.submit_store(2, gpu, CPULoadStoreSpec([1]))
    worker.wait({1, 99})
    worker.wait({2})
    assert sorted(r.job_id for r in worker.get_finished()) == [1, 2]
    worker.wait({1, 2})  # both collected already
    assert worker.get_finished() == []
    worker.shutdown()


def test_results_come_in_vllms_order_stores_then_loads_each_as_submitted(shm_dir):
    # vLLM's CPU worker: stores, then loads, each direction in submission order; wait() only
    # blocks (the waited results come out of the next get_finished in that same order), and a
    # waited job's direction finishes in order, so the jobs before it are done too. The
    # scheduler completes stores in this order, which sets the LRU order of later evictions.
    kv = KvCaches(Device("host"), bpc=1, seed=8, **ONE_GROUP)
    worker = KvoffloadSpec(offloading_config(shm_dir, kv)).get_worker(kv.caches)
    gpu = GPULoadStoreSpec([0], group_sizes=[1], block_indices=[0])
    assert worker.submit_load(7, CPULoadStoreSpec([3]), gpu)
    for job, chunk in ((5, 0), (3, 1), (4, 2)):
        assert worker.submit_store(job, gpu, CPULoadStoreSpec([chunk]))
    worker.wait({7, 4})  # a preemption flush: the last store, and the load
    assert [r.job_id for r in worker.get_finished()] == [5, 3, 4, 7]
    assert worker.submit_store(1, gpu, CPULoadStoreSpec([4]))
    assert worker.submit_store(2, gpu, CPULoadStoreSpec([5]))
    worker.wait({2})  # waits job 1 too: both are reported, 1 first
    assert [r.job_id for r in worker.get_finished()] == [1, 2]
    assert worker.submit_store(6, gpu, CPULoadStoreSpec([6]))
    assert worker.submit_store(8, gpu, CPULoadStoreSpec([7]))
    worker.wait({6})  # only the first: job 8 may or may not be done, never ahead of 6
    results = []
    while len(results) < 2:
        results += [r.job_id for r in worker.get_finished()]
    assert results == [6, 8]
    worker.shutdown()


def test_device_defaults_to_the_tensors_device(shm_dir, monkeypatch):
    calls = []
    real = kv_vllm.worker._ext.OffloadWorker

    def spy(**kw):
        calls.append((kw["backend"], kw["devices"]))
        return real(**{**kw, "devices": [0]})  # one simulated device here

    kv = KvCaches(Device("sim"), bpc=1, seed=8, **ONE_GROUP)
    for t in kv.caches.tensors:
        t.tensor.device = torch.device("cuda", 3)  # as the tensors of rank 3 would be
    monkeypatch.setattr(kv_vllm.worker._ext, "OffloadWorker", spy)
    worker = KvoffloadSpec(offloading_config(shm_dir, kv, "sim")).get_worker(kv.caches)
    assert calls == [("sim", [3])]
    worker.shutdown()
    calls.clear()
    worker = KvoffloadSpec(offloading_config(shm_dir, kv, "sim", kvoffload_device=3)).get_worker(kv.caches)
    assert calls == [("sim", [3])]
    worker.shutdown()


def test_a_device_other_than_the_tensors_is_refused(shm_dir, monkeypatch):
    # Issue 25 (7): a runtime on another GPU would hand its kernel and DMA engine addresses of
    # the tensors' GPU.
    made = []
    monkeypatch.setattr(kv_vllm.worker._ext, "make_runtime", lambda *a, **k: made.append(a))
    monkeypatch.setattr(kv_vllm.worker._ext, "OffloadWorker", lambda **k: made.append(k))
    kv = KvCaches(Device("sim"), bpc=1, seed=8, **ONE_GROUP)
    for t in kv.caches.tensors:
        t.tensor.device = torch.device("cuda", 3)
    with pytest.raises(ValueError, match=r"kvoffload_device=1, but the KV-cache tensors are on "
                       r"cuda:3; leave kvoffload_device unset .* or set it to 3"):
        KvoffloadSpec(offloading_config(shm_dir, kv, "sim", kvoffload_device=1)).get_worker(kv.caches)
    assert made == [], "refused before any runtime was made"


@pytest.mark.parametrize("torch_hip", [None, "6.4.1"])
def test_auto_opens_only_the_module_matching_torchs_build(shm_dir, monkeypatch, torch_hip):
    # Issue 25 (7): never every module (two vendors' runtimes in one process), never a simulated
    # device in the engine's process: list_backends would do both.
    monkeypatch.setattr(torch.version, "hip", torch_hip)
    expected = "hip" if torch_hip else "cuda"

    def no_list():
        raise AssertionError("list_backends opens every module and the simulated device")

    probed = []
    real_probe = kv_vllm.worker._ext.probe_backend

    def probe(name):
        probed.append(name)
        return real_probe(name)

    monkeypatch.setattr(kv_vllm.worker._ext, "list_backends", no_list)
    monkeypatch.setattr(kv_vllm.worker._ext, "probe_backend", probe)
    if (b := real_probe(expected)).built and b.device_count > 0:
        pytest.skip(f"[gpu-present] a usable {expected} backend: auto would take it")
    kv = KvCaches(Device("sim"), bpc=1, seed=8, **ONE_GROUP)  # cuda:0 tensors
    with pytest.raises(ValueError, match=rf"on cuda:0 \(torch built for {expected.upper()}\), but "
                       rf"this kvoffload has no usable {expected} backend"):
        KvoffloadSpec(offloading_config(shm_dir, kv, "auto")).get_worker(kv.caches)
    assert probed == [expected]
    other = "cuda" if torch_hip else "hip"
    with pytest.raises(ValueError, match=rf"kvoffload_backend='{other}', but torch is built for "
                       rf"{expected.upper()}"):
        KvoffloadSpec(offloading_config(shm_dir, kv, other)).get_worker(kv.caches)
    assert probed == [expected]


def test_backend_must_reach_the_tensors_memory(shm_dir):
    cuda_kv = KvCaches(Device("sim"), bpc=1, seed=9, **ONE_GROUP)  # device cuda:0
    host_kv = KvCaches(Device("host"), bpc=1, seed=9, **ONE_GROUP)
    gpu_built = [b for b in kvoffload.list_backends() if b.name in ("cuda", "hip") and b.built and b.device_count]
    if not gpu_built:
        # auto would fall back to host and memcpy from device pointers: refused, saying why.
        with pytest.raises(ValueError, match=r"tensors are on cuda:0 \(torch built for CUDA\), but this kvoffload has no usable cuda backend"):
            KvoffloadSpec(offloading_config(shm_dir, cuda_kv, "auto")).get_worker(cuda_kv.caches)
    with pytest.raises(ValueError, match=r"kvoffload_backend='host' copies with memcpy, but the KV-cache tensors are on cuda:0"):
        KvoffloadSpec(offloading_config(shm_dir, cuda_kv, "host")).get_worker(cuda_kv.caches)
    with pytest.raises(ValueError, match=r"kvoffload_backend='sim' needs KV-cache tensors on a GPU"):
        KvoffloadSpec(offloading_config(shm_dir, host_kv, "sim")).get_worker(host_kv.caches)
    with pytest.raises(ValueError, match=r"kvoffload_backend='tpu' is not one of"):
        KvoffloadSpec(offloading_config(shm_dir, host_kv, "tpu")).get_worker(host_kv.caches)
    # auto with host tensors is the host backend (tests; vLLM's tensors are always on a GPU).
    worker = KvoffloadSpec(offloading_config(shm_dir, host_kv, "auto")).get_worker(host_kv.caches)
    assert worker._backend == "host"
    worker.shutdown()


def test_refused_and_failed_jobs(shm_dir):
    kv = KvCaches(Device("host"), bpc=2, seed=11, **ONE_GROUP)
    worker = KvoffloadSpec(offloading_config(shm_dir, kv)).get_worker(kv.caches)
    gpu = GPULoadStoreSpec([0, 1], group_sizes=[2], block_indices=[0])
    assert worker.submit_store(3, gpu, CPULoadStoreSpec([99])) is False  # no such chunk
    assert worker.submit_store(3, gpu, CPULoadStoreSpec([0, 1])) is False  # 2 blocks fill 1 chunk
    assert worker.get_finished() == []
    real = worker._engine

    class FailingEngine:
        # The engine's own failure reporting is tested in C++; here: a failed result stays failed.
        def submit(self, job_id, *args, **kwargs):
            pass

        def poll(self):
            return [type("R", (), dict(job_id=5, success=False, bytes=0, seconds=0.0,
                                       direction="load", error="injected"))]

        def wait(self, ids):
            return [type("R", (), dict(job_id=i, success=False, bytes=0, seconds=0.0,
                                       direction="store", error="injected")) for i in ids]

        def shutdown(self):
            real.shutdown()

    worker._engine = FailingEngine()
    assert worker.submit_store(6, gpu, CPULoadStoreSpec([0]))
    assert worker.submit_load(5, CPULoadStoreSpec([0]), gpu)
    worker.wait({6})
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(6, False), (5, False)]
    worker.shutdown()


def test_rank_selects_the_slot_of_a_two_rank_region(shm_dir):
    kv = KvCaches(Device("host"), bpc=2, seed=12, **ONE_GROUP)
    spec = KvoffloadSpec(offloading_config(shm_dir, kv, world_size=2, rank=1))
    worker = spec.get_worker(kv.caches)
    gpu = GPULoadStoreSpec([0, 1], group_sizes=[2], block_indices=[0])
    assert worker.submit_store(1, gpu, CPULoadStoreSpec([3]))
    kv.model_store(gpu, CPULoadStoreSpec([3]))
    worker.wait({1})
    assert [r.success for r in worker.get_finished()] == [True]
    kv.check_region(worker._worker, rank=1)
    assert not np.asarray(worker._worker.slot(3, rank=0)).any()
    worker.shutdown()


def test_spec_configuration(shm_dir):
    kv = KvCaches(Device("host"), bpc=1, seed=13, **ONE_GROUP)
    with pytest.raises(ValueError, match="cpu_bytes_to_use must be specified"):
        KvoffloadSpec(offloading_config(shm_dir, kv, cpu_bytes_to_use=0))
    cfg = offloading_config(shm_dir, kv)
    with pytest.raises(ValueError, match="canonical_layout=true is not supported"):
        KvoffloadSpec(dataclasses.replace(cfg, canonical_layout=True))
    with pytest.raises(ValueError, match="eviction_policy='lfu'"):
        KvoffloadSpec(offloading_config(shm_dir, kv, eviction_policy="lfu"))
    # A cache smaller than one chunk: 0 blocks, as vLLM sizes it; nothing is stored, no region.
    spec = KvoffloadSpec(offloading_config(shm_dir, kv, cpu_bytes_to_use=100))
    assert spec.num_blocks == 0
    manager = spec.get_manager()
    assert manager.prepare_store([make_offload_key(b"k" * 32, 0)], CTX) is None
    worker = spec.get_worker(kv.caches)
    assert worker._worker is None
    assert worker.submit_store(1, GPULoadStoreSpec([0], group_sizes=[1], block_indices=[0]),
                               CPULoadStoreSpec([0])) is False
    assert worker.get_finished() == []
    worker.wait({1})
    worker.shutdown()
    # The tensors must fit the slot vLLM's worker_kv_bytes_per_block sizes.
    small = dataclasses.replace(cfg, worker_kv_bytes_per_block=100)
    with pytest.raises(ValueError, match="need 256 bytes per chunk"):
        KvoffloadSpec(small).get_worker(kv.caches)


def test_two_engines_given_one_region_name_are_refused(shm_dir):
    # Two engines (each with its own rank 0 worker, e.g. two vLLM servers started from one config)
    # given one kvoffload_engine_id: sharing the region would let each serve the other's KV. The
    # second one's worker is refused naming the first one's PID; with distinct names both run.
    kv = KvCaches(Device("host"), bpc=1, seed=7, **ONE_GROUP)
    name = "pool-" + uuid.uuid4().hex[:8]
    first = KvoffloadSpec(offloading_config(shm_dir, kv, kvoffload_engine_id=name)).get_worker(kv.caches)
    with pytest.raises(kvoffload.Error) as e:
        KvoffloadSpec(offloading_config(shm_dir, kv, kvoffload_engine_id=name)).get_worker(kv.caches)
    assert e.value.code == kvoffload.ErrorCode.IN_USE
    assert f"rank 0 of engine '{name}'" in str(e.value)
    assert f"is held by PID {os.getpid()}." in str(e.value)
    other = KvoffloadSpec(offloading_config(shm_dir, kv)).get_worker(kv.caches)  # its own name
    other.shutdown()
    first.shutdown()


def test_replicated_layout_workers_each_hold_their_own_rank(shm_dir):
    # MLA: every rank's slot is copy 0 of the row, but each worker still holds its own rank, so
    # tensor-parallel ranks attach side by side and a second rank-1 worker is refused.
    kv = KvCaches(Device("host"), bpc=2, seed=8, tensors=[(4096, 4096)], groups=[[(0, 4096)]])
    engine_id = "mla-" + uuid.uuid4().hex[:8]

    def worker(rank):
        cfg = offloading_config(shm_dir, kv, world_size=2, rank=rank, engine_id=engine_id,
                                replicated=True)
        return KvoffloadSpec(cfg).get_worker(kv.caches)

    rank0, rank1 = worker(0), worker(1)
    assert rank0._worker.rank == 0 and rank1._worker.rank == 1
    np.asarray(rank0._worker.slot(2))[:] = 0x3C
    assert (np.asarray(rank1._worker.slot(2)) == 0x3C).all()  # rank 1's slot is copy 0 too
    with pytest.raises(kvoffload.Error) as e:
        worker(1)
    assert e.value.code == kvoffload.ErrorCode.IN_USE
    rank1.shutdown()
    rank0.shutdown()


def test_a_worker_whose_engine_cannot_be_built_gives_its_region_back(shm_dir, monkeypatch):
    # A step fails after the rank was assembled (kvoffload.OffloadWorker: region and engine; its
    # own failures release in C++, tests/stack): the worker closes it before the error
    # propagates, so the rank is free at once, even while the error (whose traceback holds the
    # half-built worker) is still alive.
    kv = KvCaches(Device("host"), bpc=1, seed=9, **ONE_GROUP)
    name = "noengine-" + uuid.uuid4().hex[:8]

    def refuse(*args, **kwargs):
        raise kvoffload.Error("injected: no transfer engine")

    with monkeypatch.context() as m:
        m.setattr(KvoffloadWorker, "_compute_stream_getter", staticmethod(refuse))
        with pytest.raises(kvoffload.Error, match="injected: no transfer engine") as failed:
            KvoffloadSpec(offloading_config(shm_dir, kv, kvoffload_engine_id=name)).get_worker(
                kv.caches)
    assert failed.value is not None  # alive: the failed worker's frames are still referenced
    worker = KvoffloadSpec(offloading_config(shm_dir, kv, kvoffload_engine_id=name)).get_worker(
        kv.caches)  # rank 0 is free again
    assert worker._worker.rank == 0
    worker.shutdown()


def scheduler_page(shm_dir, engine_id):
    """The scheduler block of engine_id's live page, as `kvoffload top` / `region list` read it."""
    (entry,) = [e for e in kvoffload.snapshot_engines(shm_dir) if e["engine_id"] == engine_id]
    assert entry["live"] is not None, entry["live_problem"]
    return entry["live"]["scheduler"]


@pytest.mark.parametrize("bringup", ["blocking", "background"])
def test_the_scheduler_publishes_its_occupancy_to_the_live_page(shm_dir, bringup):
    # Issue 27 (Note [Live page of a vLLM scheduler]): as `kvoffload run`'s scheduler does, so
    # kvoffload top, region list and the exporter show a vLLM engine's occupancy.
    kv = KvCaches(Device("host"), bpc=1, seed=31, **ONE_GROUP)
    spec = KvoffloadSpec(offloading_config(shm_dir, kv, chunks=8, kvoffload_bringup=bringup))
    manager = spec.get_manager()
    worker = spec.get_worker(kv.caches)
    if bringup == "background":
        worker._worker.wait_bringup()
    page = scheduler_page(shm_dir, spec.engine_id())
    assert page["attached"] and not page["detached"] and page["pid"] == os.getpid()
    assert page["num_chunks"] == 8 and page["used"] == 0
    keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(3)]
    out = manager.prepare_store(keys, CTX)
    page = scheduler_page(shm_dir, spec.engine_id())
    assert (page["used"], page["write_pending"], page["stores_prepared"]) == (3, 3, 3)
    assert page["ready_chunks"] == 8  # every chunk up (background: after the bring-up)
    manager.complete_store(out.keys_to_store, CTX)
    assert manager.lookup(keys[0], CTX) == LookupResult.HIT
    manager.prepare_load(keys[:1], CTX)
    page = scheduler_page(shm_dir, spec.engine_id())
    assert (page["used"], page["write_pending"], page["pinned"]) == (3, 0, 1)
    assert (page["stores_completed"], page["hits"], page["loads_prepared"]) == (3, 1, 1)
    worker.shutdown()
    manager.shutdown()  # vLLM's connector shuts the manager down last
    assert not manager._core.publishing_live_stats
    # The scheduler's mapping is gone: the region file went with its last mapper (a reader sees
    # nothing left), or, where another mapper remains, the block reads detached.
    left = [e for e in kvoffload.snapshot_engines(shm_dir) if e["engine_id"] == spec.engine_id()]
    assert left == [] or left[0]["live"]["scheduler"]["detached"]


def test_a_detached_scheduler_block_is_marked_detached_while_a_rank_keeps_the_region(shm_dir):
    kv = KvCaches(Device("host"), bpc=1, seed=32, **ONE_GROUP)
    spec = KvoffloadSpec(offloading_config(shm_dir, kv, chunks=8))
    manager = spec.get_manager()
    worker = spec.get_worker(kv.caches)
    manager.prepare_store([make_offload_key(b"d" * 32, 0)], CTX)
    manager.shutdown()
    page = scheduler_page(shm_dir, spec.engine_id())
    assert page["attached"] and page["detached"] and page["used"] == 1  # the final values
    worker.shutdown()
