# kvoffload.vllm_compat without vLLM: which version strings name a supported commit and what is
# said about the others, and the block-hash sharing table (python/engine_tests/
# test_block_hash_sharing.py checks the same table against two real vLLM processes per commit).
import logging

import pytest

from kvoffload import vllm_compat as compat

OLD, NEW = list(compat.SUPPORTED_VLLM_COMMITS)


def test_supported_commits_are_the_two_trees():
    assert OLD.startswith("017e9f4448") and NEW.startswith("7cfb97e3")
    assert all(len(c) == 40 for c in compat.SUPPORTED_VLLM_COMMITS)


@pytest.mark.parametrize("version,commit", [
    ("0.11.1.dev123+g017e9f444.d20260817", OLD),
    ("0.11.1rc2.dev7+g7cfb97e33", NEW),
    ("0.11.1.dev9+gdeadbeef1", None),
    ("dev", None),
    ("0.11.0", None),
])
def test_the_commit_a_version_names(version, commit):
    assert compat.supported_commit(version) == commit


def test_another_commit_is_warned_about_once_and_a_supported_one_not(caplog):
    caplog.set_level(logging.INFO, logger="kvoffload.vllm")
    assert compat.check_vllm_version("0.11.1.dev5+g017e9f4448") == OLD
    assert not caplog.records
    assert compat.check_vllm_version("0.12.0.dev1+gabcdef012") is None
    compat.check_vllm_version("0.12.0.dev1+gabcdef012")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "(commit abcdef012) is not a commit kvoffload.vllm is tested against (017e9f4448, 7cfb97e337)" in warnings[0].getMessage()
    caplog.clear()
    assert compat.check_vllm_version("dev-tree-test") is None
    (info,) = caplog.records
    assert info.levelno == logging.INFO and "reports version 'dev-tree-test' and no commit" in info.getMessage()


@pytest.mark.parametrize("fixed", [False, True], ids=["017e9f4448", "7cfb97e3"])
@pytest.mark.parametrize("name", compat.HASH_FUNCTIONS)
def test_sharing_table(fixed, name):
    assert compat.block_hashes_shareable(name, {"PYTHONHASHSEED": "0"}, fixed) is None
    why = compat.block_hashes_shareable(name, {}, fixed)
    if fixed and name in ("sha256", "sha256_cbor"):
        assert why is None
    else:
        assert "set PYTHONHASHSEED to one value in the environment of every process" in why
        assert (name in why) and (("non-cryptographic" in why) == fixed)


def test_an_unknown_hash_function_is_refused():
    with pytest.raises(ValueError, match=r"prefix_caching_hash_algo='blake3' is not one of vLLM's \['sha256', 'sha256_cbor', 'xxhash', 'xxhash_cbor'\]"):
        compat.block_hashes_shareable("blake3", {}, True)


def test_check_names_the_hash_function_and_what_to_set():
    class Old:  # kv_cache_utils at 017e9f4448: no DEFAULT_NONE_HASH_SEED
        pass

    class New:
        DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

    compat.check_block_hashes_shareable("sha256", {}, kv_cache_utils=New)
    with pytest.raises(ValueError, match=r"blocks cannot be shared between processes: this vLLM "
                       r"seeds the block-hash chain \(NONE_HASH\) with os.urandom .*\(sha256 here\)"):
        compat.check_block_hashes_shareable("sha256", {}, kv_cache_utils=Old)
    with pytest.raises(ValueError, match=r"non-cryptographic xxhash .* or use prefix_caching_hash_algo sha256"):
        compat.check_block_hashes_shareable("xxhash", {}, kv_cache_utils=New)
    compat.check_block_hashes_shareable("xxhash", {"PYTHONHASHSEED": "3"}, kv_cache_utils=Old)
