"""The worker half: :class:`KvoffloadWorker`, vLLM's ``OffloadingWorker`` moving blocks between
the engine's KV-cache tensors and kvoffload's shared host Region (or the node pool) with a
TransferEngine (CUDA, HIP, or for tests host and sim), reporting results as vLLM's CPU worker
does (Note [Completion order]).
"""

from __future__ import annotations

import collections
import itertools
import logging

from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

from .. import _kvoffload as _ext

__all__ = ["KvoffloadWorker"]

logger = logging.getLogger("kvoffload.vllm")


def _device_of(kv_caches) -> tuple[str, int | None]:
    """(type, index) of the KV-cache tensors' device; they must all be on one device."""
    devices = {(t.tensor.device.type, t.tensor.device.index) for t in kv_caches.tensors}
    if len(devices) != 1:
        names = sorted(f"{t}" + ("" if i is None else f":{i}") for t, i in devices)
        raise ValueError(f"KvoffloadWorker: the KV-cache tensors are on several devices {names}; "
                         "one worker serves one device")
    return devices.pop()


# The backends make_runtime knows; "host" and "sim" are for tests.
_BACKENDS = ("auto", "cuda", "hip", "host", "sim")


def _torch_gpu_backend() -> str:
    """The GPU backend matching torch's build: a ROCm torch names its devices "cuda" too, and
    only torch.version.hip tells it apart. Opening the other vendor's module would load a second
    GPU runtime into the engine's process."""
    import torch

    version = getattr(torch, "version", None)
    return "hip" if getattr(version, "hip", None) else "cuda"


def _select_backend(requested: str, device_type: str, device_name: str) -> str:
    """The backend to run, refusing any that cannot address the tensors' memory. Only the module
    of the backend chosen is opened (probe_backend), never every module, and "auto" never
    creates a simulated device in the engine's process."""
    if requested not in _BACKENDS:
        raise ValueError(f"KvoffloadSpec: kvoffload_backend={requested!r} is not one of "
                         f"{list(_BACKENDS)}")
    if requested == "auto":
        if device_type == "cpu":
            return "host"
        gpu = _torch_gpu_backend()
        info = _ext.probe_backend(gpu)
        if not info.built or info.device_count <= 0:
            raise ValueError(
                f"KvoffloadWorker: the KV-cache tensors are on {device_name} (torch built for "
                f"{gpu.upper()}), but this kvoffload has no usable {gpu} backend ({gpu}: "
                f"{info.detail or 'not built'}), and the host backend would memcpy from device "
                f"pointers. Install a kvoffload built with {gpu.upper()} for this machine "
                "(docs/VLLM.md: 'Building for a vLLM environment': pip install . with nvcc or hipcc on "
                f"PATH), or set KVOFFLOAD_BACKEND_DIR to the directory holding libkvoffload_{gpu}.so"
            )
        return gpu
    if requested == "host" and device_type != "cpu":
        raise ValueError(
            f"KvoffloadWorker: kvoffload_backend='host' copies with memcpy, but the KV-cache "
            f"tensors are on {device_name}; use 'auto' (or 'cuda' / 'hip')"
        )
    if requested != "host" and device_type == "cpu":
        raise ValueError(
            f"KvoffloadWorker: kvoffload_backend={requested!r} needs KV-cache tensors on a GPU; "
            "they are on the CPU (use 'host' for host tensors)"
        )
    if requested in ("cuda", "hip") and requested != (gpu := _torch_gpu_backend()):
        raise ValueError(
            f"KvoffloadWorker: kvoffload_backend={requested!r}, but torch is built for "
            f"{gpu.upper()}: the KV-cache tensors on {device_name} are {gpu} memory; use 'auto' "
            f"(or {gpu!r})"
        )
    return requested


