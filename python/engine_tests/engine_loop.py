"""vLLM's engine step, with vLLM's real Scheduler and OffloadingConnector (both halves), for the
tests and the bench in this folder. Runs under the vLLM harness only (tools/vllm-engine-tests.sh).

- :class:`Engine`: one engine, built as vLLM's own connector tests build theirs (their
  ``RequestRunner``), with a chosen OffloadingSpec. Its ``step()`` is the engine step: schedule,
  handle_preemptions, bind_connector_metadata, start_load_kv, the forward pass, get_finished,
  update_from_output. The forward pass writes into each block the request fills bytes that are a
  function of the block's hash, and after each step every full block of every running request is
  checked to hold its bytes: what a load brought back is checked byte for byte.
- :class:`Recorder`: everything the scheduler sees, step by step: its output (scheduled tokens,
  preemptions, the connector metadata's load, store and flush lists), the external computed
  tokens it was told, every OffloadingManager call with its arguments and result, the KV events,
  the connector stats (transfer times left out: they are wall-clock) and the completed jobs.
- :class:`ReferenceWorker` / :class:`ReferenceCPUSpec`: vLLM's ``CPUOffloadingSpec`` with, in
  place of its CUDA worker (which refuses the CPU platform), a worker that copies as
  ``CPUOffloadingWorker`` does (direct layout) with numpy and reports as it does: stores then
  loads, each in submission order, ``wait`` only blocking.
- :class:`CompletionGate`: makes when jobs complete a function of the test's schedule, not of
  thread timing: per step, the first k jobs of each direction may complete (each direction
  finishes in submission order, as on vLLM's streams); a worker's results are passed on in the
  order the worker gave them, stores before loads, and results of jobs not yet allowed are held.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID, create_model_runner_output, create_vllm_config
from vllm.config import KVEventsConfig, KVTransferConfig, set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.forward_context import ForwardContext
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import kvoffload


# ---- vLLM's CPU worker, in numpy ------------------------------------------------------------

class ReferenceWorker(OffloadingWorker):
    """CPUOffloadingWorker's copies (direct layout: each layer reference copies its unpadded page
    per block, into the chunk's sub-block of its tensor's padded pages) and its reports."""

    def __init__(self, kv_caches, blocks_per_chunk: int, num_cpu_blocks: int):
        self.bpc = blocks_per_chunk
        self.refs = kv_caches.group_data_refs
        self.pages = [int(t.page_size_bytes) for t in kv_caches.tensors]
        self.gpu = [t.tensor.view(torch.int8).view((-1, int(t.page_size_bytes))).numpy().view(np.uint8)
                    for t in kv_caches.tensors]
        self.cpu = [np.zeros((num_cpu_blocks, page * blocks_per_chunk), np.uint8) for page in self.pages]
        self.finished: dict[str, list[TransferResult]] = {"store": [], "load": []}

    def _copy(self, job_id, gpu_spec, cpu_spec, store: bool) -> TransferResult:
        gpu_ids, chunks = gpu_spec.block_ids.tolist(), cpu_spec.block_ids.tolist()
        b = c = 0
        nbytes = 0
        for g, (size, first) in enumerate(zip(gpu_spec.group_sizes, gpu_spec.block_indices)):
            size = int(size)
            if size == 0:
                continue
            skip = int(first) % self.bpc
            for ref in self.refs[g]:
                t, page, pad = ref.tensor_idx, int(ref.page_size_bytes), self.pages[ref.tensor_idx]
                for i in range(size):
                    pos = skip + i
                    chunk, off = chunks[c + pos // self.bpc], (pos % self.bpc) * pad
                    host = self.cpu[t][chunk, off:off + page]
                    dev = self.gpu[t][gpu_ids[b + i], :page]
                    if store:
                        host[:] = dev
                    else:
                        dev[:] = host
                nbytes += size * page
            b += size
            c += -(-(skip + size) // self.bpc)
        return TransferResult(job_id=job_id, success=True, transfer_size=nbytes, transfer_time=0.0)

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        self.finished["store"].append(self._copy(job_id, src_spec, dst_spec, store=True))
        return True

    def submit_load(self, job_id, src_spec, dst_spec) -> bool:
        self.finished["load"].append(self._copy(job_id, dst_spec, src_spec, store=False))
        return True

    def get_finished(self) -> list[TransferResult]:
        out = self.finished["store"] + self.finished["load"]
        self.finished = {"store": [], "load": []}
        return out

    def wait(self, job_ids) -> None:
        return None  # every job finished when it was submitted

    def shutdown(self) -> None:
        return None


class ReferenceCPUSpec(CPUOffloadingSpec):
    """vLLM's CPUOffloadingSpec (its manager, sizes and metrics) with ReferenceWorker."""

    def get_worker(self, kv_caches):
        if not self._worker:
            self._worker = ReferenceWorker(kv_caches, self.blocks_per_chunk, self.num_blocks)
        return self._worker


