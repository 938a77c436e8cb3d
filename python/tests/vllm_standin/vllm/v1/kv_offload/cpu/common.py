"""Stand-in for vllm/v1/kv_offload/cpu/common.py."""

from vllm.v1.kv_offload.base import BlockIDsLoadStoreSpec


class CPUOffloadingMetrics:
    STORES_SKIPPED = "vllm:kv_offload_stores_skipped"
    CPU_CACHE_USAGE_PERC = "vllm:kv_offload_cpu_cache_usage_perc"
    CPU_ALLOCATION_SIZE = "vllm:kv_offload_cpu_allocation_size"
    CPU_CACHE_WRITE_USAGE_PERC = "vllm:kv_offload_cpu_cache_write_usage_perc"
    CPU_CACHE_READ_USAGE_PERC = "vllm:kv_offload_cpu_cache_read_usage_perc"
    CPU_BLOCK_LOOKUP = "vllm:cpu_block_lookup_total"
    CPU_BLOCK_HIT = "vllm:cpu_block_hit_total"
    CPU_BLOCK_MISS = "vllm:cpu_block_miss_total"
    BLOCK_EVICTION = "vllm:block_eviction_total"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    @staticmethod
    def medium() -> str:
        return "CPU"
