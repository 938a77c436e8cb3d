"""kvoffload's tiers as secondary tiers of vLLM's TieringOffloadingSpec.

vLLM's tiering (``"spec_name": "TieringOffloadingSpec"``) keeps a CPU primary tier and hands every
block it stores on to each secondary tier; a block found in a secondary tier is promoted back into
a primary slot. Two secondary tiers come from here, loaded by vLLM's ``SecondaryTierFactory`` from
``type`` and ``module_path`` (``"module_path": "kvoffload.vllm"``):

- ``remote`` (:class:`KvoffloadRemoteTier`): a store that operators already run, shared by engines
  on different machines: ``redis://host:port[/db]``, ``redis-cluster://host:port[,...]``,
  ``memcached://host:port[,...]``. Values carry a checksummed header (a corrupt or foreign value is
  a miss), keys carry a fingerprint of the model and geometry (two models never share), lookups
  answer RETRY while the store's answer is pending and MISS when their budget is spent, and a
  dead or frozen store degrades to misses and is used again when it answers.
- ``file`` (:class:`KvoffloadFileTier`): a local directory, in place of vLLM's ``fs`` tier with
  the same keys (``root_dir``, ``n_read_threads``, ``n_write_threads``, ``enable_kv_events``,
  ``locality``): checksummed records written by C++ threads, a capacity kept below what the
  filesystem holds (a full disk evicts the oldest records instead of failing every store), and
  the records of a previous run indexed at start, so a restarted engine hits them.

The I/O runs in C++ (kvoffload's FileTier and RemoteTier, ``python/src/vllm_tiers.cpp``); the
scheduler thread only queues jobs and reads results (Note [Scheduler thread] there).

Block hashes are the keys: engines (and a restarted engine) find each other's chunks only when
their block hashes agree across processes (kvoffload.vllm_compat: the same ``PYTHONHASHSEED`` in
every process, or from vLLM 7cfb97e3 on sha256 / sha256_cbor with it unset); each tier warns at
start when they do not.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from .. import _kvoffload as _ext
from .. import vllm_compat
from .. import _remote_options

__all__ = ["KvoffloadFileTier", "KvoffloadRemoteTier"]

logger = logging.getLogger(__name__)

# VllmTierCore.lookup's codes (kvoffload::TierPresence): absent, present, pending.
_LOOKUP = (LookupResult.MISS, LookupResult.HIT, LookupResult.RETRY)

# A failure of the same kind is logged at most once per interval (a dead store fails every job).
_WARN_INTERVAL_S = 10.0


def _locality(value: Any, tier: str) -> Locality | None:
    if value is None:
        return None
    try:
        return Locality(str(value).upper())
    except ValueError:
        raise ValueError(
            f"{tier}: locality={value!r} is not one of {[m.value for m in Locality]} "
            "(or leave it unset)"
        ) from None


_non_negative_int = _remote_options.non_negative_int


def _prefix_caching_hash_algo() -> str:
    # The engine's block-hash function; vLLM's default when no engine config is current.
    try:
        from vllm.config import get_current_vllm_config

        return str(get_current_vllm_config().cache_config.prefix_caching_hash_algo)
    except Exception:  # noqa: BLE001 - a vLLM without it, or no config: its default
        return "sha256"


def _warn_hash_seed(tier: str) -> None:
    """Warns when chunks this engine stores cannot be found by another process (another engine,
    this one restarted): vLLM's block hashes, the keys, differ between processes then."""
    try:
        from vllm.v1.core import kv_cache_utils
    except ImportError:
        kv_cache_utils = None  # only vLLM's kv_offload part is importable (kvoffload's tests)
    algo = _prefix_caching_hash_algo()
    if kv_cache_utils is None:
        why = vllm_compat.block_hashes_shareable(algo, os.environ, fixed_default_seed=False)
    else:
        why = vllm_compat.block_hash_sharing_problem(algo, kv_cache_utils=kv_cache_utils)
    if why is not None:
        logger.warning("%s: chunks this engine stores can be found only by this process: %s",
                       tier, why)