# ---- when jobs complete ---------------------------------------------------------------------

class CompletionGate(OffloadingWorker):
    """A worker whose jobs complete when the schedule allows (see the module's docstring)."""

    def __init__(self, inner: OffloadingWorker, timeout: float = 60.0):
        self.inner = inner
        self.timeout = timeout
        self.pending: dict[str, deque[int]] = {"store": deque(), "load": deque()}
        self.direction: dict[int, str] = {}
        self.allowed: set[int] = set()
        self.held: list[TransferResult] = []  # finished in the worker, not yet allowed
        self.seen: set[int] = set()

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._submit("store", job_id, self.inner.submit_store(job_id, src_spec, dst_spec))

    def submit_load(self, job_id, src_spec, dst_spec) -> bool:
        return self._submit("load", job_id, self.inner.submit_load(job_id, src_spec, dst_spec))

    def _submit(self, direction, job_id, ok) -> bool:
        if ok:
            self.pending[direction].append(job_id)
            self.direction[job_id] = direction
        return ok

    def allow(self, stores: int, loads: int) -> None:
        """The next `stores` stores and `loads` loads not allowed yet may complete."""
        for direction, n in (("store", stores), ("load", loads)):
            waiting = [j for j in self.pending[direction] if j not in self.allowed]
            self.allowed.update(waiting[:n])

    def wait(self, job_ids) -> None:
        # vLLM's wait: the job, and (its direction finishing in order) every job before it, done.
        self.inner.wait(job_ids)
        for queue in self.pending.values():
            last = max((i for i, j in enumerate(queue) if j in job_ids), default=-1)
            self.allowed.update(itertools.islice(queue, last + 1))

    def get_finished(self) -> list[TransferResult]:
        wanted = {j for q in self.pending.values() for j in q if j in self.allowed}
        deadline = time.monotonic() + self.timeout
        got = list(self.held)
        while True:
            new = self.inner.get_finished()
            got += new
            self.seen.update(r.job_id for r in new)
            if wanted <= self.seen:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs {sorted(wanted - self.seen)} did not finish in {self.timeout} s")
            time.sleep(0.0005)
        out = [r for r in got if r.job_id in wanted]
        self.held = [r for r in got if r.job_id not in wanted]
        out.sort(key=lambda r: self.direction[r.job_id] == "load")  # stable: stores, then loads
        for r in out:
            self.pending[self.direction.pop(r.job_id)].remove(r.job_id)
            self.allowed.discard(r.job_id)
            self.seen.discard(r.job_id)
        return out

    def shutdown(self) -> None:
        self.inner.shutdown()


