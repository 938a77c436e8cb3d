# kvoffload.vllm.KvoffloadManager against vLLM's own CPUOffloadingManager (imported from the
# vLLM tree the harness runs), output by output, on random scheduler-like streams with LRU
# and ARC, store thresholds, failed and lenient stores, overlapping loads and resets; plus the
# individual behaviours, each also checked against vLLM's manager.
import random

import numpy as np
import pytest

import vllm_real

vllm_real.require()

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (  # noqa: E402
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

import kvoffload  # noqa: E402
from kvoffload.vllm import KvoffloadManager  # noqa: E402

CTX = ReqContext(req_id="r")


def key(i, group=0):
    # A vLLM OffloadKey: a 32-byte block hash plus the 4-byte group index.
    return make_offload_key(i.to_bytes(32, "little"), group)


def ids(spec):
    assert isinstance(spec, CPULoadStoreSpec)
    return spec.block_ids.tolist()


def same_store(a, b):
    """Asserts two prepare_store outputs are equal and returns the stored keys."""
    assert (a is None) == (b is None)
    if a is None:
        return []
    assert isinstance(a, PrepareStoreOutput)
    assert list(a.keys_to_store) == list(b.keys_to_store)
    assert ids(a.store_spec) == ids(b.store_spec)
    assert list(a.evicted_keys) == list(b.evicted_keys)
    return list(a.keys_to_store)


def event_tuples(events):
    out = []
    for e in events:
        assert isinstance(e, OffloadingEvent) and e.medium == Medium.CPU
        out.append((e.removed, list(e.keys)))
    return out


def stats_data(s):
    assert isinstance(s, OffloadingConnectorStats)
    return s.data


class Pair:
    """Runs every call on KvoffloadManager and on vLLM's CPUOffloadingManager and checks that the
    outputs are equal; returns ours."""

    def __init__(self, num_blocks, **kw):
        self.ours = KvoffloadManager(num_blocks, **kw)
        self.vllm = CPUOffloadingManager(num_blocks, **kw)

    def lookup(self, k):
        a, b = self.ours.lookup(k, CTX), self.vllm.lookup(k, CTX)
        assert a is b, (a, b)
        return a

    def touch(self, keys):
        self.ours.touch(keys, CTX)
        self.vllm.touch(keys, CTX)

    def prepare_load(self, keys):
        a, b = self.ours.prepare_load(keys, CTX), self.vllm.prepare_load(keys, CTX)
        assert ids(a) == ids(b)
        return ids(a)

    def complete_load(self, keys):
        self.ours.complete_load(keys, CTX)
        self.vllm.complete_load(keys, CTX)

    def prepare_store(self, keys):
        a, b = self.ours.prepare_store(keys, CTX), self.vllm.prepare_store(keys, CTX)
        same_store(a, b)
        return a

    def complete_store(self, keys, success=True):
        self.ours.complete_store(keys, CTX, success=success)
        self.vllm.complete_store(keys, CTX, success=success)

    def reset_cache(self):
        self.ours.reset_cache()
        self.vllm.reset_cache()

    def take_events(self):
        a, b = event_tuples(self.ours.take_events()), event_tuples(self.vllm.take_events())
        assert a == b
        return a

    def get_stats(self):
        a, b = stats_data(self.ours.get_stats()), stats_data(self.vllm.get_stats())
        assert a == b
        return a


def run_stream(policy, seed, num_blocks, steps, store_threshold=1, max_tracker_size=64_000, universe=400):
    rng = random.Random(seed)
    m = Pair(num_blocks, cache_policy=policy, enable_events=True, store_threshold=store_threshold,
             max_tracker_size=max_tracker_size)
    prompts = [[rng.randrange(universe) for _ in range(rng.randrange(4, 16))] for _ in range(30)]
    loads, stores = [], []  # in-flight (keys) of prepare_load / prepare_store
    counts = {"hit": 0, "pending": 0, "evicted": 0, "none": 0, "failed": 0, "resets": 0,
              "load_moves": 0}
    for _ in range(steps):
        op = rng.random()
        if op < 0.45:
            # A request: a shared prompt prefix plus a private tail.
            p = rng.choice(prompts)
            seq = p[: rng.randrange(1, len(p) + 1)] + [rng.randrange(universe) for _ in range(rng.randrange(0, 6))]
            keys = [key(i, rng.randrange(2)) if rng.random() < 0.05 else key(i) for i in seq]
            keys = list(dict.fromkeys(keys))  # a request never repeats a block
            hits = 0
            for k in keys:
                r = m.lookup(k)
                counts["pending"] += r == LookupResult.HIT_PENDING
                if r != LookupResult.HIT:
                    break
                hits += 1
            counts["hit"] += hits
            touched = keys if rng.random() < 0.8 else [key(rng.randrange(universe)) for _ in range(5)]
            m.touch(touched)
            if hits:
                m.prepare_load(keys[:hits])
                loads.append(keys[:hits])
            # vLLM offers the keys after the hit prefix, sometimes with already stored ones.
            offer = keys[hits:] if rng.random() < 0.7 else keys
            out = m.prepare_store(offer)
            counts["none"] += out is None
            counts["evicted"] += len(out.evicted_keys) if out is not None else 0
            if out is not None and out.keys_to_store:
                stores.append(list(out.keys_to_store))
        elif op < 0.6 and loads:
            ks = loads.pop(rng.randrange(len(loads)))
            counts["load_moves"] += 1
            m.complete_load(ks)
        elif op < 0.8 and stores:
            ks = stores.pop(rng.randrange(len(stores)))
            success = rng.random() < 0.8
            counts["failed"] += not success
            if rng.random() < 0.2:
                # vLLM skips keys that are not write-pending: unknown ones, repeats, ready ones.
                ks = ks + [key(rng.randrange(universe))] + ks[:1]
            m.complete_store(ks, success=success)
        elif op < 0.85:
            m.lookup(key(rng.randrange(universe)))
        elif op < 0.9:
            m.take_events()
        elif op < 0.95:
            m.get_stats()
        elif op < 0.955:
            # vLLM never completes a job from before a reset.
            m.reset_cache()
            loads.clear()
            stores.clear()
            counts["resets"] += 1
    m.take_events()
    m.get_stats()
    return counts


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(6))
def test_random_streams_match_cpu_offloading_manager(policy, seed):
    counts = run_stream(policy, seed, num_blocks=[12, 40, 97][seed % 3], steps=3000)
    # The stream must have exercised what it is meant to compare.
    assert counts["hit"] > 0 and counts["evicted"] > 0 and counts["failed"] > 0
    assert counts["none"] > 0 and counts["pending"] > 0 and counts["resets"] > 0
    assert counts["load_moves"] > 0


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(3))
def test_random_streams_with_store_threshold(policy, seed):
    counts = run_stream(policy, 100 + seed, num_blocks=30, steps=3000, store_threshold=2 + seed % 2,
                        max_tracker_size=50, universe=120)
    assert counts["hit"] > 0 and counts["evicted"] > 0