def run_identity(offloading_spec) -> dict:
    """What makes two engines' primary rows interchangeable, as vLLM's own storage tiers name it:
    vLLM's FileMapper run configuration (model, dtype, tokens per hash, blocks per chunk,
    parallel layout, KV-cache groups and their layers, replicated/canonical layout), with the
    same parallel-agnostic collapse as its fs tier."""
    from vllm.v1.kv_offload.file_mapper import FileMapper

    mapper = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=offloading_spec,
        blocks_per_file=int(offloading_spec.blocks_per_chunk),
        parallel_agnostic=True,
    )
    return mapper.get_run_config()


class _KvoffloadTier(SecondaryTierManager):
    """What both tiers share: jobs, results, events and statistics over a VllmTierCore."""

    medium: ClassVar[Medium] = Medium.STORAGE
    # Counter metrics: name -> (stats key, documentation); gauges likewise.
    _COUNTERS: ClassVar[dict[str, tuple[str, str]]] = {}
    _GAUGES: ClassVar[dict[str, tuple[str, str]]] = {}

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str, *,
                 enable_kv_events: bool, locality: Any, name: str | None):
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self._what = f"kvoffload {tier_type} tier"
        self.locality = _locality(locality, self._what)
        self.label = (str(name) if name else tier_type,)
        self.events: list[OffloadingEvent] | None = None
        if enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self.events = []
            else:
                logger.warning(
                    "%s: enable_kv_events is set but KV cache events are disabled globally; the "
                    "tier emits no events", self._what)
        assert primary_kv_view.strides is not None
        self._row_bytes = int(primary_kv_view.strides[0])
        self._core = None
        self._job_keys: dict[int, list[OffloadKey]] = {}
        self._refused: list[JobResult] = []  # jobs that never reached the tier
        self._reported: dict[str, int] = {}
        self._last_warning: dict[str, float] = {}

    # --- vLLM's SecondaryTierManager -------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return _LOOKUP[self._core.lookup(key)]

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=True)

    def _submit(self, job: TransferJob, load: bool) -> None:
        keys = list(job.keys)
        self._job_keys[job.job_id] = keys
        try:
            self._core.submit(job.job_id, load, keys, job.block_ids)
        except _ext.Error as err:
            # Never lose a job: vLLM releases its primary slots only when the job comes back.
            self._warn("refused", "%s: %s job %d was refused: %s", self._what,
                       "load" if load else "store", job.job_id, err)
            self._refused.append(JobResult(job_id=job.job_id, success=False, transfer_time=0.0))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = self._refused
        self._refused = []
        for job_id, is_load, ok, seconds, detail in self._core.poll():
            keys = self._job_keys.pop(job_id)
            if ok is None:
                succeeded = keys
                results.append(JobResult(job_id=job_id, success=True, transfer_time=seconds))
            else:
                succeeded = [keys[i] for i in ok]
                self._warn("load" if is_load else "store",
                           "%s: %s job %d: %d of %d blocks failed (first: %s)", self._what,
                           "load" if is_load else "store", job_id, len(keys) - len(succeeded),
                           len(keys), detail)
                results.append(JobResult(
                    job_id=job_id, success=False,
                    successful_keys=tuple(succeeded) if is_load and succeeded else None,
                    transfer_time=seconds))
            if not is_load and self.events is not None and succeeded:
                self.events.append(OffloadingEvent(keys=succeeded, medium=self.medium,
                                                   removed=False, locality=self.locality))
        return results

    def has_pending_work(self) -> bool:
        return self._core.pending > 0 or bool(self._refused)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is not None:
            yield from self.events
            self.events.clear()

    def drain_jobs(self) -> None:
        self._core.drain()

    def shutdown(self) -> None:
        core, self._core = self._core, _Closed(self._what)
        if core is not None and not isinstance(core, _Closed):
            core.close()

    # --- metrics ---------------------------------------------------------------------------

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        defs: dict[str, OffloadingMetricMetadata] = {}
        for metric, (_, doc) in cls._COUNTERS.items():
            defs[metric] = OffloadingCounterMetadata(documentation=doc, labelnames=("tier",))
        for metric, (_, doc) in cls._GAUGES.items():
            defs[metric] = OffloadingGaugeMetadata(documentation=doc, labelnames=("tier",))
        return defs

    def _stats(self) -> dict[str, int]:
        return self._core.stats()

    def get_stats(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        if isinstance(self._core, _Closed):
            return None
        now = self._stats()
        stats = OffloadingConnectorStats()
        for metric, (field, _) in self._COUNTERS.items():
            delta = now[field] - self._reported.get(field, 0)
            if delta:
                stats.increase_counter(metric, delta, self.label)
            self._reported[field] = now[field]
        for metric, (field, _) in self._GAUGES.items():
            stats.set_gauge(metric, now[field], self.label)
        return stats

    def stats(self) -> dict[str, int]:
        """The tier's cumulative counters (kvoffload's TierStats / RemoteStats)."""
        return self._stats()

    def _warn(self, kind: str, msg: str, *args) -> None:
        now = time.monotonic()
        if now - self._last_warning.get(kind, -_WARN_INTERVAL_S) >= _WARN_INTERVAL_S:
            self._last_warning[kind] = now
            logger.warning(msg, *args)


class _Closed:
    """Stands in for the core after shutdown(): any use says so."""

    pending = 0

    def __init__(self, what: str):
        self._what = what

    def __getattr__(self, name):
        raise _ext.Error(f"{self._what} is shut down")


def _reject_unknown(tier: str, unknown: dict, allowed: Iterable[str]) -> None:
    if unknown:
        raise ValueError(f"{tier}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")




class KvoffloadRemoteTier(_KvoffloadTier):
    """A Redis, Redis Cluster or memcached store shared by engines on several machines.

    Tier keys: ``url`` (required), ``namespace`` (optional: keeps deployments apart on one
    store), ``lookup_timeout_ms`` (50: how long a block's existence check may answer RETRY before
    it is a MISS), ``get_timeout_ms`` / ``put_timeout_ms`` (1000), ``connect_timeout_ms`` (200),
    ``connections_per_node`` (2), ``max_inflight_bytes`` (32 MiB per node), ``max_queued_bytes``,
    ``breaker_failures`` (2), ``breaker_backoff_ms`` (100), ``breaker_backoff_max_ms`` (5000),
    ``negative_ttl_ms`` (500), ``memcached_item_max`` (memcached's ``-I``, default 1 MiB),
    ``enable_kv_events``, ``locality``, ``name`` (the ``tier`` label of its metrics).

    One value per primary row (every rank's slot of a chunk), under
    ``kvo1:<fingerprint>:<key hash>:r``; the fingerprint hashes vLLM's run identity
    (:func:`run_identity`), the row size and the namespace.
    """

    _COUNTERS = {
        "kvoffload:remote_tier_stored_chunks": ("stored", "Chunks written to the remote store."),
        "kvoffload:remote_tier_loaded_chunks": ("loaded", "Chunks read back and verified."),
        "kvoffload:remote_tier_get_misses": (
            "get_misses", "Promotions that found no value (evicted, or a node restarted empty)."),
        "kvoffload:remote_tier_lookup_misses": (
            "lookup_absent", "Existence checks answered absent, including those whose budget ran "
            "out (lookup_timeout_ms)."),
        "kvoffload:remote_tier_corrupt_values": (
            "corrupt", "Values that failed verification (checksum, fingerprint, key, length): "
            "misses, never data."),
        "kvoffload:remote_tier_put_errors": (
            "put_errors", "Chunks not written: error, timeout, open circuit or a full send queue."),
        "kvoffload:remote_tier_get_errors": ("get_errors", "Chunks not read: error or timeout."),
        "kvoffload:remote_tier_lookup_errors": (
            "lookup_errors", "Existence checks that failed (answered absent)."),
        "kvoffload:remote_tier_breaker_opens": (
            "breaker_opens", "Times a store node's circuit opened (its chunks miss for a backoff)."),
    }
    _GAUGES = {
        "kvoffload:remote_tier_nodes_open": (
            "nodes_open", "Store nodes whose circuit is open now."),
    }

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str, *,
                 url: str | None = None, namespace: str = "", enable_kv_events: bool = False,
                 locality: str | None = None, name: str | None = None, **options: Any):
        super().__init__(offloading_spec, primary_kv_view, tier_type,
                         enable_kv_events=enable_kv_events, locality=locality, name=name)
        allowed = _remote_options.KEYS
        _reject_unknown(self._what, {k: v for k, v in options.items() if k not in allowed},
                        ["url", "namespace", "enable_kv_events", "locality", "name", *allowed])
        if not url:
            raise ValueError(f"{self._what}: 'url' is required (redis://host:port[/db], "
                             "redis-cluster://host:port[,host:port...] or "
                             "memcached://host:port[,host:port...])")
        identity = run_identity(offloading_spec)
        layout = json.dumps({"vllm": identity, "row_bytes": self._row_bytes,
                             "namespace": str(namespace)}, sort_keys=True, separators=(",", ":"))
        config = offloading_spec.config
        opts = _ext.RemoteTierOptions(
            str(url), slot_bytes=self._row_bytes, world_size=1, replicated=False,
            tensor_layout=layout, block_bytes=int(config.worker_kv_bytes_per_block),
            blocks_per_chunk=int(offloading_spec.blocks_per_chunk), dtype=str(config.model.dtype))
        _remote_options.apply(opts, options, self._what)
        opts.name = self.label[0]
        opts.validate()
        self.options = opts
        _warn_hash_seed(self._what)
        self._core = _ext.VllmTierCore.open_remote(primary_kv_view, self._row_bytes, opts)
        logger.info("%s: %s, fingerprint %016x, one value of %d bytes per chunk", self._what,
                    opts.url, opts.fingerprint, self._row_bytes)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        # The keys this step's lookups had no answer for: one batched existence check.
        self._core.flush_lookups()

    def _stats(self) -> dict[str, int]:
        return self._core.remote_stats()

    def store_key(self, key: OffloadKey) -> str:
        """The store key of a block's value (for operators' tools and tests)."""
        return self._core.store_key(key)


