"""A reference model of vLLM's CPUOffloadingManager with its LRU and ARC policies.

Written for the tests from reading vLLM's vllm/v1/kv_offload/cpu/manager.py and
cpu/policies/{lru,arc}.py: the same algorithm on the same data structures (OrderedDicts, a
ref-count per block, a free list), so every output can be compared with kvoffload.vllm's, and its
speed is a fair stand-in for vLLM's where vLLM itself is not installed. Needs the vLLM stand-in
(python/tests/vllm_standin) or vLLM on sys.path for the result types.
"""

from collections import OrderedDict

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    PrepareStoreOutput,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics


class Block:
    """ref_cnt -1: store in flight; 0: ready, evictable; n > 0: ready, pinned by n loads."""

    __slots__ = ("ref_cnt", "block_id")

    def __init__(self, block_id):
        self.ref_cnt = -1
        self.block_id = block_id

    @property
    def is_ready(self):
        return self.ref_cnt >= 0


class LruPolicy:
    def __init__(self, capacity):
        self.blocks = OrderedDict()

    def get(self, key):
        return self.blocks.get(key)

    def insert(self, key, block):
        self.blocks[key] = block

    def remove(self, key):
        del self.blocks[key]

    def touch(self, keys):
        for key in reversed(list(keys)):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def evict(self, n, protected):
        if n == 0:
            return []
        candidates = []
        for key, block in self.blocks.items():
            if block.ref_cnt == 0 and key not in protected:
                candidates.append((key, block))
                if len(candidates) == n:
                    break
        if len(candidates) < n:
            return None
        for key, _ in candidates:
            del self.blocks[key]
        return candidates

    def clear(self):
        self.blocks.clear()


