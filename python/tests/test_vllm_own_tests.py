# vLLM's own manager tests (tests/v1/kv_offload/cpu/test_manager.py in
# the vLLM tree the harness runs, unmodified) with KvoffloadManager in place of
# CPUOffloadingManager: the test module's name CPUOffloadingManager is rebound to ours, and its
# tests are collected here. Excluded: the tests that read or patch CPUOffloadingManager's private
# fields, each with the reason below.
import importlib.util

import vllm_real

TREE = vllm_real.require()

from kvoffload.vllm import KvoffloadManager  # noqa: E402

_path = TREE / "tests" / "v1" / "kv_offload" / "cpu" / "test_manager.py"
_spec = importlib.util.spec_from_file_location("vllm_tests_v1_kv_offload_cpu_test_manager", _path)
vllm_test_manager = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vllm_test_manager)
vllm_test_manager.CPUOffloadingManager = KvoffloadManager

EXCLUDED = {
    "test_cpu_manager_reports_allocation_size_on_allocation_failure":
        "monkeypatches the private method CPUOffloadingManager._allocate_blocks",
    "test_evictable_cache_block_count":
        "reads CPUOffloadingManager._num_evictable_cache_blocks and spies on _policy.evict",
    "test_touch_forwards_req_context_to_policy":
        "patches _policy.touch (kvoffload's policies are C++ and take no req_context)",
}
# TestARCPolicy._make_manager returns (manager, manager._policy), the Python ARCCachePolicy; the
# tests below read or set its T1/T2/B1/B2 lists and target (the same behaviour is compared with
# vLLM's ARC output for output in test_vllm_manager.py). test_eviction_with_load ignores the
# policy and runs here.
EXCLUDED_ARC = {
    "test_basic": "asserts len(arc_policy.t1) / len(arc_policy.t2)",
    "test_t1_to_t2_promotion": "asserts membership in arc_policy.t1 / t2",
    "test_adaptive_target": "reads arc_policy.target_t1_size and b1",
    "test_t1_t2_eviction_policy": "sets arc_policy.target_t1_size, reads t1/t2/b1",
    "test_batch_eviction_scans_t1_and_t2_once": "calls arc_policy.evict and counts its iterations",
    "test_batch_eviction_falls_back_after_t1_iterator_exhausted": "calls arc_policy.evict",
    "test_batch_eviction_failure_is_atomic": "calls arc_policy.evict",
    "test_ghost_list_bounds": "reads arc_policy.b1 / b2 / cache_capacity",
    "test_touch_ordering": "reads len(arc_policy.t1) / t2",
    "test_failed_store": "reads arc_policy.t1 / t2 / b1",
    "test_full_scenario": "reads len(arc_policy.t1) / t2",
}

for _name, _obj in vars(vllm_test_manager).items():
    if _name.startswith("test_") and callable(_obj) and _name not in EXCLUDED:
        globals()[_name] = _obj


class TestARCPolicy(vllm_test_manager.TestARCPolicy):
    def _make_manager(self, num_blocks: int = 4, enable_events: bool = True):
        manager = vllm_test_manager.make_cpu_manager(
            num_blocks=num_blocks, cache_policy="arc", enable_events=enable_events)
        return manager, None  # KvoffloadManager has no Python policy object


for _name in EXCLUDED_ARC:
    assert callable(getattr(TestARCPolicy, _name)), _name  # a renamed test must be looked at
    setattr(TestARCPolicy, _name, None)


def test_the_exclusions_name_real_tests():
    # A vLLM update that renames or drops a test makes this fail rather than silently run less.
    for name in EXCLUDED:
        assert callable(getattr(vllm_test_manager, name)), name
    collected = [n for n in globals() if n.startswith("test_") and n != "test_the_exclusions_name_real_tests"]
    assert len(collected) == 11, collected  # 14 in vLLM's file, 3 excluded above
    assert vllm_test_manager.make_cpu_manager().__class__ is KvoffloadManager
