# kvoffload's remote secondary tier inside vLLM's own tiering (TieringOffloadingSpec,
# TieringOffloadingManager, SecondaryTierFactory, SharedOffloadRegion from the vLLM tree the harness runs):
# engines that share chunks through one redis-server, a 3-master Redis Cluster and memcached,
# each started by the test; kill -9 and SIGSTOP of the store mid-run; corrupted and foreign
# values; events and metrics through vLLM's classes.
import json
import time

import pytest

import vllm_real

vllm_real.require()

from vllm.v1.kv_offload.base import Locality, LookupResult, Medium  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402

import kvoffload  # noqa: E402
from kvoffload.vllm import KvoffloadFileTier, KvoffloadRemoteTier  # noqa: E402
from store_servers import Cluster, Server  # noqa: E402
import vllm_tiering  # noqa: E402
from vllm_tiering import Engine, key, row_bytes_of, tiering  # noqa: E402

engines = vllm_tiering.engines  # the fixture: pytest finds fixtures among module globals

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


def eventually(what, timeout: float = 20.0):
    """Repeats `what` (a scheduler's retried request) until it returns true: after a store came
    back, an open circuit (breaker_backoff_ms) and an absent answer (negative_ttl_ms) expire
    before the tier asks the store again."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s")
        time.sleep(0.02)


def remote(url: str, **more) -> dict:
    return {"type": "remote", "module_path": "kvoffload.vllm", "url": url, **more}


@pytest.fixture
def redis():
    server = Server("redis")
    yield server
    server.close()


def test_vllms_factory_loads_the_tiers_from_type_and_module_path():
    # vLLM resolves an out-of-tree tier as getattr(module, type) after its registry, so the short
    # names reach kvoffload only while vLLM has no built-in tier of that name.
    assert "remote" not in SecondaryTierFactory._registry
    assert "file" not in SecondaryTierFactory._registry
    get = SecondaryTierFactory.get_tier_class
    assert get({"type": "remote", "module_path": "kvoffload.vllm"}) is KvoffloadRemoteTier
    assert get({"type": "file", "module_path": "kvoffload.vllm"}) is KvoffloadFileTier
    assert get({"type": "KvoffloadRemoteTier", "module_path": "kvoffload.vllm"}) is KvoffloadRemoteTier
    assert get({"type": "KvoffloadFileTier", "module_path": "kvoffload.vllm_tiers"}) is KvoffloadFileTier


def test_two_engines_share_chunks_through_one_redis(redis, engines):
    a = engines(tiering(remote(redis.url)))
    b = engines(tiering(remote(redis.url)))
    assert isinstance(a.tier, KvoffloadRemoteTier) and a.tier.tier_type == "remote"
    keys = [key(i) for i in range(12)]
    assert a.store(keys) == keys
    assert a.tier.stats()["stored"] == len(keys)
    # One value per chunk, under the fingerprinted key, holding header + row.
    raw = redis.command(b"GET", a.tier.store_key(keys[0]).encode())
    assert len(raw) == kvoffload.remote_value_bytes(a.row_bytes)
    assert raw.endswith(row_bytes_of(keys[0], a.row_bytes).tobytes())

    # Engine B has never seen them: the first step answers RETRY (the existence checks go out as
    # one batch at the end of the step), then HIT once the store answered and B promoted them.
    assert b.first_answers(keys) == [RETRY] * len(keys)
    assert b.lookup(keys) == [HIT] * len(keys)
    b.verify(keys)
    s = b.tier.stats()
    assert s["loaded"] == len(keys) and s["stored"] == 0 and s["corrupt"] == 0
    # A key nobody stored is a MISS once its check answers.
    assert b.lookup([key(999)]) == [MISS]


def test_three_master_cluster_spreads_chunks_and_two_engines_share_them(engines):
    cluster = Cluster(3)
    try:
        a = engines(tiering(remote(cluster.url)))
        b = engines(tiering(remote(cluster.url)))
        keys = [key(i, b"cluster") for i in range(24)]
        a.store(keys)
        assert a.tier.stats()["put_errors"] == 0
        sizes = [int(n.command(b"DBSIZE")) for n in cluster.nodes]
        assert sum(sizes) == len(keys) and all(s > 0 for s in sizes), sizes
        assert b.lookup(keys) == [HIT] * len(keys)
        b.verify(keys)
    finally:
        cluster.close()


def test_memcached_round_trip_between_two_engines(engines):
    server = Server("memcached")
    try:
        a = engines(tiering(remote(server.url, memcached_item_max=4 << 20)))
        b = engines(tiering(remote(server.url, memcached_item_max=4 << 20)))
        keys = [key(i, b"mc") for i in range(8)]
        a.store(keys)
        assert b.lookup(keys) == [HIT] * len(keys)
        b.verify(keys)
    finally:
        server.close()


def test_another_model_or_namespace_never_reads_these_values(redis, engines):
    a = engines(tiering(remote(redis.url)))
    keys = [key(i, b"fp") for i in range(4)]
    a.store(keys)
    other_model = engines(tiering(remote(redis.url)), model="other/model")
    other_dtype = engines(tiering(remote(redis.url)), dtype="float16")
    other_ns = engines(tiering(remote(redis.url, namespace="tenant-b")))
    same = engines(tiering(remote(redis.url)))
    for e in (other_model, other_dtype, other_ns):
        assert e.tier.options.fingerprint != a.tier.options.fingerprint
        assert e.lookup(keys) == [MISS] * len(keys)
        assert e.tier.stats()["corrupt"] == 0  # different keys: not even read
    assert same.tier.options.fingerprint == a.tier.options.fingerprint
    assert same.lookup(keys) == [HIT] * len(keys)


def test_a_corrupted_or_foreign_value_is_a_miss_never_data(redis, engines):
    a = engines(tiering(remote(redis.url)))
    b = engines(tiering(remote(redis.url)))
    keys = [key(i, b"corrupt") for i in range(4)]
    a.store(keys)
    # Flip one payload byte of keys[1]; give keys[2] the value of keys[3] (a foreign value).
    k1 = a.tier.store_key(keys[1]).encode()
    raw = bytearray(redis.command(b"GET", k1))
    raw[-10] ^= 0xFF
    redis.command(b"SET", k1, bytes(raw))
    redis.command(b"SET", a.tier.store_key(keys[2]).encode(),
                  redis.command(b"GET", a.tier.store_key(keys[3]).encode()))
    # EXISTS finds all four; the promotion of the two bad ones fails verification: vLLM gets a
    # partial job (the good keys) and the bad keys are MISS from then on, never a livelock.
    results = b.lookup(keys)
    assert results == [HIT, MISS, MISS, HIT], results
    b.verify([keys[0], keys[3]])
    s = b.tier.stats()
    assert s["corrupt"] == 2 and s["loaded"] == 2
    stats = b.stats().data["data"]
    assert stats["vllm:kv_offload_tiering_promotion_job_failures"][("1:remote",)] == 1
    assert stats["kvoffload:remote_tier_corrupt_values"][("remote",)] == 2
    assert b.lookup(keys[1:3]) == [MISS, MISS]


def test_kill_nine_mid_run_degrades_to_misses_and_recovers_after_a_restart(redis, engines):
    opts = {"lookup_timeout_ms": 50, "put_timeout_ms": 500, "get_timeout_ms": 500,
            "breaker_backoff_ms": 50}
    a = engines(tiering(remote(redis.url, **opts)))
    b = engines(tiering(remote(redis.url, **opts)))
    before = [key(i, b"k9a") for i in range(6)]
    a.store(before)
    redis.kill9()
    during = [key(i, b"k9b") for i in range(6)]
    a.store(during)  # the cascades fail; the primary tier keeps the blocks, nothing hangs
    assert a.tier.stats()["put_errors"] >= len(during)
    assert a.lookup(during) == [HIT] * len(during)  # primary hits are untouched
    assert b.lookup(before + during) == [MISS] * 12
    redis.restart()  # the same port, empty
    stored = a.tier.stats()["stored"]
    probes = iter(range(1000))
    # The breaker probes the node again after its backoff: stores of new blocks succeed again.
    eventually(lambda: (a.store([key(next(probes), b"k9probe")]),
                        a.tier.stats()["stored"] > stored)[1])
    after = [key(i, b"k9c") for i in range(6)]
    errors = a.tier.stats()["put_errors"]
    a.store(after)
    assert a.tier.stats()["put_errors"] == errors
    eventually(lambda: b.lookup(after) == [HIT] * len(after))
    b.verify(after)
    assert b.lookup(before) == [MISS] * len(before)  # the restarted store is empty
    assert a.tier.stats()["breaker_opens"] >= 1


def test_a_frozen_store_answers_retry_then_miss_within_the_budget_and_recovers(redis, engines):
    opts = {"lookup_timeout_ms": 100, "put_timeout_ms": 300, "get_timeout_ms": 300,
            "breaker_backoff_ms": 50}
    a = engines(tiering(remote(redis.url, **opts)))
    b = engines(tiering(remote(redis.url, **opts)))
    keys = [key(i, b"stop") for i in range(6)]
    a.store(keys)
    redis.freeze()
    try:
        fresh = [key(i, b"stop-new") for i in range(6)]
        assert b.first_answers(fresh) == [RETRY] * 6  # a check is out; the store is silent
        # Every call returns at once (the scheduler never waits for the store); once the budget
        # is spent the answer is MISS.
        assert b.lookup(fresh) == [MISS] * 6
        s = b.tier.stats()  # absent at the budget, or failed at the checks' deadline
        assert s["lookup_absent"] + s["lookup_errors"] >= 6, s
        a.store(fresh)  # the cascades time out (put_timeout_ms) and come back failed
        assert a.tier.stats()["put_errors"] >= 6
    finally:
        redis.thaw()
    eventually(lambda: b.lookup(keys) == [HIT] * len(keys))
    b.verify(keys)


def test_events_carry_the_storage_medium_and_the_configured_locality(redis, engines):
    a = engines(tiering(remote(redis.url, enable_kv_events=True, locality="REMOTE")), events=True)
    keys = [key(i, b"ev") for i in range(3)]
    a.store(keys)
    tier_events = [e for e in a.manager.take_events() if e.medium is Medium.STORAGE]
    assert len(tier_events) == 1
    event = tier_events[0]
    assert list(event.keys) == keys and not event.removed and event.locality is Locality.REMOTE
    # Unconfigured locality stays unspecified; no events without the global switch.
    b = engines(tiering(remote(redis.url, enable_kv_events=True)), events=True)
    b.store([key(9, b"ev")])
    assert [e.locality for e in b.manager.take_events() if e.medium is Medium.STORAGE] == [None]
    c = engines(tiering(remote(redis.url, enable_kv_events=True)), events=False)
    c.store([key(10, b"ev")])
    assert c.tier.events is None


def test_failed_stores_emit_no_event(engines):
    port = Server("redis")
    url = port.url
    port.close()  # nothing listens there any more
    a = engines(tiering(remote(url, enable_kv_events=True, connect_timeout_ms=50)), events=True)
    a.store([key(1, b"dead")])
    assert [e for e in a.manager.take_events() if e.medium is Medium.STORAGE] == []
    assert a.tier.stats()["put_errors"] == 1


def test_an_unreachable_store_at_start_is_a_warning_and_lookups_miss(engines, caplog):
    server = Server("redis")
    url = server.url
    server.close()
    a = engines(tiering(remote(url, connect_timeout_ms=50, lookup_timeout_ms=20)))
    assert a.lookup([key(1)]) == [MISS]
    assert a.tier.stats()["nodes_open"] == 1


def test_bad_configurations_name_the_key_and_what_is_allowed(redis):
    with pytest.raises(ValueError, match="'url' is required"):
        Engine(tiering({"type": "remote", "module_path": "kvoffload.vllm"}))
    with pytest.raises(kvoffload.Error, match="unknown scheme 'http'"):
        Engine(tiering(remote("http://127.0.0.1:1")))
    with pytest.raises(ValueError, match=r"unknown keys \['lookup_timeout'\]"):
        Engine(tiering(remote(redis.url, lookup_timeout=5)))
    with pytest.raises(ValueError, match="locality='NEAR' is not one of"):
        Engine(tiering(remote(redis.url, locality="NEAR")))
    with pytest.raises(ValueError, match="connections_per_node=-1 must be an integer >= 0"):
        Engine(tiering(remote(redis.url, connections_per_node=-1)))


def test_metrics_reach_prometheus_through_vllms_offload_metrics(redis, engines):
    from functools import partial

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics
    from vllm.v1.kv_offload.tiering.base import TieringOffloadingMetrics

    extra = tiering(remote(redis.url))
    registry = CollectorRegistry()
    types = {cls: partial(cls, registry=registry) for cls in (Gauge, Counter, Histogram)}
    transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                kv_connector_extra_config=extra)
    prom = OffloadPromMetrics(VllmConfig(kv_transfer_config=transfer), types, ["model_name"],
                              {0: ["m"]})
    a = engines(extra)
    b = engines(extra)
    keys = [key(i, b"prom") for i in range(5)]
    a.store(keys)
    prom.observe(a.stats().data)
    b.lookup(keys + [key(77, b"prom")])
    prom.observe(b.stats().data)
    value = registry.get_sample_value
    assert value("kvoffload:remote_tier_stored_chunks_total", {"model_name": "m", "tier": "remote"}) == 5
    assert value("kvoffload:remote_tier_loaded_chunks_total", {"model_name": "m", "tier": "remote"}) == 5
    # vLLM's name: ..._block_hits at 017e9f4448, ..._chunk_hits from 7cfb97e3 on.
    hits = TieringOffloadingMetrics.BLOCK_HITS
    assert hits.endswith(("_block_hits", "_chunk_hits")), hits
    assert value(f"{hits}_total", {"model_name": "m", "tier": "1:remote"}) == 5
    assert value("vllm:kv_offload_tiering_read_bytes_total",
                 {"model_name": "m", "tier": "1:remote"}) == 5 * a.row_bytes
    assert value("kvoffload:remote_tier_nodes_open", {"model_name": "m", "tier": "remote"}) == 0
    # A second get_stats reports only what happened since.
    again = b.stats().data["data"]
    assert "kvoffload:remote_tier_loaded_chunks" not in again


def test_reset_cache_drains_the_tier_and_keeps_the_shared_values(redis, engines):
    a = engines(tiering(remote(redis.url)))
    keys = [key(i, b"reset") for i in range(5)]
    a.store(keys, settle=False)  # cascades in flight
    a.evict_primary()             # vLLM's reset_cache: drain_jobs, then the primary is emptied
    assert a.lookup(keys) == [HIT] * len(keys)  # promoted back from the store
    a.verify(keys)


def test_the_readme_configuration_is_what_these_tests_run(redis):
    from vllm_readme import readme_tier_config

    config = readme_tier_config("remote")
    assert config["kv_connector_extra_config"]["spec_name"] == "TieringOffloadingSpec"
    tier = config["kv_connector_extra_config"]["secondary_tiers"][0]
    assert SecondaryTierFactory.get_tier_class(tier) is KvoffloadRemoteTier
    extra = json.loads(json.dumps(config["kv_connector_extra_config"]))
    extra["secondary_tiers"][0]["url"] = redis.url
    extra["cpu_bytes_to_use"] = 32 * 4 * 4096
    e = Engine(extra)
    try:
        keys = [key(i, b"readme") for i in range(3)]
        e.store(keys)
        assert e.tier.stats()["stored"] == 3
    finally:
        e.shutdown()


def test_an_expired_absent_answer_is_asked_again_not_retried_forever(redis, engines):
    # Engine B asks about chunks nobody stored (MISS); engine A stores them; once B's absent
    # answers expire (negative_ttl_ms), B's next lookups ask the store again, once per chunk,
    # and hit: a lookup cache that never asked again would answer RETRY for ever.
    a = engines(tiering(remote(redis.url)))
    # An absent answer lives max(negative_ttl_ms, lookup_timeout_ms): 1 s here, and 1 s is also
    # the budget each check has (loopback Redis answers in well under that).
    b = engines(tiering(remote(redis.url, negative_ttl_ms=1000, lookup_timeout_ms=1000)))
    keys = [key(i, b"again") for i in range(3)]
    assert b.lookup(keys) == [MISS] * 3
    assert b.tier.stats()["lookups"] == 3
    a.store(keys)
    time.sleep(1.2)  # past the absent answers' lifetime
    assert b.lookup(keys) == [HIT] * 3
    assert b.tier.stats()["lookups"] == 6  # each chunk asked exactly once more
    b.verify(keys)