class ArcPolicy:
    def __init__(self, capacity):
        self.cache_capacity = capacity
        self.target_t1_size = 0.0
        self.t1 = OrderedDict()
        self.t2 = OrderedDict()
        self.b1 = OrderedDict()
        self.b2 = OrderedDict()

    def get(self, key):
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key, block):
        self.t1[key] = block
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key):
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def touch(self, keys):
        for key in reversed(list(keys)):
            if key in self.t1:
                block = self.t1.pop(key)
                if not block.is_ready:
                    self.t1[key] = block
                else:
                    self.t2[key] = block
            elif key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.b1:
                delta = max(1, len(self.b2) / len(self.b1))
                self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                delta = max(1, len(self.b1) / len(self.b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0)
                self.b2.move_to_end(key)

    def clear(self):
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0

    def evict(self, n, protected):
        if n == 0:
            return []
        candidates = []
        virtual_t1_size = len(self.t1)
        t1_iter = iter(self.t1.items())
        t2_iter = iter(self.t2.items())

        def next_candidate(entries):
            for key, block in entries:
                if block.ref_cnt == 0 and key not in protected:
                    return key, block
            return None

        while len(candidates) < n:
            candidate = None
            if virtual_t1_size >= int(self.target_t1_size):
                entry = next_candidate(t1_iter)
                if entry is not None:
                    candidate = (*entry, True)
                    virtual_t1_size -= 1
            if candidate is None:
                entry = next_candidate(t2_iter)
                if entry is None:
                    return None
                candidate = (*entry, False)
            candidates.append(candidate)

        result = []
        for key, block, from_t1 in candidates:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            result.append((key, block))
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return result


class ReferenceManager:
    """CPUOffloadingManager's behaviour, call for call."""

    def __init__(self, num_blocks, cache_policy="lru", enable_events=False, store_threshold=1,
                 max_tracker_size=64_000):
        self.medium = Medium.CPU
        self._num_blocks = num_blocks
        self._num_allocated_blocks = 0
        self._free_list = []
        self.events = [] if enable_events else None
        self._policy_name = cache_policy
        self._policy = {"lru": LruPolicy, "arc": ArcPolicy}[cache_policy](num_blocks)
        self._num_evictable_cache_blocks = 0
        self._num_write_pending_blocks = 0
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.stores_skipped_in_current_batch = 0
        self.allocation_sizes_in_current_batch = []
        self.counts = OrderedDict() if store_threshold >= 2 else None
        self._lookups_delta = self._hits_delta = self._misses_delta = self._evictions_delta = 0

    def _get_num_free_blocks(self):
        return len(self._free_list) + self._num_blocks - self._num_allocated_blocks

    def _allocate_blocks(self, keys):
        num_fresh = min(len(keys), self._num_blocks - self._num_allocated_blocks)
        num_reused = len(keys) - num_fresh
        assert len(self._free_list) >= num_reused
        blocks = []
        for _ in range(num_fresh):
            blocks.append(Block(self._num_allocated_blocks))
            self._num_allocated_blocks += 1
        for _ in range(num_reused):
            blocks.append(Block(self._free_list.pop()))
        return blocks

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def on_request_finished(self, req_context):
        return None

    def lookup(self, key, req_context):
        if self.counts is not None:
            if key in self.counts:
                self.counts.move_to_end(key)
                self.counts[key] += 1
            else:
                if len(self.counts) >= self.max_tracker_size:
                    self.counts.popitem(last=False)
                self.counts[key] = 1
        block = self._policy.get(key)
        if block is None:
            result = LookupResult.MISS
        elif not block.is_ready:
            result = LookupResult.HIT_PENDING
        else:
            result = LookupResult.HIT
        self._lookups_delta += 1
        if result == LookupResult.MISS:
            self._misses_delta += 1
        else:
            self._hits_delta += 1
        return result

    def prepare_load(self, keys, req_context):
        blocks = []
        for key in keys:
            block = self._policy.get(key)
            assert block is not None and block.is_ready
            if block.ref_cnt == 0:
                self._num_evictable_cache_blocks -= 1
            block.ref_cnt += 1
            blocks.append(block)
        return CPULoadStoreSpec([b.block_id for b in blocks])

    def touch(self, keys, req_context):
        self._policy.touch(keys)

    def complete_load(self, keys, req_context):
        for key in keys:
            block = self._policy.get(key)
            assert block is not None and block.ref_cnt > 0
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._num_evictable_cache_blocks += 1

    def prepare_store(self, keys, req_context):
        if self.counts is not None:
            num_keys = len(keys)
            keys = [k for k in keys if self.counts.get(k, 0) >= self.store_threshold]
            self.stores_skipped_in_current_batch += num_keys - len(keys)
        keys_list = list(keys)
        keys_to_store = [k for k in keys_list if self._policy.get(k) is None]
        if not keys_to_store:
            return PrepareStoreOutput(keys_to_store=[], store_spec=CPULoadStoreSpec([]), evicted_keys=[])
        self.allocation_sizes_in_current_batch.append(len(keys_to_store))
        num_blocks_to_evict = len(keys_to_store) - self._get_num_free_blocks()
        to_evict = []
        if num_blocks_to_evict > 0:
            if num_blocks_to_evict > self._num_evictable_cache_blocks:
                return None
            evicted = self._policy.evict(num_blocks_to_evict, set(keys_list))
            if evicted is None:
                return None
            self._evictions_delta += len(evicted)
            self._num_evictable_cache_blocks -= len(evicted)
            for key, block in evicted:
                self._free_list.append(block.block_id)
                to_evict.append(key)
        if to_evict and self.events is not None:
            self.events.append(OffloadingEvent(keys=to_evict, medium=self.medium, removed=True))
        blocks = self._allocate_blocks(keys_to_store)
        for key, block in zip(keys_to_store, blocks):
            self._policy.insert(key, block)
        self._num_write_pending_blocks += len(keys_to_store)
        return PrepareStoreOutput(keys_to_store=keys_to_store,
                                  store_spec=CPULoadStoreSpec([b.block_id for b in blocks]),
                                  evicted_keys=to_evict)

    def complete_store(self, keys, req_context, success=True):
        stored_keys = []
        if success:
            for key in keys:
                block = self._policy.get(key)
                if block is not None and not block.is_ready:
                    block.ref_cnt = 0
                    self._num_write_pending_blocks -= 1
                    self._num_evictable_cache_blocks += 1
                    stored_keys.append(key)
        else:
            for key in keys:
                block = self._policy.get(key)
                if block is not None and not block.is_ready:
                    self._num_write_pending_blocks -= 1
                    self._policy.remove(key)
                    self._free_list.append(block.block_id)
        if stored_keys and self.events is not None:
            self.events.append(OffloadingEvent(keys=stored_keys, medium=self.medium, removed=False))

    def reset_cache(self):
        self._policy.clear()
        self._num_evictable_cache_blocks = 0
        self._num_write_pending_blocks = 0
        self._free_list.clear()
        self._num_allocated_blocks = 0

    def take_events(self):
        if self.events is not None:
            yield from self.events
            self.events.clear()

    def get_stats(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        stats = OffloadingConnectorStats()
        num_used = self._num_allocated_blocks - len(self._free_list) - self._num_evictable_cache_blocks
        usage = num_used / self._num_blocks
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        for size in self.allocation_sizes_in_current_batch:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        self.allocation_sizes_in_current_batch.clear()
        write_usage = self._num_write_pending_blocks / self._num_blocks
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, max(usage - write_usage, 0.0))
        if self.store_threshold >= 2:
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, self.stores_skipped_in_current_batch)
            self.stores_skipped_in_current_batch = 0
        label = (self._policy_name,)
        stats.increase_counter(CPUOffloadingMetrics.CPU_BLOCK_LOOKUP, self._lookups_delta, labelvalues=label)
        stats.increase_counter(CPUOffloadingMetrics.CPU_BLOCK_HIT, self._hits_delta, labelvalues=label)
        stats.increase_counter(CPUOffloadingMetrics.CPU_BLOCK_MISS, self._misses_delta, labelvalues=label)
        stats.increase_counter(CPUOffloadingMetrics.BLOCK_EVICTION, self._evictions_delta, labelvalues=label)
        self._lookups_delta = self._hits_delta = self._misses_delta = self._evictions_delta = 0
        return stats