def test_block_ids_fresh_ascending_then_most_recently_freed_first():
    m = Pair(4, cache_policy="lru")
    out = m.prepare_store([key(1), key(2), key(3)])
    assert ids(out.store_spec) == [0, 1, 2]
    m.complete_store([key(1), key(2), key(3)], success=False)  # frees 0, 1, 2 in that order
    out = m.prepare_store([key(4), key(5), key(6)])
    # Never-used id 3 first, then the freed ones, most recently freed first.
    assert ids(out.store_spec) == [3, 2, 1]
    m.complete_store([key(4), key(5), key(6)])
    out = m.prepare_store([key(7), key(8)])
    assert ids(out.store_spec) == [3, 0] and out.evicted_keys == [key(4)]


def test_lru_block_reenters_at_the_recent_end_when_its_load_or_store_completes():
    # vLLM's LRU since 68567ef2df: a completed store or last load puts the block at the most
    # recent end, and touch moves only blocks that are evictable.
    m = Pair(3, cache_policy="lru", enable_events=True)
    m.prepare_store([key(1), key(2), key(3)])
    m.complete_store([key(3), key(1), key(2)])  # completion order sets recency: 3, 1, 2
    assert m.prepare_load([key(3)]) == [2]
    m.touch([key(3), key(1)])  # 3 is pinned: only 1 moves (to the recent end): 2, 1
    m.complete_load([key(3)])  # 3 re-enters at the recent end: 2, 1, 3
    out = m.prepare_store([key(4), key(5)])
    assert out.evicted_keys == [key(2), key(1)] and ids(out.store_spec) == [0, 1]
    m.complete_store([key(5), key(4)])
    assert m.take_events() == [
        (False, [key(3), key(1), key(2)]),
        (True, [key(2), key(1)]),
        (False, [key(5), key(4)]),
    ]
    assert m.take_events() == []


