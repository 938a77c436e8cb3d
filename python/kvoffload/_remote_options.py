"""The remote tier's tunables as engine configuration keys, shared by the vLLM secondary tier
(kvoffload.vllm_tiers) and the SGLang storage backend (kvoffload.sglang): one list of names, one
check, so both engines accept the same keys with the same meaning (kvoffload::RemoteTierOptions).
"""

from __future__ import annotations

from typing import Any

# Milliseconds (ints), then counts and byte sizes (ints); each a RemoteTierOptions attribute.
MS_KEYS = ("connect_timeout_ms", "lookup_timeout_ms", "get_timeout_ms", "put_timeout_ms",
           "breaker_backoff_ms", "breaker_backoff_max_ms", "negative_ttl_ms")
INT_KEYS = ("connections_per_node", "max_inflight_bytes", "max_queued_bytes",
            "breaker_failures", "memcached_item_max")
KEYS = (*MS_KEYS, *INT_KEYS)


def non_negative_int(name: str, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what}: {name}={value!r} must be an integer >= 0")
    return value


def apply(opts, options: dict, what: str) -> None:
    """Sets each of KEYS that `options` holds on a kvoffload.RemoteTierOptions."""
    for key in KEYS:
        if key in options:
            setattr(opts, key, non_negative_int(key, options[key], what))
