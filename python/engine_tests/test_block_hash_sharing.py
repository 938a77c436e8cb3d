# When do two vLLM processes compute the same block hashes (the offload keys) for the same tokens?
# Measured here with vLLM's own hasher (get_request_block_hasher on a Request, after vLLM's
# init_none_hash) in two fresh interpreters per setting, for each hash function vLLM offers, with
# and without PYTHONHASHSEED; kvoffload.vllm_compat's verdict must match what was measured, and
# check_block_hashes_shareable must refuse exactly the settings whose hashes differ.
# Runs under the vLLM harness (tools/vllm-engine-tests.sh), once per vLLM tree.
import json
import os
import subprocess
import sys

import pytest

from kvoffload import vllm_compat
from kvoffload.vllm import check_block_hashes_shareable
from vllm.v1.core import kv_cache_utils

# Prints {hash function: [hex of each block hash]} of one 64-token prompt, hashed the way the
# engine core does (init_none_hash once per process and function, then the request's hasher).
CHILD = r"""
import json, sys
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

out = {}
for name in sys.argv[1:]:
    fn = get_hash_fn_by_name(name)
    init_none_hash(fn)
    req = Request(request_id="r", prompt_token_ids=list(range(100, 164)),
                  sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                  mm_features=None, block_hasher=get_request_block_hasher(16, fn))
    out[name] = [bytes(h).hex() for h in req.block_hashes]
print(json.dumps(out))
"""


def hashes_in_a_new_process(seed):
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    done = subprocess.run([sys.executable, "-c", CHILD, *vllm_compat.HASH_FUNCTIONS], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seed", [None, "7"], ids=["PYTHONHASHSEED-unset", "PYTHONHASHSEED-7"])
def test_the_verdict_matches_two_real_processes(seed):
    first, second = hashes_in_a_new_process(seed), hashes_in_a_new_process(seed)
    environ = {} if seed is None else {"PYTHONHASHSEED": seed}
    fixed = vllm_compat.none_hash_is_fixed_by_default(kv_cache_utils)
    for name in vllm_compat.HASH_FUNCTIONS:
        assert len(first[name]) == 4
        same = first[name] == second[name]
        verdict = vllm_compat.block_hashes_shareable(name, environ, fixed)
        assert (verdict is None) == same, (name, seed, verdict)
        if same:
            check_block_hashes_shareable(name, environ)
        else:
            with pytest.raises(ValueError, match=r"cannot be shared between processes: .*"
                               r"set PYTHONHASHSEED to one value"):
                check_block_hashes_shareable(name, environ)


def test_what_each_supported_commit_does():
    # 017e9f4448: NONE_HASH = os.urandom(32) without PYTHONHASHSEED, for every function.
    # 7cfb97e3: a fixed default seed for sha256 / sha256_cbor; xxhash* stay random.
    fixed = vllm_compat.none_hash_is_fixed_by_default(kv_cache_utils)
    assert fixed == (getattr(kv_cache_utils, "get_none_hash_seed", None) is not None)
    unset_ok = [n for n in vllm_compat.HASH_FUNCTIONS
                if vllm_compat.block_hashes_shareable(n, {}, fixed) is None]
    assert unset_ok == (["sha256", "sha256_cbor"] if fixed else [])
    if not fixed:
        with pytest.raises(ValueError, match=r"os\.urandom in each process when PYTHONHASHSEED "
                           r"is unset, whatever the hash function \(sha256 here\)"):
            check_block_hashes_shareable("sha256", {})
    with pytest.raises(ValueError, match=r"xxhash_cbor"):
        check_block_hashes_shareable("xxhash_cbor", {})
    with pytest.raises(ValueError, match=r"prefix_caching_hash_algo='md5' is not one of"):
        check_block_hashes_shareable("md5", {"PYTHONHASHSEED": "1"})
