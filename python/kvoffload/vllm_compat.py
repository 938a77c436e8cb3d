"""The vLLM commits kvoffload.vllm supports, and when vLLM's block hashes agree across processes.

- :data:`SUPPORTED_VLLM_COMMITS`: the commits whose offloading interface and engine loop the tests
  run against (docs/VLLM.md, "Supported vLLM commits"). :func:`check_vllm_version` says, once per process, when the vLLM
  in use is another one; a vLLM that lacks part of the interface is refused earlier, when
  kvoffload.vllm is imported.
- :func:`check_block_hashes_shareable`: offload keys are vLLM's block hashes, chained from
  ``kv_cache_utils.NONE_HASH``. Processes (data-parallel replicas, several ``vllm serve``) can only
  share stored blocks when they compute the same NONE_HASH, and vLLM draws it at random unless told
  otherwise; this says when that is so, and refuses sharing, naming what to set, when it is not.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

logger = logging.getLogger("kvoffload.vllm")

# Full commit -> its date. The first is the one vllm.VLLM_COMMIT has always named.
SUPPORTED_VLLM_COMMITS = {
    "017e9f4448b700e85ee16023287b025693c72b9e": "2026-08-17",
    "7cfb97e33791a348cd5d7b622cca521d82d8399f": "2026-08-20",
}

# vLLM's prefix_caching_hash_algo values (vllm/config/cache.py, PrefixCachingHashAlgo) and the
# ones it treats as collision resistant (kv_cache_utils._NON_CRYPTO_HASH_FUNCTIONS: the others).
HASH_FUNCTIONS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
CRYPTOGRAPHIC_HASH_FUNCTIONS = ("sha256", "sha256_cbor")

# setuptools-scm's local version part: "0.11.1.dev123+g017e9f444.d20260817".
_SCM_COMMIT = re.compile(r"\+g([0-9a-f]{7,40})\b")
_reported: set[str] = set()


def commit_of(version: str) -> str | None:
    """The (abbreviated) commit a vLLM version string names, or None (a source tree says 'dev')."""
    m = _SCM_COMMIT.search(str(version))
    return m.group(1) if m else None


def supported_commit(version: str) -> str | None:
    """The supported commit the version names, or None."""
    short = commit_of(version)
    if short is None:
        return None
    return next((c for c in SUPPORTED_VLLM_COMMITS if c.startswith(short)), None)


def check_vllm_version(version: str) -> str | None:
    """Logs (once per version) when `version` is not a supported commit; returns the supported
    commit it is, or None. Not an error: the interface kvoffload.vllm uses was checked on import,
    and vLLM versions between and after the supported ones usually keep it."""
    found = supported_commit(version)
    if found is None and version not in _reported:
        _reported.add(version)
        short = commit_of(version)
        supported = ", ".join(c[:10] for c in SUPPORTED_VLLM_COMMITS)
        if short is None:
            logger.info("kvoffload: vLLM reports version %r and no commit; kvoffload.vllm is "
                        "tested against vLLM commits %s", version, supported)
        else:
            logger.warning(
                "kvoffload: vLLM %s (commit %s) is not a commit kvoffload.vllm is tested against "
                "(%s); its offloading interface was found complete, but check the results "
                "(docs/VLLM.md: supported vLLM commits)", version, short, supported)
    return found


def none_hash_is_fixed_by_default(kv_cache_utils) -> bool:
    """True when vLLM derives NONE_HASH from a fixed default seed for cryptographic hash
    functions when PYTHONHASHSEED is unset (7cfb97e3 on: DEFAULT_NONE_HASH_SEED); False when it
    draws NONE_HASH from os.urandom then, whatever the hash function (017e9f4448)."""
    return hasattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED")


def block_hashes_shareable(hash_fn_name: str, environ: Mapping[str, str],
                           fixed_default_seed: bool) -> str | None:
    """None when processes started with `environ` compute the same block hashes for the same
    tokens with `hash_fn_name`; otherwise why not. `fixed_default_seed`: see
    none_hash_is_fixed_by_default."""
    if hash_fn_name not in HASH_FUNCTIONS:
        raise ValueError(f"kvoffload: prefix_caching_hash_algo={hash_fn_name!r} is not one of "
                         f"vLLM's {list(HASH_FUNCTIONS)}")
    if environ.get("PYTHONHASHSEED") is not None:
        return None  # NONE_HASH = hash_fn(PYTHONHASHSEED) at every commit
    if fixed_default_seed and hash_fn_name in CRYPTOGRAPHIC_HASH_FUNCTIONS:
        return None
    if fixed_default_seed:
        why = (f"vLLM seeds the block-hash chain of the non-cryptographic {hash_fn_name} with "
               "random bytes of each process when PYTHONHASHSEED is unset")
        fix = "or use prefix_caching_hash_algo sha256 or sha256_cbor"
    else:
        why = ("this vLLM seeds the block-hash chain (NONE_HASH) with os.urandom in each process "
               f"when PYTHONHASHSEED is unset, whatever the hash function ({hash_fn_name} here)")
        fix = "(or move to vLLM 7cfb97e3 or later with sha256 or sha256_cbor)"
    return (f"{why}, so no two processes' keys agree; set PYTHONHASHSEED to one value in the "
            f"environment of every process that shares blocks {fix}")


def block_hash_sharing_problem(hash_fn_name: str, environ: Mapping[str, str] | None = None,
                               kv_cache_utils=None) -> str | None:
    """block_hashes_shareable for the vLLM whose vllm.v1.core.kv_cache_utils is given (default:
    the installed one) and `environ` (default os.environ)."""
    if kv_cache_utils is None:
        from vllm.v1.core import kv_cache_utils
    return block_hashes_shareable(hash_fn_name, os.environ if environ is None else environ,
                                  none_hash_is_fixed_by_default(kv_cache_utils))


def check_block_hashes_shareable(hash_fn_name: str, environ: Mapping[str, str] | None = None,
                                 kv_cache_utils=None) -> None:
    """Raises ValueError, saying what to set, unless processes started with `environ` (default
    os.environ) compute the same block hashes with `hash_fn_name` under the vLLM whose
    vllm.v1.core.kv_cache_utils is given (default: the installed one). Same values of
    PYTHONHASHSEED in every process are the caller's part: one process cannot see the others."""
    why = block_hash_sharing_problem(hash_fn_name, environ, kv_cache_utils)
    if why is not None:
        raise ValueError(f"kvoffload: blocks cannot be shared between processes: {why}")
