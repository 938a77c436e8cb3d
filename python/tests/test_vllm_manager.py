# kvoffload.vllm.KvoffloadManager against a reference model of vLLM's CPUOffloadingManager
# (vllm_reference.py), output by output, on random scheduler-like streams; plus the individual
# behaviours the issue names. vLLM itself is replaced by the stand-in in vllm_standin/.
import os
import random
import subprocess
import sys

import numpy as np
import pytest

STANDIN = os.path.join(os.path.dirname(__file__), "vllm_standin")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)

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

import kvoffload  # noqa: E402
from kvoffload.vllm import KvoffloadManager  # noqa: E402
from vllm_reference import ReferenceManager  # noqa: E402

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


def stats_of(s):
    return s.gauges, s.histograms, s.counters


def both(policy, num_blocks, **kw):
    return KvoffloadManager(num_blocks, cache_policy=policy, **kw), ReferenceManager(num_blocks, policy, **kw)


def run_stream(policy, seed, num_blocks, steps, store_threshold=1, max_tracker_size=64_000, universe=400):
    rng = random.Random(seed)
    ours, ref = both(policy, num_blocks, enable_events=True, store_threshold=store_threshold,
                     max_tracker_size=max_tracker_size)
    prompts = [[rng.randrange(universe) for _ in range(rng.randrange(4, 16))] for _ in range(30)]
    loads, stores = [], []  # in-flight (keys) of prepare_load / prepare_store
    counts = {"hit": 0, "pending": 0, "evicted": 0, "none": 0, "failed": 0, "resets": 0}
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
                a, b = ours.lookup(k, CTX), ref.lookup(k, CTX)
                assert a == b
                counts["pending"] += a == LookupResult.HIT_PENDING
                if a != LookupResult.HIT:
                    break
                hits += 1
            counts["hit"] += hits
            touched = keys if rng.random() < 0.8 else [key(rng.randrange(universe)) for _ in range(5)]
            ours.touch(touched, CTX)
            ref.touch(touched, CTX)
            if hits:
                a, b = ours.prepare_load(keys[:hits], CTX), ref.prepare_load(keys[:hits], CTX)
                assert ids(a) == ids(b)
                loads.append(keys[:hits])
            # vLLM offers the keys after the hit prefix, sometimes with already stored ones.
            offer = keys[hits:] if rng.random() < 0.7 else keys
            a, b = ours.prepare_store(offer, CTX), ref.prepare_store(offer, CTX)
            stored = same_store(a, b)
            counts["none"] += a is None
            counts["evicted"] += len(a.evicted_keys) if a is not None else 0
            if stored:
                stores.append(stored)
        elif op < 0.6 and loads:
            ks = loads.pop(rng.randrange(len(loads)))
            ours.complete_load(ks, CTX)
            ref.complete_load(ks, CTX)
        elif op < 0.8 and stores:
            ks = stores.pop(rng.randrange(len(stores)))
            success = rng.random() < 0.8
            counts["failed"] += not success
            if rng.random() < 0.2:
                # vLLM skips keys that are not write-pending: unknown ones, repeats, ready ones.
                ks = ks + [key(rng.randrange(universe))] + ks[:1]
            ours.complete_store(ks, CTX, success=success)
            ref.complete_store(ks, CTX, success=success)
        elif op < 0.85:
            k = key(rng.randrange(universe))
            assert ours.lookup(k, CTX) == ref.lookup(k, CTX)
        elif op < 0.9:
            assert event_tuples(ours.take_events()) == event_tuples(ref.take_events())
        elif op < 0.95:
            assert stats_of(ours.get_stats()) == stats_of(ref.get_stats())
        elif op < 0.955:
            # vLLM never completes a job from before a reset.
            ours.reset_cache()
            ref.reset_cache()
            loads.clear()
            stores.clear()
            counts["resets"] += 1
    assert event_tuples(ours.take_events()) == event_tuples(ref.take_events())
    assert stats_of(ours.get_stats()) == stats_of(ref.get_stats())
    return counts


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(6))
def test_random_streams_match_cpu_offloading_manager(policy, seed):
    counts = run_stream(policy, seed, num_blocks=[12, 40, 97][seed % 3], steps=3000)
    # The stream must have exercised what it is meant to compare.
    assert counts["hit"] > 0 and counts["evicted"] > 0 and counts["failed"] > 0
    assert counts["none"] > 0 and counts["pending"] > 0


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(3))
def test_random_streams_with_store_threshold(policy, seed):
    counts = run_stream(policy, 100 + seed, num_blocks=30, steps=3000, store_threshold=2 + seed % 2,
                        max_tracker_size=50, universe=120)
    assert counts["hit"] > 0 and counts["evicted"] > 0


def test_block_ids_fresh_ascending_then_most_recently_freed_first():
    m = KvoffloadManager(4, cache_policy="lru")
    out = m.prepare_store([key(1), key(2), key(3)], CTX)
    assert ids(out.store_spec) == [0, 1, 2]
    m.complete_store([key(1), key(2), key(3)], CTX, success=False)  # frees 0, 1, 2 in that order
    out = m.prepare_store([key(4), key(5), key(6)], CTX)
    # Never-used id 3 first, then the freed ones, most recently freed first.
    assert ids(out.store_spec) == [3, 2, 1]
    m.complete_store([key(4), key(5), key(6)], CTX)
    out = m.prepare_store([key(7), key(8)], CTX)
    assert ids(out.store_spec) == [3, 0] and out.evicted_keys == [key(4)]