def test_pinned_and_protected_blocks_are_not_evicted():
    m = Pair(2, cache_policy="arc")
    m.prepare_store([key(1), key(2)])
    m.complete_store([key(1), key(2)])
    m.prepare_load([key(1)])
    # key 2 is offered again, so it is protected; key 1 is pinned: nothing can make room.
    assert m.prepare_store([key(2), key(3)]) is None
    out = m.prepare_store([key(3)])
    assert out.evicted_keys == [key(2)] and out.keys_to_store == [key(3)]
    assert m.lookup(key(3)) == LookupResult.HIT_PENDING
    assert m.lookup(key(2)) == LookupResult.MISS


def test_store_threshold_counts_lookups():
    m = Pair(8, store_threshold=2, max_tracker_size=2, enable_events=True)
    assert m.lookup(key(1)) == LookupResult.MISS
    out = m.prepare_store([key(1)])
    assert out.keys_to_store == []  # seen once, threshold 2
    m.lookup(key(1))
    m.lookup(key(2))
    m.lookup(key(3))  # tracker of 2 forgets the least recently looked up: key 1
    assert key(1) not in m.ours.counts and m.ours.counts.get(key(3)) == 1
    assert m.ours.counts[key(2)] == m.vllm.counts[key(2)] == 1
    assert m.prepare_store([key(1), key(2), key(3)]).keys_to_store == []
    m.lookup(key(3))
    assert m.prepare_store([key(1), key(2), key(3)]).keys_to_store == [key(3)]
    data = m.get_stats()
    assert data["data"][CPUOffloadingMetrics.STORES_SKIPPED] == {(): 1 + 3 + 2}
    assert m.get_stats()["data"][CPUOffloadingMetrics.STORES_SKIPPED] == {(): 0}
    with pytest.raises(TypeError, match="cannot list its keys"):
        list(m.ours.counts)


def test_stats_names_and_values():
    m = Pair(4, cache_policy="arc")
    m.lookup(key(1))
    m.prepare_store([key(1), key(2)])
    m.complete_store([key(1)])
    m.lookup(key(1))
    m.lookup(key(2))
    m.prepare_load([key(1)])
    reduced = m.ours.get_stats().reduce()
    assert reduced == {
        CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC: 0.5,
        CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC: 0.25,
        CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC: 0.25,
        f"{CPUOffloadingMetrics.CPU_ALLOCATION_SIZE}_count": 1,
        f"{CPUOffloadingMetrics.CPU_ALLOCATION_SIZE}_sum": 2,
    }
    m.vllm.get_stats()
    m.prepare_store([key(5), key(6), key(7)])  # no room: a failed allocation is still recorded
    assert m.get_stats()["data"][CPUOffloadingMetrics.CPU_ALLOCATION_SIZE] == {(): [3]}


def test_zero_blocks_as_vllm_sizes_a_tiny_cache():
    m = Pair(0, cache_policy="lru", enable_events=True)
    assert m.lookup(key(1)) == LookupResult.MISS
    assert m.prepare_store([key(1)]) is None
    assert m.prepare_store([]).keys_to_store == []
    m.touch([key(1)])
    m.reset_cache()
    assert m.get_stats()["data"][CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC] == {(): 0.0}