# ---- what the scheduler sees ------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """A comparable form of the values crossing the connector (keys, specs, results, events)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if hasattr(value, "req_id") and type(value).__name__ == "ReqContext":
        return ("ctx", value.req_id)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "name") and hasattr(type(value), "__members__"):
        return value.name  # an enum
    if isinstance(value, dict):
        keys = [_plain(k) for k in value]
        keys = [k if isinstance(k, (str, int, float, bool, type(None))) else repr(k) for k in keys]
        return dict(zip(keys, (_plain(v) for v in value.values())))
    if isinstance(value, (list, tuple, set, frozenset, deque)):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if hasattr(value, "block_ids"):  # LoadStoreSpec
        fields = {"block_ids": value.block_ids.tolist()}
        for name in ("group_sizes", "block_indices"):
            if hasattr(value, name):
                fields[name] = [int(x) for x in getattr(value, name)]
        return (type(value).__name__ if type(value).__name__ == "GPULoadStoreSpec" else "offload", fields)
    if hasattr(value, "__dataclass_fields__") or hasattr(value, "__struct_fields__"):
        names = getattr(value, "__struct_fields__", None) or value.__dataclass_fields__
        return (type(value).__name__, {n: _plain(getattr(value, n)) for n in names})
    if hasattr(value, "__dict__"):
        return (type(value).__name__, {k: _plain(v) for k, v in vars(value).items()
                                       if not k.startswith("_")})
    return repr(value)


class RecordingManager:
    """Passes every OffloadingManager call on and records it with its result."""

    _CALLS = ("lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store",
              "on_new_request", "on_request_finished", "take_events", "on_schedule_end",
              "has_pending_work", "reset_cache", "get_stats")

    def __init__(self, inner, log: list, timing: list):
        self._inner, self._log, self._timing = inner, log, timing

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in self._CALLS:
            return attr

        def call(*args, **kwargs):
            args = [list(a) if isinstance(a, Iterator) else a for a in args]
            t0 = time.perf_counter()
            result = attr(*args, **kwargs)
            if name == "take_events":
                result = list(result)
            self._timing.append(time.perf_counter() - t0)
            if name == "get_stats":
                self._log.append((name, _stats(result)))
            else:
                self._log.append((name, _plain(args), _plain(kwargs), _plain(result)))
            return result

        return call


class TimingManager:
    """Passes every OffloadingManager call on and adds its duration (CPU time of the calling
    thread) to `timing`, and per method to `by_method` (the bench)."""

    def __init__(self, inner, timing: list):
        self._inner, self._timing = inner, timing
        self.by_method: dict[str, float] = {}
        self.calls_by_method: dict[str, int] = {}

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in RecordingManager._CALLS:
            return attr
        timing, clock, by_method, calls = self._timing, time.thread_time, self.by_method, self.calls_by_method

        def call(*args, **kwargs):
            t0 = clock()
            try:
                return attr(*args, **kwargs)
            finally:
                dt = clock() - t0
                timing.append(dt)
                by_method[name] = by_method.get(name, 0.0) + dt
                calls[name] = calls.get(name, 0) + 1

        return call


# Metrics that measure wall-clock time (transfer times, lookup delays): they differ run to run.
_WALL_CLOCK = ("_time", "_seconds")


def _stats(stats) -> Any:
    """Connector / manager stats without the wall-clock transfer times."""
    if stats is None:
        return None
    data = _plain(getattr(stats, "data", stats))
    if isinstance(data, dict):
        for part in data.values():
            if isinstance(part, dict):
                for key in [k for k in part if isinstance(k, str) and k.endswith(_WALL_CLOCK)]:
                    part.pop(key)
    return data


