"""kvoffload.sglang's ``"kvoffload_backend": "pool"``: the node pool as the L3 of every SGLang
instance of a model on the node (docs/DESIGN.md sections 6.6 and 9.5).

:class:`PoolStoreCore` has the store core's interface KvoffloadStorage calls (exists, get, put,
clear, stats, take_last_failure, close) over one :class:`kvoffload.NodePool`: one chunk per page,
its pieces back to back. The pool is named by the page identity (model, host pool type, layout,
dtype, page size, MLA, PP / attention-CP / TP rank and size, geometry, namespace), which is also
its fingerprint, so two models or two TP layouts never meet; every instance with the same
identity attaches the same pool, and a killed instance's pins and half-written pages are repaired
away by the pool while its committed pages stay served.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import threading
from typing import List

from . import _kvoffload as _ext


# Tenant names: one per backend instance (a process may hold several, as tests do).
_instances = itertools.count()


def pool_name(identity: str) -> str:
    return "sglang-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


class PoolStoreCore:
    """A page store over the node pool: keys are SGLang's page hashes with a call tag."""

    def __init__(self, identity: str, *, page_bytes: int, capacity_bytes: int, shm_dir: str = "",
                 engine_id: str | None = None, cap_fraction: float = 0.0):
        slot_count = int(capacity_bytes) // int(page_bytes)
        if slot_count < 1:
            raise ValueError(f"kvoffload.sglang (pool): capacity_bytes={capacity_bytes} holds no "
                             f"page of {page_bytes} bytes")
        self.page_bytes = int(page_bytes)
        self.name = pool_name(identity)
        self._salt = hashlib.sha256(identity.encode()).digest()
        self._pool = _ext.NodePool.attach(
            self.name, engine_id or f"sglang-{os.getpid()}-{next(_instances)}", slot_bytes=self.page_bytes,
            slot_count=slot_count, world_size=1, layout="sglang-page", dtype="bytes",
            fingerprint=hashlib.sha256(identity.encode()).hexdigest(), shm_dir=shm_dir,
            cap_fraction=cap_fraction)
        self._last_failure = ""
        # Copies run with the GIL released; close() waits for them before detaching (which
        # unmaps the chunks they copy).
        self._copies = 0
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def _copying(self):
        with self._idle:
            if not self._pool.attached:
                raise RuntimeError(f"kvoffload.sglang (pool): {self.name} is closed")
            self._copies += 1
        try:
            yield
        finally:
            with self._idle:
                self._copies -= 1
                self._idle.notify_all()

    @property
    def pool(self):
        return self._pool

    def _key(self, key: str, tag: int, nbytes: int) -> int:
        h = hashlib.blake2b(f"{tag}/{nbytes}/{key}".encode(), digest_size=16, key=self._salt[:32])
        return int.from_bytes(h.digest(), "little")

    @staticmethod
    def _per_key(keys, ptrs, sizes):
        n = len(keys)
        if n == 0 or len(ptrs) % n or len(ptrs) != len(sizes):
            raise ValueError(f"{len(ptrs)} buffers ({len(sizes)} sizes) for {n} pages")
        per = len(ptrs) // n
        return [(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per]) for i in range(n)]

    def exists(self, keys: List[str], pieces: int, piece_bytes: int, tag: int, budget_ms: int) -> int:
        nbytes = int(pieces) * int(piece_bytes)
        return int(self._pool.lookup([self._key(k, tag, nbytes) for k in keys]).hits)

    def get(self, keys: List[str], ptrs, sizes, tag: int) -> List[bool]:
        parts = self._per_key(keys, ptrs, sizes)
        totals = [sum(int(s) for s in ks) for _, ks in parts]
        pkeys = [self._key(k, tag, t) for k, t in zip(keys, totals)]
        # One lookup pins the ready prefix (SGLang loads what batch_exists found: usually every
        # page); a page after the first miss is looked up on its own.
        first = self._pool.lookup(pkeys, pin=True)
        slot_of = dict(zip(range(first.hits), first.slots))
        pinned = list(first.slots)
        try:
            for i in range(first.hits + 1, len(keys)):
                got = self._pool.lookup([pkeys[i]], pin=True)
                if got.hits:
                    slot_of[i] = got.slots[0]
                    pinned.append(got.slots[0])
            load = [i for i in sorted(slot_of) if totals[i] <= self.page_bytes]
            with self._copying():
                _ext.sglang_pool_copy(self._pool, [slot_of[i] for i in load],
                                      [p for i in load for p in parts[i][0]],
                                      [s for i in load for s in parts[i][1]], to_pool=False)
        finally:
            self._pool.unpin(pinned)
        out = [False] * len(keys)
        for i in load:
            out[i] = True
        return out

    def put(self, keys: List[str], ptrs, sizes, tag: int) -> List[bool]:
        parts = self._per_key(keys, ptrs, sizes)
        totals = [sum(int(s) for s in ks) for _, ks in parts]
        fits = [i for i, t in enumerate(totals) if t <= self.page_bytes]
        if len(fits) < len(keys):
            self._last_failure = (f"pages of {max(totals)} bytes do not fit the pool's "
                                  f"{self.page_bytes}-byte chunks")
        pkeys = [self._key(keys[i], tag, totals[i]) for i in fits]
        plan = self._pool.prepare_stores(pkeys)
        try:
            store = [parts[fits[pos]] for pos in plan.positions]
            with self._copying():
                _ext.sglang_pool_copy(self._pool, list(plan.slots),
                                      [p for kp, _ in store for p in kp],
                                      [s for _, ks in store for s in ks], to_pool=True)
        except BaseException:
            self._pool.abort_stores(list(plan.slots))
            raise
        self._pool.commit_stores(list(plan.slots))
        ok = [False] * len(keys)
        stored = {fits[p] for p in plan.positions}
        for j, i in enumerate(fits):
            # Not allocated: already ready (another instance's) is stored; no room is not.
            ok[i] = i in stored or bool(self._pool.lookup([pkeys[j]]).hits)
        if plan.skipped_no_room or plan.skipped_cap:
            self._last_failure = (f"the node pool is full ({plan.skipped_no_room} pages without "
                                  f"room, {plan.skipped_cap} over this instance's cap)")
        return ok

    def take_last_failure(self) -> str:
        why, self._last_failure = self._last_failure, ""
        return why

    def clear(self) -> None:
        # The pool is shared: the pages stay for the other instances; its LRU ages them out.
        return None

    def stats(self):
        s = self._pool.stats()
        mine = next((t for t in s["tenants"] if t["index"] == self._pool.tenant_index), {})
        st = {"entries": s["ready"], "bytes": s["ready"] * self.page_bytes,
              "capacity_bytes": s["slot_count"] * self.page_bytes,
              "hits": mine.get("hits", 0), "cross_instance_hits": mine.get("cross_engine_hits", 0),
              "stores": mine.get("stores_committed", 0), "evictions": mine.get("evictions", 0)}
        return [("pool", self.name, st)]

    def close(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._copies == 0)
            self._pool.detach()