def test_interface_types_and_hooks():
    m = KvoffloadManager(num_blocks=2, cache_policy="LRU", enable_events=False)
    assert isinstance(m, OffloadingManager)
    assert m.medium == Medium.CPU
    assert m.counts is None  # as vLLM's without a threshold
    assert isinstance(m.on_new_request(CTX), RequestOffloadingContext)
    assert m.on_request_finished(CTX) is None
    out = m.prepare_store([key(1)], CTX)
    assert isinstance(out.store_spec, CPULoadStoreSpec) and out.store_spec.block_ids.dtype == np.int64
    empty = m.prepare_store([key(1)], CTX)
    assert empty.keys_to_store == [] and ids(empty.store_spec) == [] and empty.evicted_keys == []
    m.complete_store([key(1)], CTX)
    assert list(m.take_events()) == []  # events off
    m.reset_cache()
    assert m.lookup(key(1), CTX) == LookupResult.MISS
    assert ids(m.prepare_store([key(9)], CTX).store_spec) == [0]  # ids start over after a reset
    assert m.shutdown() is None


def test_constructor_refuses_bad_arguments():
    with pytest.raises(ValueError, match="cache_policy='lfu'"):
        KvoffloadManager(4, cache_policy="lfu")
    with pytest.raises(ValueError, match="cache_policy_module_path"):
        KvoffloadManager(4, cache_policy_module_path="my.policies")
    with pytest.raises(ValueError, match="num_blocks=-1"):
        KvoffloadManager(-1)
    with pytest.raises(ValueError, match="max_tracker_size=0"):
        KvoffloadManager(4, store_threshold=2, max_tracker_size=0)
    m = KvoffloadManager(4)
    with pytest.raises(kvoffload.Error, match="bytes object, got int") as e:
        m.lookup(5, CTX)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(kvoffload.Error, match="collection of keys, got one bytes key") as e:
        m.touch(key(1), CTX)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT


def test_result_objects_are_vllms_and_the_fast_path_checks_itself(monkeypatch):
    # Note [Plain result objects]: specs and outputs built without their constructors must be what
    # vLLM's constructors build; a constructor that does more turns the fast path off.
    import kvoffload.vllm.manager as kv_vllm

    new_array, plain_output = kv_vllm._plain_results()
    assert new_array is not None and plain_output
    m = KvoffloadManager(4)
    out = m.prepare_store([key(1), key(2)], CTX)
    ref = CPUOffloadingManager(4).prepare_store([key(1), key(2)], CTX)
    assert type(out) is type(ref) and vars(out).keys() == vars(ref).keys()
    assert type(out.store_spec) is CPULoadStoreSpec and vars(out.store_spec).keys() == {"block_ids"}
    a, b = out.store_spec.block_ids, ref.store_spec.block_ids
    assert a.dtype == b.dtype and a.flags.writeable and a.flags.c_contiguous and a.tolist() == b.tolist()

    class Richer(CPULoadStoreSpec):
        def __init__(self, block_ids):
            super().__init__(block_ids)
            self.extra = len(block_ids)

    monkeypatch.setattr(kv_vllm, "CPULoadStoreSpec", Richer)
    assert kv_vllm._check_plain_spec() is None


def test_stats_are_built_without_vllms_methods_only_while_that_gives_the_same_objects(monkeypatch):
    # Note [Stats without methods] in kvoffload/vllm/manager.py; the streams above compare every
    # get_stats with CPUOffloadingManager's.
    import kvoffload.vllm.manager as kv_vllm

    monkeypatch.setattr(kv_vllm, "_STATS_BUILDER", None)
    direct = kv_vllm._stats_builder()
    assert direct is not kv_vllm._stats_by_methods
    for sample in ((0.75, 0.5, 0.25, [2, 8, 1], None), (0.0, 0.0, 0.0, [], 4)):
        assert direct(*sample).data == kv_vllm._stats_by_methods(*sample).data
    # A vLLM whose stats record gauges differently: vLLM's own methods are used.
    original = OffloadingConnectorStats.set_gauge
    monkeypatch.setattr(OffloadingConnectorStats, "set_gauge",
                        lambda self, name, value, labelvalues=(): original(self, name, value, ("rank0",)))
    monkeypatch.setattr(kv_vllm, "_STATS_BUILDER", None)
    assert kv_vllm._stats_builder() is kv_vllm._stats_by_methods
    # ... and get_stats is not the C builder (Note [Stats in C]), whose check fails the same way.
    monkeypatch.setattr(kv_vllm, "_FAST_SETTINGS", None)
    assert kv_vllm._stats_template() is None
    m = KvoffloadManager(4)
    assert "get_stats" not in vars(m)
    assert m.get_stats().data["data"][CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC] == {("rank0",): 0.0}


