# KvoffloadSpec as vLLM's API server and scheduler see it: created by vLLM's OffloadingSpecFactory
# from docs/VLLM.md's --kv-transfer-config, its build_metric_definitions feeding vLLM's
# OffloadPromMetrics, and KvoffloadManager.get_stats passing through vLLM's
# OffloadingConnectorStats into Prometheus (prometheus_client, a registry per test).
import functools

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

import vllm_real
from vllm_readme import readme_transfer_config

vllm_real.require()

from vllm.config import KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (  # noqa: E402
    OffloadingConnectorStats,
    OffloadPromMetrics,
)
from vllm.v1.kv_offload.base import ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics  # noqa: E402
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

import kvoffload.vllm as kv_vllm  # noqa: E402
from kvoffload.vllm import KvoffloadManager, KvoffloadSpec  # noqa: E402

CTX = ReqContext(req_id="s")


def key(i):
    return make_offload_key(i.to_bytes(32, "little"), 0)


def prom_metrics(extra_config):
    """vLLM's OffloadPromMetrics for docs/VLLM.md's connector config, with a private registry."""
    registry = CollectorRegistry()
    types = {cls: functools.partial(cls, registry=registry) for cls in (Gauge, Counter, Histogram)}
    transfer = KVTransferConfig(**{**readme_transfer_config(), "kv_connector_extra_config": extra_config})
    metrics = OffloadPromMetrics(VllmConfig(kv_transfer_config=transfer), types, ["model_name"],
                                 {0: ["m"]})
    return metrics, registry


def test_readme_config_selects_kvoffload_through_vllms_factory():
    transfer = KVTransferConfig(**readme_transfer_config())  # vLLM validates it
    extra = transfer.kv_connector_extra_config
    assert transfer.kv_connector == "OffloadingConnector" and transfer.kv_role == "kv_both"
    assert OffloadingSpecFactory.get_spec_cls(extra) is KvoffloadSpec
    # Nothing in it names a region, a device, a rank or a backend: vLLM's per-replica engine id
    # and the worker's own device and rank decide, so the same JSON serves TP, DP and MLA.
    assert not {k for k in extra if k.startswith("kvoffload_")}
    assert int(extra["cpu_bytes_to_use"]) > 0


def test_every_import_path_of_the_backend_still_works():
    # kvoffload.vllm became a package (issue 27); the paths the README, vLLM configurations and
    # users' code name stay valid: the classes vLLM loads from "kvoffload.vllm", and the modules'
    # earlier names, which are the same module objects.
    import importlib

    import kvoffload.vllm_pool
    import kvoffload.vllm_tiers
    from kvoffload.vllm import manager, pool, spec, tiers, worker

    assert kvoffload.vllm_pool is pool and kvoffload.vllm_tiers is tiers
    assert importlib.import_module("kvoffload.vllm_pool") is pool
    assert kv_vllm.KvoffloadSpec is spec.KvoffloadSpec is KvoffloadSpec
    assert kv_vllm.KvoffloadManager is manager.KvoffloadManager is KvoffloadManager
    assert kv_vllm.KvoffloadWorker is worker.KvoffloadWorker
    assert kv_vllm.KvoffloadFileTier is tiers.KvoffloadFileTier is kvoffload.vllm_tiers.KvoffloadFileTier
    assert kv_vllm.KvoffloadRemoteTier is tiers.KvoffloadRemoteTier
    assert kv_vllm.remote is tiers.remote and kv_vllm.file is tiers.file
    assert kvoffload.vllm_pool.PoolManager is pool.PoolManager
    for name in ("check_block_hashes_shareable", "bringup_settings", "metric_definitions", "VLLM_COMMIT"):
        assert getattr(kv_vllm, name) is not None, name
    for name in kv_vllm.__all__:
        assert getattr(kv_vllm, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        kv_vllm.Nope  # noqa: B018


@pytest.mark.parametrize("threshold", [0, 2])
def test_metric_definitions_are_cpu_offloading_specs(threshold):
    extra = {"store_threshold": threshold}
    ours = KvoffloadSpec.build_metric_definitions(extra)
    theirs = CPUOffloadingSpec.build_metric_definitions(extra)
    assert ours.keys() == theirs.keys()
    for name, meta in ours.items():
        assert type(meta) is type(theirs[name]), name
        assert meta.labelnames == theirs[name].labelnames, name
        assert getattr(meta, "buckets", None) == getattr(theirs[name], "buckets", None), name


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_manager_stats_reach_prometheus_through_vllm(policy):
    extra = {**readme_transfer_config()["kv_connector_extra_config"], "store_threshold": 2}
    metrics, registry = prom_metrics(extra)
    manager = KvoffloadManager(4, cache_policy=policy, store_threshold=2)
    # Step 1: one key seen twice, one once; the store keeps the first and skips the second.
    for k in (key(1), key(1), key(2)):
        manager.lookup(k, CTX)
    manager.prepare_store([key(1), key(2)], CTX)
    step1 = manager.get_stats()
    # Step 2: the store completes; a load pins it.
    manager.complete_store([key(1)], CTX)
    manager.lookup(key(1), CTX)
    manager.prepare_load([key(1)], CTX)
    step2 = manager.get_stats()
    # The scheduler aggregates the steps' stats and vLLM's metrics logger observes them.
    total = OffloadingConnectorStats()
    total.aggregate(step1)
    metrics.observe(step1.data)
    total.aggregate(step2)
    metrics.observe(step2.data)
    labels = {"model_name": "m"}
    value = functools.partial(registry.get_sample_value, labels=labels)
    assert value(CPUOffloadingMetrics.STORES_SKIPPED + "_total") == 1
    assert value(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC) == 0.25
    assert value(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC) == 0.25
    assert value(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC) == 0.0
    assert value(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE + "_count") == 1
    assert value(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE + "_sum") == 1
    assert total.reduce()[CPUOffloadingMetrics.STORES_SKIPPED] == 1


def test_prometheus_refuses_a_metric_the_spec_did_not_define():
    # What made vLLM die on step 1: a stats name the spec's definitions do not know.
    metrics, _ = prom_metrics(readme_transfer_config()["kv_connector_extra_config"])
    stats = OffloadingConnectorStats()
    stats.increase_counter("vllm:kv_offload_cpu_block_lookup", 1)
    with pytest.raises(AssertionError):
        metrics.observe(stats.data)


def test_stores_skipped_is_defined_only_with_a_threshold():
    assert CPUOffloadingMetrics.STORES_SKIPPED not in kv_vllm.metric_definitions({})
    assert CPUOffloadingMetrics.STORES_SKIPPED in kv_vllm.metric_definitions({"store_threshold": "2"})
    # Without a threshold the manager does not report it (vLLM would refuse an unknown key).
    assert CPUOffloadingMetrics.STORES_SKIPPED not in KvoffloadManager(4).get_stats().data["data"]
