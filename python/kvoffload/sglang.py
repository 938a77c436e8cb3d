"""kvoffload as a HiCache storage backend (L3) of SGLang.

SGLang loads it as a dynamic backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvoffload",
            "module_path": "kvoffload.sglang", "class_name": "KvoffloadStorage",
            "interface_v1": 1, "kvoffload_backend": "remote", "url": "redis://10.0.0.5:6379"}'

``kvoffload_backend`` selects the store:

- ``"remote"`` with ``url``: ``redis://``, ``rediss://``, ``redis-cluster://``, ``memcached://``
  (kvoffload's remote tier), shared by every instance that reaches the store. Every remote-tier
  option is a key (``lookup_timeout_ms``, ``get_timeout_ms``, ``put_timeout_ms``,
  ``connect_timeout_ms``, ``connections_per_node``, ...; see kvoffload._remote_options), plus
  ``namespace`` (keeps deployments apart on one store).
- ``"file"`` with ``root_dir``: kvoffload's file tier, one directory per model and parallel layout
  under root_dir, shared by every instance (process) that opens it: a page one instance stored
  is a hit for the others (their indexes pick it up on first use; the ranks of an MLA model with
  tensor parallelism share one directory, rank 0 writing); capped (``capacity_bytes``, per
  instance, and never more than the filesystem holds: a full disk evicts the oldest pages),
  re-indexed when an instance restarts; ``io_threads``, ``read_threads``, ``direct_io``,
  ``fsync``.
- ``"pool"`` with ``capacity_bytes``: kvoffload's node pool as the L3 shared by every instance of
  the model on the node (``kvoffload.sglang_pool``; optional ``shm_dir``, ``cap_fraction``); the
  pages are copied between SGLang's host pool and the pool's chunks in C++, GIL released.

What every call promises SGLang (whose storage threads die on an exception, switching L3 off for
the life of the process): it returns within the remote tier's deadlines (an existence check or
a load at most :data:`MAX_CALL_MS`, SGLang's smallest prefetch budget; a backup within
``put_timeout_ms``), even when the store is dead or frozen;
a failure is a miss (``False`` / a shorter hit count / ``None`` from the legacy ``get``), never an
exception and never ``None`` from a v1 call. Pages are checksummed and carry their key and
layout: a damaged or foreign value is a miss. Keys carry the model, the parallel layout (TP rank
and size, PP, attention CP), the page size, the host layout, the dtype and the geometry, so two
models or two TP layouts never read each other's pages; an MLA model's pages (identical on every
TP rank) are shared by all ranks, written by rank 0 only.

The zero-copy calls (``interface_v1: 1``) read and write the host pool's pages in place
(``get_page_buffer_meta``: layouts ``page_first`` and ``page_first_direct``); with
``interface_v1: 0`` SGLang copies flat pages through the legacy ``batch_get`` / ``batch_set``,
which it also uses for draft (MTP/EAGLE) pages in either mode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from . import _kvoffload as _ext
from . import _remote_options

__all__ = ["KvoffloadStorage", "MAX_CALL_MS"]

logger = logging.getLogger(__name__)

# SGLang's prefetch budget is base + per_ki_token x tokens / 1024 (2 s + 0.1 s by default); a call
# covers at most 128 pages. No single deadline of a call may exceed the base.
MAX_CALL_MS = 2000

# Piece tags (Note [Pages and pieces] in python/src/sglang_store.cpp): the zero-copy pieces of a
# page, and the flat pages of the legacy calls (their own keys: the bytes differ).
_V1_TAG = 0
_LEGACY_TAG = 0x80

# Keys of the extra config that SGLang itself reads (the factory's, the controller's and the
# radix cache's), left alone.
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
                "prefetch_timeout_base", "prefetch_timeout_per_ki_token", "prefetch_timeout_max",
                "hicache_storage_pass_prefix_keys", "tp_lcm_size")
_V1_LAYOUTS = ("page_first", "page_first_direct")
# Lookups and gets run inside SGLang's prefetch budget, so each is capped by its smallest value
# (_BOUNDED_MS); puts run on SGLang's backup thread, which has no budget (a backup that times out
# is retried by a later write), so put_timeout_ms only bounds how long that thread waits.
_REMOTE_DEFAULTS_MS = {"lookup_timeout_ms": 500, "get_timeout_ms": 2000, "put_timeout_ms": 5000}
_BOUNDED_MS = ("connect_timeout_ms", "lookup_timeout_ms", "get_timeout_ms")
_REMOTE_KEYS = ("url", "namespace", *_remote_options.KEYS)
_FILE_KEYS = ("root_dir", "namespace", "capacity_bytes", "io_threads", "read_threads",
              "direct_io", "fsync")
_POOL_KEYS = ("capacity_bytes", "namespace", "shm_dir", "cap_fraction")
_BACKENDS = ("remote", "file", "pool")
_WARN_INTERVAL_S = 10.0
# Geometry attributes of SGLang's host pools that shape a page's bytes.
_GEOMETRY_ATTRS = ("layer_num", "start_layer", "end_layer", "head_num", "head_dim",
                   "v_head_dim", "kv_lora_rank", "qk_rope_head_dim")


def _what(backend: str) -> str:
    return f"kvoffload.sglang ({backend})"


class KvoffloadStorage(HiCacheStorage):
    """SGLang HiCache storage backend over kvoffload's remote tier, file tier or node pool
    (module doc)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {})
        backend = extra.get("kvoffload_backend")
        if backend not in _BACKENDS:
            raise ValueError(
                f"kvoffload.sglang: kvoffload_backend={backend!r} must be one of "
                f"{list(_BACKENDS)} (in --hicache-storage-backend-extra-config)")
        self._what = _what(backend)
        self.backend = backend
        self.config = storage_config
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        own = {k: v for k, v in extra.items() if k not in _SGLANG_KEYS and k != "kvoffload_backend"}
        allowed = {"remote": _REMOTE_KEYS, "file": _FILE_KEYS, "pool": _POOL_KEYS}[backend]
        unknown = sorted(k for k in own if k not in allowed)
        if unknown:
            raise ValueError(f"{self._what}: unknown keys {unknown}; allowed: {sorted(allowed)}")
        self._options = own
        self._namespace = str(own.get("namespace", ""))
        # MLA pages are the same on every TP rank: rank 0 writes them, every rank reads them
        # (SGLang's controller skips the backup on the other ranks too).
        self.writes = not (storage_config.is_mla_model and storage_config.tp_rank != 0)
        self._check_options()
        self.mem_pool_host = None
        self._core = None
        self._closed = False
        self._lock = threading.Lock()
        self._last_warning: dict[str, float] = {}
        self._metrics = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                         "backup_bandwidth": []}
        self.identity: dict = {}
        self.root: Optional[str] = None

    # --- configuration ----------------------------------------------------------------------

    def _check_options(self) -> None:
        o = self._options
        if self.backend == "remote":
            if not o.get("url"):
                raise ValueError(f"{self._what}: 'url' is required (redis://host:port[/db], "
                                 "redis-cluster://host:port[,host:port...] or "
                                 "memcached://host:port[,host:port...])")
            for key in _remote_options.KEYS:
                if key in o:
                    _remote_options.non_negative_int(key, o[key], self._what)
            for key in _BOUNDED_MS:
                value = o.get(key, _REMOTE_DEFAULTS_MS.get(key, 0))
                if value > MAX_CALL_MS:
                    raise ValueError(
                        f"{self._what}: {key}={value} exceeds {MAX_CALL_MS} ms, SGLang's "
                        "smallest prefetch budget (each call must return within it)")
        elif self.backend == "pool":
            if not o.get("capacity_bytes"):
                raise ValueError(f"{self._what}: 'capacity_bytes' is required (the node pool's "
                                 "size, the same in every instance)")
            _remote_options.non_negative_int("capacity_bytes", o["capacity_bytes"], self._what)
            fraction = o.get("cap_fraction", 0.0)
            if not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
                raise ValueError(f"{self._what}: cap_fraction={fraction!r} must be a number in "
                                 "[0, 1) (0: no per-instance cap)")
        else:
            if not o.get("root_dir"):
                raise ValueError(f"{self._what}: 'root_dir' is required (the directory of the "
                                 "page records)")
            for key in ("capacity_bytes", "io_threads", "read_threads"):
                if key in o:
                    _remote_options.non_negative_int(key, o[key], self._what)
            if o.get("fsync", "none") not in ("none", "data", "full"):
                raise ValueError(f"{self._what}: fsync={o['fsync']!r} must be one of 'none', "
                                 "'data', 'full'")
            if not isinstance(o.get("direct_io", True), bool):
                raise ValueError(f"{self._what}: direct_io={o['direct_io']!r} must be true or "
                                 "false")

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Opens the store for this host pool: its geometry names the pages (the factory calls
        this right after construction, SGLang's controller again; a second call with the same
        pool keeps the store)."""
        if self._core is not None and mem_pool_host is self.mem_pool_host:
            return
        if self._core is not None:
            raise ValueError(f"{self._what}: a second host pool; one backend serves one pool")
        layout = getattr(mem_pool_host, "layout", None)
        if self.interface_v1 and layout not in _V1_LAYOUTS:
            raise ValueError(
                f"{self._what}: interface_v1 with the host layout {layout!r}; the zero-copy "
                f"calls support {list(_V1_LAYOUTS)} (or set interface_v1 to 0)")
        super().register_mem_pool_host(mem_pool_host)
        ps = int(mem_pool_host.page_size)
        # What one page's pieces are (get_page_buffer_meta of one page) and its flat copy.
        probe = torch.arange(0, ps, dtype=torch.int64)
        ptrs, sizes = mem_pool_host.get_page_buffer_meta(probe) if self.interface_v1 else ([], [])
        self.pieces = len(ptrs) if self.interface_v1 else 1
        self.piece_bytes = int(sizes[0]) if self.interface_v1 else self._flat_page_bytes()
        self.identity = self._identity(mem_pool_host)
        text = json.dumps(self.identity, sort_keys=True, separators=(",", ":"))
        if self.backend == "remote":
            self._core = self._open_remote(text)
        elif self.backend == "pool":
            self._core = self._open_pool(text)
        else:
            self._core = self._open_file(text)

    def _flat_page_bytes(self) -> int:
        page = self.mem_pool_host.get_dummy_flat_data_page()
        return int(page.numel() * page.element_size())

    def _identity(self, pool) -> dict:
        cfg = self.config
        ident = {
            "engine": "sglang",
            "model": cfg.model_name or "",
            "pool": type(pool).__name__,
            "layout": pool.layout,
            "dtype": str(pool.dtype),
            "page_size": int(pool.page_size),
            "mla": bool(cfg.is_mla_model),
            "pp": [cfg.pp_rank, cfg.pp_size],
            "cp": [cfg.attn_cp_rank, cfg.attn_cp_size],
            "geometry": {a: int(getattr(pool, a)) for a in _GEOMETRY_ATTRS
                         if isinstance(getattr(pool, a, None), int)},
            "namespace": self._namespace,
        }
        if not cfg.is_mla_model:
            ident["tp"] = [cfg.tp_rank, cfg.tp_size]
        return ident

    def _open_remote(self, identity: str):
        o = self._options
        opts = _ext.RemoteTierOptions(str(o["url"]), slot_bytes=self.piece_bytes, world_size=1,
                                      replicated=False, tensor_layout=identity,
                                      dtype=self.identity["dtype"])
        for key, value in _REMOTE_DEFAULTS_MS.items():
            setattr(opts, key, value)
        _remote_options.apply(opts, o, self._what)
        opts.name = "sglang"
        opts.validate()
        self.url = opts.url  # credentials redacted
        core = _ext.SglangStoreCore.open_remote(opts)
        core.prepare(self.piece_bytes)
        logger.info("%s: %s, %s pages of %d x %d bytes, fingerprint %016x", self._what,
                    opts.url, "zero-copy" if self.interface_v1 else "flat", self.pieces,
                    self.piece_bytes, opts.fingerprint)
        return core

    def _open_pool(self, identity: str):
        from .sglang_pool import PoolStoreCore

        o = self._options
        core = PoolStoreCore(identity, page_bytes=self.pieces * self.piece_bytes,
                             capacity_bytes=int(o["capacity_bytes"]),
                             shm_dir=str(o.get("shm_dir", "")),
                             cap_fraction=float(o.get("cap_fraction", 0.0)))
        logger.info("%s: node pool %s (%s), pages of %d x %d bytes", self._what, core.name,
                    core.pool.path, self.pieces, self.piece_bytes)
        return core

    def _open_file(self, identity: str):
        o = self._options
        root = os.path.abspath(os.path.expanduser(str(o["root_dir"])))
        os.makedirs(root, exist_ok=True)
        model = re.sub(r"[^A-Za-z0-9._-]+", "-", self.config.model_name or "model").strip("-")
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        directory = os.path.join(root, f"{model or 'model'}_{digest}.kvoffload")
        capacity = o.get("capacity_bytes") or shutil.disk_usage(root).total
        threads = o.get("io_threads", 16)
        core = _ext.SglangStoreCore.open_file(
            directory, io_threads=threads, read_threads=o.get("read_threads", threads // 2),
            capacity_bytes=capacity, direct_io=o.get("direct_io", True),
            fsync=o.get("fsync", "none"))
        self.root = directory
        try:
            path = os.path.join(directory, "config.json")
            if not os.path.exists(path):
                tmp = f"{path}.{os.getpid()}.tmp"  # instances sharing the directory may race
                with open(tmp, "w") as f:
                    json.dump({"sglang": self.identity, "format": "kvoffload file tier records"},
                              f, indent=2, sort_keys=True)
                os.replace(tmp, path)
        except OSError as err:  # informative only: a full disk must not stop the server
            logger.warning("%s: could not write %s/config.json: %s", self._what, directory, err)
        (_, _, st), = core.stats()
        logger.info("%s: %s, %d records (%d bytes) from a previous run, capacity %d bytes",
                    self._what, directory, st["entries"], st["bytes"], st["capacity_bytes"])
        return core

    # --- zero-copy calls (interface_v1) -------------------------------------------------------

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many pages from the first are held (SGLang stops its prefetch at the first miss)."""
        if not keys:
            return 0
        try:
            tag = _V1_TAG if self.interface_v1 else _LEGACY_TAG
            return int(self._live().exists(list(keys), self.pieces, self.piece_bytes, tag,
                                           self._lookup_budget_ms()))
        except Exception as err:  # noqa: BLE001 - SGLang's thread must not see it
            self._warn("exists", "%s: existence check failed, answered as misses: %s", err)
            return 0

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._v1(keys, host_indices, load=True)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not self.writes:
            return [True] * len(keys)  # rank 0 writes the same MLA pages
        return self._v1(keys, host_indices, load=False)

    def _v1(self, keys, host_indices, load: bool) -> List[bool]:
        n = len(keys)
        if n == 0:
            return []
        try:
            core = self._live()
            ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            start = time.perf_counter()
            ok = (core.get if load else core.put)(list(keys), ptrs, sizes, _V1_TAG)
            self._record(load, sum(ok), sum(sizes) * sum(ok) / n, time.perf_counter() - start)
            self._warn_failure(core, "batch_get_v1" if load else "batch_set_v1", ok)
            return ok
        except Exception as err:  # noqa: BLE001 - SGLang's thread must not see it
            self._warn("get" if load else "set", "%s: %s of %d pages failed, answered as %s: %s",
                       "batch_get_v1" if load else "batch_set_v1", n,
                       "misses" if load else "not stored", err)
            return [False] * n

    # --- legacy calls (flat pages; draft pages; interface_v1: 0) -----------------------------

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        n = len(keys)
        if n == 0:
            return []
        if target_locations is None or len(target_locations) != n:
            self._warn("legacy", "%s: batch_get needs one target tensor per key (%d keys, %s)",
                       n, None if target_locations is None else len(target_locations))
            return [None] * n
        try:
            core = self._live()
            bufs = [t if t.is_contiguous() else t.contiguous() for t in target_locations]
            start = time.perf_counter()
            ok = core.get(list(keys), [b.data_ptr() for b in bufs],
                          [b.numel() * b.element_size() for b in bufs], _LEGACY_TAG)
            self._warn_failure(core, "batch_get", ok)
            out = []
            for t, b, hit in zip(target_locations, bufs, ok):
                if hit and b is not t:
                    t.copy_(b)
                out.append(t if hit else None)
            self._record(True, sum(ok), sum(b.numel() * b.element_size()
                                            for b, hit in zip(bufs, ok) if hit),
                         time.perf_counter() - start)
            return out
        except Exception as err:  # noqa: BLE001
            self._warn("get", "%s: batch_get of %d pages failed, answered as misses: %s", n, err)
            return [None] * n

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        n = len(keys)
        if n == 0:
            return True
        if values is None or len(values) != n:
            self._warn("legacy", "%s: batch_set needs one value tensor per key (%d keys, %s)",
                       n, None if values is None else len(values))
            return False
        if not self.writes:
            return True
        try:
            core = self._live()
            bufs = [v.contiguous() for v in values]
            start = time.perf_counter()
            ok = core.put(list(keys), [b.data_ptr() for b in bufs],
                          [b.numel() * b.element_size() for b in bufs], _LEGACY_TAG)
            self._warn_failure(core, "batch_set", ok)
            self._record(False, sum(ok), sum(b.numel() * b.element_size()
                                             for b, hit in zip(bufs, ok) if hit),
                         time.perf_counter() - start)
            return all(ok)
        except Exception as err:  # noqa: BLE001
            self._warn("set", "%s: batch_set of %d pages failed: %s", n, err)
            return False

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # --- control ------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forgets the stored pages: the file backend removes the records of its directory (every
        instance's that shares it, as SGLang's HiCacheFile clears its directory); the remote
        backend drops what it remembers of the store (the values stay: other instances share
        them, and the store's own eviction ages them out)."""
        try:
            core = self._live()
            core.clear()
            if self.backend == "remote":
                core.prepare(self.piece_bytes)  # connected again before the next page comes
        except Exception as err:  # noqa: BLE001 - SGLang logs a failed clear as an error anyway
            self._warn("clear", "%s: clear failed: %s", err)

    def get_stats(self):
        """SGLang's StorageMetrics of the calls since the last get_stats (pages per call, GB/s),
        when SGLang runs with storage metrics on."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            return None
        metrics = StorageMetrics()
        with self._lock:
            for name, values in self._metrics.items():
                getattr(metrics, name).extend(values)
                values.clear()
        return metrics

    def stats(self) -> dict:
        """kvoffload's cumulative counters of the store, summed over its tiers."""
        total: dict = {}
        for _, _, st in self._live().stats():
            for k, v in st.items():
                total[k] = total.get(k, 0) + v if not isinstance(v, bool) else v
        return total

    def store_key(self, key: str, piece: int = 0) -> str:
        """The remote store's key of one piece of a page (operators' tools and tests)."""
        tag = _V1_TAG if self.interface_v1 else _LEGACY_TAG
        return self._live().store_key(key, tag, piece, self.piece_bytes)

    def record_path(self, key: str, piece: int = 0) -> str:
        """Where the file backend keeps one piece of a page (operators' tools and tests)."""
        tag = _V1_TAG if self.interface_v1 else _LEGACY_TAG
        return self._live().record_path(key, tag, piece)

    def close(self) -> None:
        if self._core is not None and not self._closed:
            self._closed = True
            self._core.close()

    # --- helpers ------------------------------------------------------------------------------

    def _live(self):
        if self._core is None:
            raise RuntimeError(f"{self._what}: no host pool registered yet")
        if self._closed:
            raise RuntimeError(f"{self._what}: closed")
        return self._core

    def _lookup_budget_ms(self) -> int:
        if self.backend != "remote":
            return 0
        return min(MAX_CALL_MS, int(self._options.get(
            "lookup_timeout_ms", _REMOTE_DEFAULTS_MS["lookup_timeout_ms"])) + 50)

    def _record(self, load: bool, pages: int, nbytes: float, seconds: float) -> None:
        if not self.config.enable_storage_metrics or pages == 0:
            return
        side = "prefetch" if load else "backup"
        with self._lock:
            self._metrics[f"{side}_pgs"].append(pages)
            self._metrics[f"{side}_bandwidth"].append(nbytes / max(seconds, 1e-9) / (1 << 30))

    def _warn_failure(self, core, call: str, ok: List[bool]) -> None:
        """A call whose pages failed for an error (not a miss): say why, rate-limited."""
        why = core.take_last_failure()
        if why:
            self._warn(call, "%s: %s: %d of %d pages failed (last: %s)", call,
                       ok.count(False), len(ok), why)

    def _warn(self, kind: str, msg: str, *args) -> None:
        now = time.monotonic()
        if now - self._last_warning.get(kind, -_WARN_INTERVAL_S) >= _WARN_INTERVAL_S:
            self._last_warning[kind] = now
            logger.warning(msg, self._what, *args)