def test_get_stats_and_the_hooks_are_c_functions_giving_what_vllms_give():
    # Note [Fast entry points], Note [Stats in C]: vLLM calls these once per request or per step;
    # they run in C where vLLM's types allow, and give what CPUOffloadingManager gives (the random
    # streams above compare every get_stats and take_events).
    import kvoffload.vllm.manager as kv_vllm

    m = KvoffloadManager(4, enable_events=True, store_threshold=2)
    ref = CPUOffloadingManager(4, enable_events=True, store_threshold=2)
    settings = kv_vllm._fast_settings()
    assert settings["stats_template"] is not None and settings["context_fields"] is not None
    c_function = type(len)
    fast = ["lookup", "touch", "prepare_load", "complete_load", "prepare_store", "complete_store",
            "on_new_request", "on_request_finished", "take_events", "get_stats",
            *settings["step_hooks"]]
    assert all(type(vars(m)[name]) is c_function for name in fast), vars(m).keys()
    a, b = m.on_new_request(CTX), ref.on_new_request(CTX)
    assert type(a) is type(b) and vars(a) == vars(b) and a == b and a is not m.on_new_request(CTX)
    assert m.on_request_finished(CTX) is None
    if hasattr(OffloadingManager, "has_pending_work"):  # 7cfb97e3 on
        assert settings["step_hooks"] == ["on_schedule_end", "has_pending_work"]
        assert m.has_pending_work() is False and m.on_schedule_end(None) is None
    for _ in range(2):
        for mgr in (m, ref):
            mgr.lookup(key(1), CTX)
            out = mgr.prepare_store([key(1), key(2)], CTX)
            mgr.complete_store(out.keys_to_store, CTX)
        assert event_tuples(m.take_events()) == event_tuples(ref.take_events())
        assert list(m.take_events()) == []
        a, b = m.get_stats(), ref.get_stats()
        assert type(a) is type(b) and vars(a) == vars(b)
    assert m.allocation_sizes_in_current_batch == []
    # Through the class (super()): the same C function, so the skipped counter is not counted twice.
    assert KvoffloadManager.get_stats(m).data == ref.get_stats().data


def test_a_subclass_keeps_its_overrides_of_the_fast_methods():
    class Mine(KvoffloadManager):
        def on_new_request(self, req_context):
            return "mine"

        def get_stats(self):
            return "my stats"

    m = Mine(4)
    assert m.on_new_request(CTX) == "mine" and m.get_stats() == "my stats"
    assert type(vars(m)["lookup"]) is type(len)


def test_the_fast_occupancy_read_is_the_cores_counters():
    m = KvoffloadManager(4, cache_policy="lru", store_threshold=2)
    ctx = ReqContext(req_id="occupancy")
    m.lookup(key(1), ctx)
    m.lookup(key(1), ctx)
    m.prepare_store([key(1), key(2), key(3)], ctx)  # key(1) seen twice: stored; 2 and 3 skipped
    m.complete_store([key(1)], ctx)
    m.prepare_store([key(1)], ctx)
    m.prepare_load([key(1)], ctx)
    assert m._occupancy() == m._core.counters()
    pending, pinned, skipped = m._occupancy()
    assert pinned == 1 and skipped >= 2, (pending, pinned, skipped)
    with pytest.raises(TypeError, match=r"_occupancy\(\) takes no arguments, got 1"):
        m._occupancy(1)
