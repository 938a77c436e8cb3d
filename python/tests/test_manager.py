import pytest

import kvoffload
from kvoffload import LookupResult


def test_store_lookup_load_evict_flow():
    m = kvoffload.Manager(2, policy="lru")
    assert m.num_chunks == 2 and m.policy == "lru"
    prefix, results = m.lookup([1, 2])
    assert prefix == 0 and results == [LookupResult.MISS, LookupResult.MISS]

    plan = m.prepare_store([1, 2])
    assert plan.ok and plan.keys == [1, 2] and sorted(plan.slots) == [0, 1] and plan.evicted == []
    assert m.lookup([1])[1] == [LookupResult.HIT_PENDING]
    m.complete_store([1, 2])
    assert m.lookup([1, 2, 3])[0] == 2
    assert m.take_events() == [("stored", [1, 2])]

    slots = m.prepare_load([1])
    assert slots == [m.slot_of(1)] and m.pin_count(1) == 1
    full = m.prepare_store([3, 4])
    assert not full.ok and full.reason == "no_evictable_space" and not full
    m.complete_load([1])

    m.touch([1, 2])  # 2 is least recent now
    plan = m.prepare_store([3], protected=[1])
    assert plan.ok and plan.evicted == [2]
    m.complete_store([3], success=False)
    assert 3 not in m and m.slot_of(3) is None and m.state_of(3) == LookupResult.MISS
    assert m.take_events() == [("removed", [2])]

    s = m.stats()
    assert s["used"] == 1 and s["evictions"] == 1 and s["stores_failed"] == 1
    assert s["allocation_failures"] == 1 and s["policy"]["resident"] == 1
    m.reset_stats()
    assert m.stats()["hits"] == 0
    m.reset()
    assert m.stats()["used"] == 0


def test_wide_and_bytes_keys_and_arc():
    m = kvoffload.Manager(4, policy="arc")
    big = (1 << 127) | 12345
    digest = bytes(range(16))
    plan = m.prepare_store([big, digest])
    assert plan.keys == [big, int.from_bytes(digest, "big")]
    m.complete_store(plan.keys)
    assert big in m and m.policy == "arc"


def test_manager_errors():
    m = kvoffload.Manager(2)
    with pytest.raises(kvoffload.Error) as e:
        m.complete_store([7])
    assert e.value.code == kvoffload.ErrorCode.NOT_FOUND
    with pytest.raises(kvoffload.Error) as e:
        m.prepare_load([7])
    assert e.value.code == kvoffload.ErrorCode.NOT_FOUND
    with pytest.raises(kvoffload.Error) as e:
        m.lookup([-1])
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT and "-1" in str(e.value)
    with pytest.raises(kvoffload.Error, match=r"128-bit: \d+ is >= 2\*\*128") as e:
        m.lookup([1 << 128])
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(kvoffload.Error, match="expected a sequence of block keys") as e:
        m.lookup(5)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(kvoffload.Error) as e:
        kvoffload.Manager(0)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT and "num_chunks" in str(e.value)
    with pytest.raises(kvoffload.Error) as e:
        kvoffload.Manager(4, policy="fifo")
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT and "fifo" in str(e.value)
    m.prepare_store([1])
    with pytest.raises(kvoffload.Error) as e:
        m.reset()
    assert e.value.code == kvoffload.ErrorCode.STATE


def test_stats_has_every_field_of_the_list_in_order():
    # core/include/kvoffload/stats_fields.h: the manager's fields (as kvo_manager_stats has them),
    # then the policy counters as a nested dict; ints, and floats for the fractions.
    s = kvoffload.Manager(4, policy="arc").stats()
    assert list(s) == [
        "num_chunks", "used", "write_pending", "pinned", "evictable", "usage",
        "write_pending_fraction", "pinned_fraction", "lookup_keys", "hits", "hits_pending",
        "misses", "stores_prepared", "stores_completed", "stores_failed",
        "stores_skipped_threshold", "allocation_failures", "evictions", "loads_prepared",
        "loads_completed", "policy"]
    assert list(s["policy"]) == ["resident", "evictable", "recent", "frequent", "ghost_recent",
                                 "ghost_frequent", "recent_target"]
    floats = {"usage", "write_pending_fraction", "pinned_fraction"}
    for name, value in s.items():
        if name != "policy":
            assert type(value) is (float if name in floats else int), name
    assert s["num_chunks"] == 4