class KvoffloadWorker(OffloadingWorker):
    """Moves KV blocks between the engine's KV-cache tensors and kvoffload's shared Region.

    The slot of each chunk is laid out as vLLM's CPU worker lays out its rows: one section per
    unique KV tensor (kv_caches.tensors), in order, each blocks_per_chunk padded pages long
    (CanonicalKVCacheTensor.page_size_bytes); a KV-cache group copies, for each of its layer
    references, the reference's unpadded page into the section of the tensor it points at. A
    chunk holds one group's blocks (vLLM's keys carry the group index), so groups that share
    tensors share sections. A store or load is one asynchronous TransferEngine job.
    """

    def __init__(
        self,
        kv_caches,
        *,
        engine_id: str,
        num_blocks: int,
        blocks_per_chunk: int,
        slot_bytes: int,
        rank: int,
        world_size: int,
        replicated: bool = False,
        backend: str = "auto",
        device: int | None = None,
        shm_dir: str | None = None,
        join_timeout: float = 30.0,
        register_host: bool = True,
        pool_settings=None,
        bringup: str = "blocking",
        bringup_piece_bytes: int | None = None,
        job_timing: bool = True,
    ):
        self._bpc = int(blocks_per_chunk)
        self._job_timing = bool(job_timing)  # kvoffload_job_timing: transfer_time, else None
        self._engine = None
        self._worker = None  # kvoffload.OffloadWorker: this rank's runtime, region and engine
        self._runtime = None
        self._pool = None
        # Job ids per direction in submission order, until vLLM has their results; results
        # collected from the engine wait in _done until get_finished hands them out in that order
        # (Note [Completion order] below).
        self._queues: dict[str, collections.deque[int]] = {
            "store": collections.deque(), "load": collections.deque()}
        self._done: dict[int, TransferResult] = {}
        device_type, device_index = _device_of(kv_caches)
        device_name = device_type if device_index is None else f"{device_type}:{device_index}"
        self._groups, needed = self._layout(kv_caches)
        if needed > slot_bytes:
            raise ValueError(
                f"KvoffloadWorker: the KV-cache tensors need {needed} bytes per chunk "
                f"({self._bpc} blocks of {needed // self._bpc} bytes), but the region's slot, "
                f"from vLLM's worker_kv_bytes_per_block, is {slot_bytes} bytes"
            )
        self._backend = _select_backend(backend, device_type, device_name)
        if device is not None and device_index is not None and int(device) != device_index:
            # The engine copies from and to the tensors' own memory: a runtime on another device
            # would hand the kernel and the DMA engine addresses of another GPU.
            raise ValueError(
                f"KvoffloadWorker: kvoffload_device={int(device)}, but the KV-cache tensors are "
                f"on {device_name}; leave kvoffload_device unset (it defaults to the tensors' "
                f"device) or set it to {device_index}"
            )
        if device is None:
            device = device_index or 0
        self._num_blocks = int(num_blocks)
        if pool_settings is not None:
            # The node pool (kvoffload_pool='node'): this rank's slots of the pool's chunks; the
            # scheduler's PoolManager hands out the pool's slots as block ids. The worker is a
            # tenant of its own (it holds no pins or writes), so the pool stays mapped while the
            # engine copies, and its death is one the pool repairs like any other.
            from .pool import worker_host_slots

            self._runtime = _ext.make_runtime(self._backend, device=int(device))
            self._pool = pool_settings.attach(f"{engine_id}.rank{rank}")
            try:
                self._engine = _ext.TransferEngine.for_buffer(
                    self._runtime, groups=self._groups, blocks_per_chunk=self._bpc,
                    register_host=register_host, job_timing=self._job_timing,
                    **worker_host_slots(self._pool, 0 if replicated else rank))
            except BaseException:
                self._pool.detach()
                raise
        elif self._num_blocks == 0:
            # vLLM's spec sized the cache to 0 blocks; its manager never stores, so no job comes.
            logger.warning("kvoffload: cpu_bytes_to_use holds no chunk; offloading is off")
        else:
            # The rank assembled by the library (kvoffload.OffloadWorker, docs/DESIGN.md 7.4):
            # the runtime on the tensors' device, the region with each bring-up piece registered
            # as it comes up, the engine told of each piece, and the one safe teardown order.
            # "background" returns once the region is mapped: the scheduler hands out only the
            # chunks every rank has brought up (Note [Ready prefix] in KvoffloadSpec).
            # The worker's own rank even in the replicated layout (where every rank's slot is copy
            # 0): each rank slot has one holder at a time, so a second process on this rank, or a
            # data-parallel replica given the same kvoffload_engine_id, is refused here with
            # kvoffload.Error(IN_USE) naming the holder's PID instead of sharing its slots.
            piece = {} if bringup_piece_bytes is None else {
                "bringup_piece_bytes": int(bringup_piece_bytes),
                "bringup_first_piece_bytes": min(int(bringup_piece_bytes), 64 << 20)}
            self._worker = _ext.OffloadWorker(
                engine_id=engine_id,
                num_chunks=self._num_blocks,
                slot_bytes=int(slot_bytes),
                world_size=world_size,
                rank=rank,
                groups=self._groups,
                blocks_per_chunk=self._bpc,
                backend=self._backend,
                devices=[int(device)],
                replicated=replicated,
                shm_dir=shm_dir,
                join_timeout=join_timeout,
                bringup=bringup,
                job_timing=self._job_timing,
                **piece,
            )
            self._engine = self._worker.engine
        try:
            self._stream_of = self._compute_stream_getter(self._backend, device_index)
        except BaseException:
            self.shutdown()  # the rank is free before the error propagates
            raise

    def _layout(self, kv_caches) -> tuple[list, int]:
        """The engine's KV groups (explicit slot sections) and the slot bytes they reach."""
        bpc = self._bpc
        sections = []
        offset = 0
        for t in kv_caches.tensors:
            sections.append(offset)
            offset += int(t.page_size_bytes) * bpc
        if not kv_caches.group_data_refs:
            raise ValueError("KvoffloadWorker: the KV caches have no KV-cache group")
        groups = []
        for g, refs in enumerate(kv_caches.group_data_refs):
            pages: dict[int, int] = {}
            for ref in refs:
                # Two layers of one group on one tensor copy the same bytes: once, the longer page.
                pages[ref.tensor_idx] = max(pages.get(ref.tensor_idx, 0), int(ref.page_size_bytes))
            if not pages:
                raise ValueError(f"KvoffloadWorker: KV-cache group {g} references no tensor")
            group = []
            for idx, page in pages.items():
                canonical = kv_caches.tensors[idx]
                tensor = canonical.tensor
                padded = int(canonical.page_size_bytes)
                if page > padded:
                    raise ValueError(
                        f"KvoffloadWorker: group {g} copies {page} bytes per block of tensor "
                        f"{idx}, whose page is {padded} bytes")
                stride = int(tensor.stride()[0]) * int(tensor.element_size())
                group.append(_ext.DeviceTensor(
                    int(tensor.data_ptr()), int(tensor.shape[0]), page, stride,
                    host_offset=sections[idx], host_page_stride=padded))
            groups.append(group)
        return groups, offset

    @staticmethod
    def _compute_stream_getter(backend: str, device_index: int | None):
        # Transfers wait for the engine's compute stream (the KV a store reads is written there,
        # and a load must not overtake work queued on the blocks it overwrites).
        if backend in ("cuda", "hip"):
            import torch

            return lambda: torch.cuda.current_stream(device_index).cuda_stream
        return lambda: None

    def _submit(self, job_id: int, direction: str, cpu_spec, gpu_spec) -> bool:
        if self._engine is None:
            logger.error("kvoffload: %s job %d refused: the region has no chunk (cpu_bytes_to_use "
                         "is smaller than one chunk)", direction, job_id)
            return False
        gpu_ids = gpu_spec.block_ids.tolist()
        chunks = cpu_spec.block_ids.tolist()
        sizes = list(gpu_spec.group_sizes)
        indices = list(gpu_spec.block_indices)
        bpc = self._bpc
        group_blocks = []
        group_chunks = []
        b = c = 0
        for size, first in zip(sizes, indices):
            size = int(size)
            skip = int(first) % bpc if size else 0
            n = -(-(skip + size) // bpc) if size else 0
            group_blocks.append(gpu_ids[b:b + size])
            group_chunks.append((chunks[c:c + n], skip))
            b += size
            c += n
        try:
            if len(sizes) != len(self._groups) or b != len(gpu_ids) or c != len(chunks):
                raise _ext.Error(
                    f"the job maps {len(gpu_ids)} GPU blocks in {len(sizes)} groups onto "
                    f"{len(chunks)} chunks; the groups' sizes {sizes} and block indices "
                    f"{indices} need {c} chunks (blocks_per_chunk {bpc}), and the model has "
                    f"{len(self._groups)} KV-cache groups")
            self._engine.submit(job_id, direction, [], group_blocks, group_chunks=group_chunks,
                                wait_stream=self._stream_of())
        except _ext.Error as err:
            # The job never started: vLLM gets False.
            logger.error("kvoffload: %s job %d was refused: %s", direction, job_id, err)
            return False
        self._queues[direction].append(job_id)
        return True

    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._submit(job_id, "store", dst_spec, src_spec)

    def submit_load(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._submit(job_id, "load", src_spec, dst_spec)

    def _collect(self, results) -> None:
        for r in results:
            if not r.success:
                logger.error("kvoffload: %s job %d failed: %s", r.direction, r.job_id, r.error)
            self._done[r.job_id] = TransferResult(job_id=r.job_id, success=r.success,
                                                  transfer_size=r.bytes,
                                                  transfer_time=r.seconds if self._job_timing else None)

    # Note [Completion order]
    # vLLM's CPU worker reports its stores, then its loads, each direction in submission order
    # (a job finishes only after the earlier jobs of its direction), and its wait() only blocks:
    # the results still come out of the next get_finished() in that order. The scheduler's
    # connector completes stores in the order it gets them, which sets the manager's LRU/ARC
    # order, so later evictions and block ids depend on it. kvoffload's engine also finishes
    # each direction in order, but its wait() hands the waited results out first; this worker
    # therefore keeps them and reports as vLLM does.
    def get_finished(self) -> list[TransferResult]:
        if self._engine is not None:
            self._collect(self._engine.poll())
        out = []
        done = self._done
        for queue in self._queues.values():  # stores, then loads
            while queue and queue[0] in done:
                out.append(done.pop(queue.popleft()))
        return out

    def wait(self, job_ids: set[int]) -> None:
        # As vLLM's CPU worker: ids this worker never submitted, or whose results it has handed
        # out already, are ignored (the scheduler sends them on preemption, reset_cache, and
        # when ranks finish at different times). A waited job's direction finishes in order, so
        # the jobs submitted before it are waited for too; every one of their results comes out
        # of the next get_finished().
        if self._engine is None:
            return
        wanted = []
        for queue in self._queues.values():
            last = max((i for i, job in enumerate(queue) if job in job_ids), default=-1)
            wanted.extend(job for job in itertools.islice(queue, last + 1)
                          if job not in self._done)
        if wanted:
            self._collect(self._engine.wait(wanted))

    def bringup_status(self) -> dict | None:
        """This rank's bring-up (state, ready_chunks, num_chunks, seconds, ...); None for the node
        pool or a cache of 0 chunks."""
        return None if self._worker is None else self._worker.bringup_status()

    def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
            del engine  # the worker's engine keeps the worker alive: the last reference goes first
        worker, self._worker = self._worker, None
        if worker is not None:
            try:
                worker.close()  # engine drained, pieces unregistered, region unmapped, runtime last
            except _ext.Error as err:
                # A slot() view is still alive: the worker closes when the last one is dropped.
                logger.warning("kvoffload: %s", err)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.detach()  # after the engine: its copies use the pool's mapping