class KvoffloadFileTier(_KvoffloadTier):
    """A local directory of checksummed records, in place of vLLM's fs tier.

    Tier keys, as vLLM's fs tier: ``root_dir`` (required), ``n_read_threads`` (16: threads that
    serve loads first), ``n_write_threads`` (16: threads that serve stores first),
    ``enable_kv_events``, ``locality``; kvoffload's: ``capacity_bytes`` (default: the size of
    root_dir's filesystem; always capped by the records held plus its free space),
    ``direct_io`` (true: O_DIRECT where the filesystem takes it), ``fsync`` ("none" | "data" |
    "full"), ``name`` (the ``tier`` label of its metrics).

    Records live in ``<root_dir>/<model>_<digest>.kvoffload/`` (``_dp<index>`` appended for a
    data-parallel replica), ``<model>_<digest>`` being vLLM's run directory name (its fs tier's
    On-Disk Layout). One engine owns a directory (a second one is refused, naming it); a restarted
    engine indexes the records it finds there.
    """

    _COUNTERS = {
        "kvoffload:file_tier_evictions": (
            "evictions", "Records removed to stay within the capacity (or a full filesystem)."),
        "kvoffload:file_tier_corrupt_records": (
            "corrupt", "Records that failed verification on read: dropped, read as misses."),
        "kvoffload:file_tier_put_errors": ("puts_failed", "Records not written (I/O errors)."),
        "kvoffload:file_tier_get_errors": ("gets_failed", "Records not read (I/O errors)."),
    }
    _GAUGES = {
        "kvoffload:file_tier_records": ("entries", "Records held."),
        "kvoffload:file_tier_bytes": ("bytes", "Bytes the records occupy on disk."),
        "kvoffload:file_tier_capacity_bytes": (
            "capacity_bytes", "Bytes the tier may use now (configured, capped by the filesystem)."),
    }

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str, *,
                 root_dir: str | None = None, n_read_threads: int = 16, n_write_threads: int = 16,
                 capacity_bytes: int | None = None, direct_io: bool = True, fsync: str = "none",
                 enable_kv_events: bool = False, locality: str | None = None,
                 name: str | None = None, **unknown: Any):
        super().__init__(offloading_spec, primary_kv_view, tier_type,
                         enable_kv_events=enable_kv_events, locality=locality, name=name)
        _reject_unknown(self._what, unknown, [
            "root_dir", "n_read_threads", "n_write_threads", "capacity_bytes", "direct_io",
            "fsync", "enable_kv_events", "locality", "name"])
        if not root_dir:
            raise ValueError(f"{self._what}: 'root_dir' is required (the directory for records)")
        reads = _non_negative_int("n_read_threads", n_read_threads, self._what)
        writes = _non_negative_int("n_write_threads", n_write_threads, self._what)
        if not 1 <= reads + writes <= 256:
            raise ValueError(f"{self._what}: n_read_threads + n_write_threads = {reads + writes} "
                             "must be 1 to 256")
        from vllm.v1.kv_offload.file_mapper import FileMapper

        root_dir = os.path.abspath(os.path.expanduser(str(root_dir)))
        os.makedirs(root_dir, exist_ok=True)
        mapper = FileMapper.from_offloading_spec(
            root_dir=root_dir, offloading_spec=offloading_spec,
            blocks_per_file=int(offloading_spec.blocks_per_chunk), parallel_agnostic=True)
        parallel = offloading_spec.config.parallel
        directory = mapper.base_path + ".kvoffload"
        if int(parallel.data_parallel_size) > 1:
            directory += f"_dp{int(parallel.data_parallel_index)}"
        if capacity_bytes is None:
            capacity_bytes = shutil.disk_usage(root_dir).total
        capacity_bytes = _non_negative_int("capacity_bytes", capacity_bytes, self._what)
        _warn_hash_seed(self._what)
        self.root = directory
        self._core = _ext.VllmTierCore.open_file(
            primary_kv_view, self._row_bytes, directory, reads + writes, capacity_bytes,
            read_threads=reads, direct_io=bool(direct_io), fsync=str(fsync),
            name=self.label[0])
        try:
            config_path = os.path.join(directory, "config.json")
            if not os.path.exists(config_path):
                run = {**mapper.get_run_config(), "row_bytes": self._row_bytes,
                       "format": "kvoffload file tier records"}
                with open(config_path + ".tmp", "w") as f:
                    json.dump(run, f, indent=2, sort_keys=True)
                os.replace(config_path + ".tmp", config_path)
        except OSError as err:  # a full disk must not stop the engine: the config is informative
            logger.warning("%s: could not write %s/config.json: %s", self._what, directory, err)
        st = self._core.stats()
        logger.info("%s: %s, %d records (%d bytes) from a previous run, capacity %d bytes, %d "
                    "read + %d write threads, %s", self._what, directory, st["entries"],
                    st["bytes"], st["capacity_bytes"], reads, writes,
                    "O_DIRECT" if st["direct_io"] else "buffered")

    def record_path(self, key: OffloadKey) -> str:
        """Where a block's record lives (for operators' tools and tests)."""
        return self._core.record_path(key)


# Short names for "type": vLLM's factory resolves an out-of-tree tier as getattr(module, type),
# after its own registry (at 017e9f4448: example, fs, p2p, obj; python/tests checks that it has
# no "remote" or "file"). The class names work as "type" too.
remote = KvoffloadRemoteTier
file = KvoffloadFileTier  # noqa: A001 - the tier's name in vLLM's config