def test_lru_keeps_loaded_blocks_in_place_and_evicts_in_order_with_events():
    m = KvoffloadManager(3, cache_policy="lru", enable_events=True)
    m.prepare_store([key(1), key(2), key(3)], CTX)
    m.complete_store([key(1), key(2), key(3)], CTX)
    # A load of key 1 ends: vLLM does not move it, so it is still the least recent.
    spec = m.prepare_load([key(1)], CTX)
    assert ids(spec) == [0]
    m.complete_load([key(1)], CTX)
    out = m.prepare_store([key(4), key(5)], CTX)
    assert out.evicted_keys == [key(1), key(2)] and ids(out.store_spec) == [1, 0]
    m.complete_store([key(5), key(4)], CTX)
    assert event_tuples(m.take_events()) == [
        (False, [key(1), key(2), key(3)]),
        (True, [key(1), key(2)]),
        (False, [key(5), key(4)]),
    ]
    assert list(m.take_events()) == []


def test_pinned_and_protected_blocks_are_not_evicted():
    m = KvoffloadManager(2, cache_policy="arc")
    m.prepare_store([key(1), key(2)], CTX)
    m.complete_store([key(1), key(2)], CTX)
    m.prepare_load([key(1)], CTX)
    # key 2 is offered again, so it is protected; key 1 is pinned: nothing can make room.
    assert m.prepare_store([key(2), key(3)], CTX) is None
    out = m.prepare_store([key(3)], CTX)
    assert out.evicted_keys == [key(2)] and out.keys_to_store == [key(3)]
    assert m.lookup(key(3), CTX) == LookupResult.HIT_PENDING
    assert m.lookup(key(2), CTX) == LookupResult.MISS


def test_store_threshold_counts_lookups():
    m = KvoffloadManager(8, store_threshold=2, max_tracker_size=2, enable_events=True)
    assert m.lookup(key(1), CTX) == LookupResult.MISS
    out = m.prepare_store([key(1)], CTX)
    assert out.keys_to_store == []  # seen once, threshold 2
    m.lookup(key(1), CTX)
    m.lookup(key(2), CTX)
    m.lookup(key(3), CTX)  # tracker of 2 forgets the least recently looked up: key 1
    assert m.prepare_store([key(1), key(2), key(3)], CTX).keys_to_store == []
    m.lookup(key(3), CTX)
    assert m.prepare_store([key(1), key(2), key(3)], CTX).keys_to_store == [key(3)]
    stats = m.get_stats()
    assert stats.counters[(CPUOffloadingMetrics.STORES_SKIPPED, None)] == 1 + 3 + 2


def test_stats_names_and_values():
    m = KvoffloadManager(4, cache_policy="arc")
    m.lookup(key(1), CTX)
    m.prepare_store([key(1), key(2)], CTX)
    m.complete_store([key(1)], CTX)
    m.lookup(key(1), CTX)
    m.lookup(key(2), CTX)
    m.prepare_load([key(1)], CTX)
    s = m.get_stats()
    assert s.gauges == {
        (CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, None): 0.5,
        (CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, None): 0.25,
        (CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, None): 0.25,
    }
    assert s.histograms == {(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, None): [2]}
    assert s.counters == {
        (CPUOffloadingMetrics.CPU_BLOCK_LOOKUP, ("arc",)): 3,
        (CPUOffloadingMetrics.CPU_BLOCK_HIT, ("arc",)): 2,
        (CPUOffloadingMetrics.CPU_BLOCK_MISS, ("arc",)): 1,
        (CPUOffloadingMetrics.BLOCK_EVICTION, ("arc",)): 0,
    }
    # Deltas: the next call reports only what happened since.
    assert m.get_stats().counters[(CPUOffloadingMetrics.CPU_BLOCK_LOOKUP, ("arc",))] == 0


def test_interface_types_and_hooks():
    m = KvoffloadManager(num_blocks=2, cache_policy="LRU", enable_events=False)
    assert isinstance(m, OffloadingManager)
    assert m.medium == Medium.CPU
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
    with pytest.raises(ValueError, match="num_blocks=0"):
        KvoffloadManager(0)
    with pytest.raises(ValueError, match="max_tracker_size=0"):
        KvoffloadManager(4, store_threshold=2, max_tracker_size=0)
    m = KvoffloadManager(4)
    with pytest.raises(kvoffload.Error, match="bytes object, got int") as e:
        m.lookup(5, CTX)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(kvoffload.Error, match="collection of keys, got one bytes key") as e:
        m.touch(key(1), CTX)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT


def test_import_without_vllm_raises_a_clear_import_error():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if "vllm" not in p)
    code = (
        "import sys\n"
        "sys.path = [p for p in sys.path if 'vllm_standin' not in p]\n"
        "sys.modules['vllm'] = None  # as if vLLM were not installed, even where it is\n"
        "import kvoffload\n"
        "try:\n"
        "    import kvoffload.vllm\n"
        "except ImportError as e:\n"
        "    print('IMPORTERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "IMPORTERROR kvoffload.vllm is the vLLM offloading backend and needs vLLM installed" in out.stdout
