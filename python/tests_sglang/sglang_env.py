"""What the SGLang backend's tests build from SGLang's real classes: host pools (MHA and MLA, on
CPU tensors), the backend through SGLang's StorageBackendFactory, and SGLang's HiCacheController
storage paths (backup, hit query, prefetch) driven without its GPU-side constructor."""

from __future__ import annotations

import hashlib
import types

import sglang_real

sglang_real.require()

import torch  # noqa: E402  (after the shims)
from sglang.srt.managers import cache_controller as cc  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

PAGE = 4  # tokens per page (SGLang's default is 64; small pages keep the tests fast)

# docs/SGLANG.md's extra config, as SGLang's --hicache-storage-backend-extra-config passes it.
BASE_CONFIG = {"backend_name": "kvoffload", "module_path": "kvoffload.sglang",
               "class_name": "KvoffloadStorage", "interface_v1": 1}


def host_pool(kind: str = "mha", layout: str = "page_first", tokens: int = 2048,
              layers: int = 2, heads: int = 2, head_dim: int = 8, dtype=torch.bfloat16,
              page_size: int = PAGE):
    """SGLang's real host pool on CPU, filled with random bytes."""
    common = dict(store_dtype=dtype, dtype=dtype, size=tokens, start_layer=0, end_layer=layers,
                  layer_num=layers, device="cpu", layer_shard_enabled=False)
    if kind == "mha":
        dev = types.SimpleNamespace(head_num=heads, head_dim=head_dim, **common)
        pool = MHATokenToKVPoolHost(dev, 1.0, 0, page_size, layout, pin_memory=False,
                                    device="cpu", allocator_type="default")
    else:
        dev = types.SimpleNamespace(kv_lora_rank=16, qk_rope_head_dim=8, **common)
        pool = MLATokenToKVPoolHost(dev, 1.0, 0, page_size, layout, pin_memory=False,
                                    device="cpu", allocator_type="default")
    randomize(pool)
    return pool


def buffer(pool) -> torch.Tensor:
    return pool.kv_buffer.view(torch.uint8)


def randomize(pool) -> None:
    b = buffer(pool)
    b.copy_(torch.randint(0, 256, b.shape, dtype=torch.uint8))


def storage_config(extra: dict, *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
                   model: str = "org/model-7b", metrics: bool = False, layout="page_first",
                   pp=(0, 1), cp=(0, 1)):
    return HiCacheStorageConfig(tp_rank, tp_size, pp[0], pp[1], cp[0], cp[1], mla, metrics,
                                layout == "page_first", model,
                                extra_config={**BASE_CONFIG, **extra})


def backend(pool, extra: dict, **kw):
    """The backend as SGLang's controller makes it: the factory, then register_mem_pool_host."""
    cfg = storage_config(extra, mla=isinstance(pool, MLATokenToKVPoolHost), layout=pool.layout,
                         **kw)
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    return b


def page_hashes(tokens, page_size=PAGE):
    """A chain of page hashes like SGLang's get_hash_str (sha256 of the prior hash and tokens)."""
    out, prior = [], ""
    for i in range(0, len(tokens), page_size):
        prior = hashlib.sha256((prior + str(tokens[i:i + page_size])).encode()).hexdigest()
        out.append(prior)
    return out


class Controller:
    """SGLang's HiCacheController, its storage methods unchanged, over one host pool and backend
    (its constructor needs device pools and process groups; the attributes its storage paths read
    are set as attach_storage_backend sets them)."""

    def __init__(self, pool, storage, config=None):
        config = config or storage.config  # KvoffloadStorage keeps it; HiCacheFile does not
        ctl = object.__new__(cc.HiCacheController)
        ctl.storage_backend, ctl.mem_pool_host = storage, pool
        ctl.page_size = pool.page_size
        ctl.has_draft = False
        ctl.storage_config = config
        ctl.backup_skip = config.is_mla_model and config.tp_rank != 0
        ctl.get_hash_str = lambda toks, prior, page_size: page_hashes(toks, page_size)
        if config.extra_config.get("interface_v1"):
            ctl.page_get_func, ctl.page_set_func = ctl._page_get_zero_copy, ctl._page_set_zero_copy
        else:
            ctl.page_get_func, ctl.page_set_func = ctl._generic_page_get, ctl._generic_page_set
        self.ctl = ctl
        self.pool = pool

    def backup(self, host_indices, tokens) -> int:
        """What backup_thread_func does with one write: returns the tokens it completed."""
        op = cc.StorageOperation(host_indices, tokens,
                                 hash_value=page_hashes(tokens, self.ctl.page_size))
        if not self.ctl.backup_skip:
            self.ctl._page_backup(op)
        return op.completed_tokens

    def prefetch(self, tokens, host_indices):
        """What prefetch_thread_func and prefetch_io_aux_func do with one request: the hit query,
        then the transfer into host_indices. Returns (hit tokens, completed tokens)."""
        op = cc.PrefetchOperation("req", tokens)
        hashes, hit = self.ctl._storage_hit_query(op)
        op.hash_value = hashes
        op.host_indices = host_indices[:hit]
        if hit:
            self.ctl._page_transfer(op)
        return hit, op.completed_tokens


def pages_equal(pool, ref: torch.Tensor, host_indices) -> bool:
    """The pages at host_indices hold ref's bytes (ref: a clone of pool.kv_buffer)."""
    ptrs, sizes = pool.get_page_buffer_meta(host_indices)
    base = pool.kv_buffer.data_ptr()
    flat_now, flat_ref = buffer(pool).flatten(), ref.view(torch.uint8).flatten()
    return all(torch.equal(flat_now[p - base:p - base + s], flat_ref[p - base:p - base + s])
               for p, s in zip(ptrs, sizes))
