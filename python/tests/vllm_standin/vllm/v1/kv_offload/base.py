"""Stand-in for vllm/v1/kv_offload/base.py: the types and abstract classes kvoffload.vllm uses."""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, NewType

import numpy as np

OffloadKey = NewType("OffloadKey", bytes)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    return OffloadKey(block_hash + group_idx.to_bytes(4, "big", signed=False))


class Medium(Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    _state: dict = field(default_factory=dict, repr=False, init=False)


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class LoadStoreSpec:
    pass


@dataclass
class PrepareStoreOutput:
    keys_to_store: list
    store_spec: LoadStoreSpec
    evicted_keys: list


@dataclass
class OffloadingEvent:
    keys: list
    medium: Medium
    removed: bool
    locality: Any = None
    ownership: str | None = None
    removal_expected: bool = False


@dataclass(frozen=True)
class OffloadingKVEventsConfig:
    enable_kv_cache_events: bool
    self_describing_kv_events: bool


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, key, req_context): ...

    @abstractmethod
    def prepare_load(self, keys, req_context): ...

    def touch(self, keys, req_context):
        return

    def complete_load(self, keys, req_context):
        return

    @abstractmethod
    def prepare_store(self, keys, req_context): ...

    def complete_store(self, keys, req_context, success: bool = True):
        return

    @abstractmethod
    def on_new_request(self, req_context): ...

    def on_request_finished(self, req_context) -> None:
        return

    def take_events(self):
        return ()

    def on_schedule_end(self, context) -> None:
        return

    def has_pending_work(self) -> bool:
        return False

    def reset_cache(self) -> None:
        return

    def get_stats(self):
        return None

    def shutdown(self) -> None:
        return


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    def __init__(self, block_ids):
        self.block_ids = np.array(block_ids, dtype=np.int64)

    def __repr__(self) -> str:
        return repr(self.block_ids)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids, group_sizes, block_indices):
        super().__init__(block_ids)
        assert sum(group_sizes) == len(block_ids)
        assert len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices


@dataclass
class CanonicalKVCacheTensor:
    tensor: Any
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int
    mapping: Any = None


@dataclass
class CanonicalKVCaches:
    tensors: list
    group_data_refs: list


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None


class OffloadingWorker(ABC):
    @abstractmethod
    def submit_store(self, job_id, src_spec, dst_spec) -> bool: ...

    @abstractmethod
    def submit_load(self, job_id, src_spec, dst_spec) -> bool: ...

    @abstractmethod
    def get_finished(self): ...

    @abstractmethod
    def wait(self, job_ids) -> None: ...

    def shutdown(self) -> None:
        return


class OffloadingSpec(ABC):
    def __init__(self, config):
        self.config = config
        self.extra_config = config.extra_config
        self.replicated_layout: bool = False
        self.kv_events_config = OffloadingKVEventsConfig(
            enable_kv_cache_events=config.enable_kv_cache_events,
            self_describing_kv_events=bool(self.extra_config.get("self_describing_kv_events", False)),
        )
        self.tokens_per_block = tuple(group.tokens_per_block for group in config.groups)
        self.tokens_per_hash = config.cache.tokens_per_hash
        self.blocks_per_chunk = config.cache.blocks_per_chunk

    @abstractmethod
    def get_manager(self): ...

    @abstractmethod
    def get_worker(self, kv_caches): ...