def make_stream(seed: int, steps: int, block: int = 16, max_prompt_blocks: int = 10):
    """Per step: requests to add (id, prompt, max_tokens), requests to abort, and how many
    stores and loads may complete ((n, n) with n None = all). Shared prefixes, repeated prompts
    (whole-prompt hits), prompts longer than the GPU cache keeps (preemption), aborts."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 30000) for _ in range(rng.randrange(1, 7) * block)] for _ in range(3)]
    issued: list[list[int]] = []
    stream = []
    n = 0
    for step in range(steps):
        adds = []
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            kind = rng.random()
            if issued and kind < 0.3:
                prompt = list(rng.choice(issued))
            elif kind < 0.8:
                prompt = rng.choice(prefixes) + [rng.randrange(1, 30000) for _ in range(rng.randrange(0, 3 * block))]
            else:
                prompt = [rng.randrange(1, 30000) for _ in range(rng.randrange(8, max_prompt_blocks * block))]
            if not prompt:
                prompt = [7]
            issued.append(prompt)
            adds.append((f"r{n}", prompt, rng.randrange(1, 12)))
            n += 1
        aborts = [f"r{rng.randrange(n)}"] if n and rng.random() < 0.08 else []
        allow = rng.choice(((None, None), (None, None), (0, 0), (1, 0), (0, 1), (1, 1), (2, 1)))
        stream.append((adds, aborts, allow))
    return stream


def run_stream(engine: "Engine", stream, drain_steps: int = 200) -> list:
    """Feeds `stream` (make_stream) to `engine` step by step, then steps until it drained; returns
    the step logs."""
    log = []
    for adds, aborts, (stores, loads) in stream:
        for req_id, prompt, max_tokens in adds:
            engine.add_request(req_id, prompt, max_tokens)
        for req_id in aborts:
            engine.abort(req_id)
        allow = None if stores is None else (stores, loads)
        log.append(engine.step(allow))
    for _ in range(drain_steps):
        if not engine.busy():
            break
        log.append(engine.step())
    assert not engine.busy(), "the engine did not drain"
    return log


# ---- one engine -------------------------------------------------------------------------------

def kv_bytes(block_hash: bytes, tensor: int, page: int) -> np.ndarray:
    """The bytes the forward pass writes into a full block (a function of its hash alone)."""
    seed = hashlib.sha256(bytes(block_hash) + tensor.to_bytes(2, "little")).digest()
    return np.frombuffer((seed * (page // len(seed) + 1))[:page], np.uint8)


def spec_config(spec: str, cpu_blocks: int, block_size: int, blocks_per_chunk: int, policy: str,
                store_threshold: int, shm_dir: str, page_bytes: int) -> dict:
    """kv_connector_extra_config for `spec` ("cpu" or "kvoffload") sized to `cpu_blocks` chunks
    in both: each spec's own row size, so both managers get the same number of blocks."""
    chunk = page_bytes * blocks_per_chunk
    cpu_row = -(-chunk // CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT) * CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT
    kvo_row = kvoffload.compute_geometry(num_chunks=1, slot_bytes=chunk, world_size=1).row_stride
    lo, hi = cpu_blocks * max(cpu_row, kvo_row), (cpu_blocks + 1) * min(cpu_row, kvo_row)
    assert lo < hi, f"no cpu_bytes_to_use gives both specs {cpu_blocks} blocks ({cpu_row}, {kvo_row})"
    extra: dict[str, Any] = {"cpu_bytes_to_use": lo, "eviction_policy": policy,
                             "block_size": block_size * blocks_per_chunk,
                             "store_threshold": store_threshold}
    if spec == "cpu":
        extra.update(spec_name="ReferenceCPUSpec", spec_module_path="engine_loop")
    else:
        extra.update(spec_name="KvoffloadSpec", spec_module_path="kvoffload.vllm",
                     kvoffload_backend="host", kvoffload_shm_dir=shm_dir)
    return extra


_NOT_INITIALISED = object()
_none_hash_seed: object = _NOT_INITIALISED  # the PYTHONHASHSEED NONE_HASH was drawn under


def _init_none_hash_once() -> None:
    # Once per process and PYTHONHASHSEED, as the engine core does once at start: without
    # PYTHONHASHSEED, vLLM 017e9f4448 draws NONE_HASH from os.urandom at each call, and two engines
    # compared here must see one chain. A test that sets PYTHONHASHSEED (monkeypatch) stands for a
    # process started with it, so the hash is drawn again under the new value: otherwise an earlier
    # test's random NONE_HASH stays, and this process's block hashes differ from a child's that
    # was started with the same PYTHONHASHSEED.
    global _none_hash_seed
    seed = os.environ.get("PYTHONHASHSEED")
    if _none_hash_seed is _NOT_INITIALISED or seed != _none_hash_seed:
        init_none_hash(sha256)
        _none_hash_seed = seed


class Engine:
    """vLLM's Scheduler + OffloadingConnector (scheduler and worker halves) on one GPU's blocks."""

    def __init__(self, extra_config: dict, *, block_size: int = 16, num_gpu_blocks: int = 64,
                 max_num_batched_tokens: int = 512, gate: bool = True, record: bool = True,
                 async_scheduling: bool = False):
        """record=False: no Recorder wrappers (the bench); the manager's calls are then timed
        only (manager_time), and the scheduler's own time per step is in scheduler_time."""
        self.block_size = block_size
        vllm_config = create_vllm_config(block_size=block_size,
                                         max_num_batched_tokens=max_num_batched_tokens,
                                         disable_hybrid_kv_cache_manager=False)
        # Async scheduling (vLLM's AsyncScheduler): a step's model output is applied after the
        # next step was scheduled, as vLLM's engine core does with it on.
        vllm_config.scheduler_config.async_scheduling = async_scheduling
        self.async_scheduling = async_scheduling
        self._previous = None  # async: (scheduler output, model runner output) not applied yet
        self._computed: dict[str, tuple[int, int]] = {}  # request -> (first unwritten block, tokens computed)
        vllm_config.kv_transfer_config = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config=dict(extra_config))
        vllm_config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        kv_cache_config = KVCacheConfig(
            num_blocks=num_gpu_blocks,
            kv_cache_tensors=[KVCacheTensor(size=spec.page_size_bytes * num_gpu_blocks, shared_by=["layer"])],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        self.page = spec.page_size_bytes
        scheduler_class = AsyncScheduler if async_scheduling else Scheduler
        self.scheduler = scheduler_class(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                                   log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config),
                                   block_size=block_size)
        self.worker_connector = OffloadingConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        layer = torch.empty(num_gpu_blocks, 2, block_size, 1, 1, dtype=torch.float32)
        self.gpu = layer.numpy().view(np.uint8).reshape(num_gpu_blocks, -1)
        with set_current_vllm_config(vllm_config):
            self.worker_connector.register_kv_caches({"layer": layer})
        worker_half = self.worker_connector.connector_worker
        self.spec = worker_half.spec
        self.worker = worker_half.worker
        self.gate = CompletionGate(worker_half.worker) if gate else None
        if self.gate is not None:
            worker_half.worker = self.gate
        _init_none_hash_once()
        self.hasher = get_request_block_hasher(block_size, sha256)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.step_log: list = []
        self.manager_time: list[float] = []
        self.scheduler_time: list[float] = []
        connector = self.scheduler.connector
        half = connector.connector_scheduler
        self.manager = half.manager
        self.record = record
        if not record:
            half.manager = TimingManager(half.manager, self.manager_time)
            self.blocks_checked = 0
            return
        half.manager = RecordingManager(half.manager, self.step_log, self.manager_time)
        matched, events = connector.get_num_new_matched_tokens, connector.take_events

        def get_num_new_matched_tokens(request, num_computed_tokens):
            result = matched(request, num_computed_tokens)
            self.step_log.append(("external_tokens", request.request_id, num_computed_tokens, _plain(result)))
            return result

        def take_events():
            taken = list(events())
            self.step_log.append(("kv_events", _plain(taken)))
            return taken

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        connector.take_events = take_events
        self.blocks_checked = 0

    def add_request(self, req_id: str, prompt: list[int], max_tokens: int) -> None:
        params = SamplingParams(max_tokens=max_tokens)
        params.update_from_generation_config({}, EOS_TOKEN_ID)
        self.scheduler.add_request(Request(request_id=req_id, prompt_token_ids=prompt,
                                           sampling_params=params, pooling_params=None,
                                           block_hasher=self.hasher))

    def abort(self, req_id: str) -> None:
        if req_id in self.scheduler.requests:
            self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
            self.step_log.append(("aborted", req_id))

    def busy(self) -> bool:
        s = self.scheduler
        return bool(s.requests or s.finished_req_ids or s.connector.connector_scheduler._jobs)

    def step(self, allow: tuple[int, int] | None = None) -> list:
        """One engine step; `allow`: (stores, loads) that may complete in it (None: all)."""
        self.step_log = []
        if self.record:
            self.scheduler.connector.connector_scheduler.manager._log = self.step_log
        t0 = time.thread_time()  # CPU time of this thread: not the worker's copy threads
        out = self.scheduler.schedule()
        scheduling = time.thread_time() - t0
        meta = out.kv_connector_metadata
        self.step_log.append(("scheduled", dict(sorted(out.num_scheduled_tokens.items())),
                              sorted(getattr(out, "preempted_req_ids", None) or ()),
                              _plain(meta.load_jobs), _plain(meta.store_jobs),
                              sorted(meta.jobs_to_flush or ())))
        self.worker_connector.handle_preemptions(meta)
        self.worker_connector.bind_connector_metadata(meta)
        self.worker_connector.start_load_kv(self.ctx)
        self._forward(out)
        if self.gate is not None:
            self.gate.allow(*(allow or (1 << 30, 1 << 30)))
        _, finished_recving = self.worker_connector.get_finished(out.finished_req_ids)
        worker_meta = self.worker_connector.build_connector_worker_meta() or OffloadingWorkerMetadata()
        self.step_log.append(("completed", _plain(dict(worker_meta.completed_jobs)),
                              sorted(finished_recving),
                              worker_meta.transfer_stats.load.bytes, worker_meta.transfer_stats.store.bytes,
                              list(worker_meta.transfer_stats.load.sizes),
                              list(worker_meta.transfer_stats.store.sizes)))
        self.worker_connector.clear_connector_metadata()
        running = [r for r in self.scheduler.running if r.request_id in out.num_scheduled_tokens]
        mro = create_model_runner_output(reqs=running, finished_recving=finished_recving,
                                         kv_connector_worker_meta=worker_meta)
        # A request past its prompt samples a token (a function of the request alone); a partial
        # prefill samples none.
        mro.sampled_token_ids = [
            [1000 + (int(hashlib.sha256(f"{r.request_id}/{r.num_output_tokens}".encode()).hexdigest()[:6], 16) % 20000)]
            if r.num_computed_tokens >= r.num_tokens else [] for r in running]
        t0 = time.thread_time()
        if self.async_scheduling:
            previous, self._previous = self._previous, (out, mro)
            outputs = self.scheduler.update_from_output(*previous) if previous else {}
        else:
            outputs = self.scheduler.update_from_output(out, mro)
        self.scheduler_time.append(scheduling + time.thread_time() - t0)
        for engine_out in outputs.values():
            stats = engine_out.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                self.step_log.append(("connector_stats", _stats(stats.kv_connector_stats)))
        self._write_computed()
        self._check_blocks()
        return self.step_log

    def _forward(self, out) -> None:
        """The model: each block a scheduled request fills gets its bytes (kv_bytes). A block
        whose hash is not known yet (async scheduling: the token that fills it is applied a step
        later) is written once it is (_write_computed), never a block a load fills."""
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[req_id]
            first = (req.num_computed_tokens - n) // self.block_size
            lo, hi = self._computed.get(req_id, (first, 0))
            if hi > req.num_computed_tokens - n:  # preempted and scheduled again
                lo = first
            self._computed[req_id] = (min(lo, first), req.num_computed_tokens)
        self._write_computed()

    def _write_computed(self) -> None:
        bs = self.block_size
        for req_id, (lo, hi) in list(self._computed.items()):
            req = self.scheduler.requests.get(req_id)
            if req is None or req.status != RequestStatus.RUNNING:
                del self._computed[req_id]
                continue
            blocks = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            done = min(hi // bs, len(req.block_hashes))
            for i in range(lo, done):
                self.gpu[blocks[i]] = kv_bytes(req.block_hashes[i], 0, self.page)
            self._computed[req_id] = (max(lo, done), hi)

    def _check_blocks(self) -> None:
        bs = self.block_size
        for req in self.scheduler.running:
            if req.status != RequestStatus.RUNNING:
                continue
            blocks = self.scheduler.kv_cache_manager.get_block_ids(req.request_id)[0]
            for i in range(min(req.num_computed_tokens // bs, len(req.block_hashes))):
                want = kv_bytes(req.block_hashes[i], 0, self.page)
                assert (self.gpu[blocks[i]] == want).all(), (
                    f"request {req.request_id}: GPU block {blocks[i]} (block {i} of the request) "
                    "does not hold the bytes computed for its hash")
                self.blocks_checked += 1

    def shutdown(self) -> None:
        self.worker_connector.shutdown()
        self.scheduler.shutdown()
