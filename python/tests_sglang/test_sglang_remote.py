# kvoffload.sglang.KvoffloadStorage's remote backend against SGLang's real code (the
# StorageBackendFactory, the MHA and MLA host pools on CPU tensors, the HiCacheController's
# backup / hit-query / prefetch paths, from KVOFFLOAD_SGLANG_SRC) and real stores started here:
# redis-server, a 3-master Redis Cluster and memcached on loopback ports.
import logging
import threading

import pytest
import sglang_env as env
import store_servers
import torch

from kvoffload.sglang import KvoffloadStorage

LAYOUTS = [("mha", "page_first"), ("mha", "page_first_direct"), ("mla", "page_first"),
           ("mla", "page_first_direct")]


@pytest.fixture(scope="module")
def redis():
    s = store_servers.Server("redis")
    yield s
    s.close()


@pytest.fixture(scope="module")
def cluster():
    c = store_servers.Cluster()
    yield c
    c.close()


@pytest.fixture(scope="module")
def memcached():
    s = store_servers.Server("memcached")
    yield s
    s.close()


@pytest.fixture
def fresh_redis():
    s = store_servers.Server("redis")
    yield s
    s.close()


@pytest.fixture(params=["redis", "memcached"])
def store(request):
    """A store of its own for a test that kills or freezes it."""
    s = store_servers.Server(request.param)
    yield s
    s.close()


def remote(url, **extra):
    return {"kvoffload_backend": "remote", "url": url, **extra}


def bounded(fn, *args):
    """Runs a backend call on a thread, as SGLang's storage threads do; a call that has not
    returned after 20 s (10x SGLang's smallest prefetch budget) fails the test as a hang."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), f"{fn.__name__} did not return"
    assert "error" not in out, f"{fn.__name__} raised {out.get('error')!r}"
    return out["value"]


def test_factory_builds_it_from_the_readme_config(redis):
    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url))
    assert type(b) is KvoffloadStorage
    assert b.interface_v1 and b.backend == "remote"
    # page_first MHA: a K and a V piece per page, as SGLang's get_page_buffer_meta gives them.
    ptrs, sizes = pool.get_page_buffer_meta(torch.arange(0, env.PAGE))
    assert (b.pieces, b.piece_bytes) == (2, sizes[0]) == (len(ptrs), sizes[0])
    b.close()


@pytest.mark.parametrize("kind,layout", LAYOUTS)
@pytest.mark.parametrize("store", ["redis", "cluster", "memcached"])
def test_controller_backup_then_prefetch_restores_every_page(store, kind, layout, request):
    server = request.getfixturevalue(store)
    pool = env.host_pool(kind, layout)
    b = env.backend(pool, remote(server.url, namespace=request.node.name))
    ctl = env.Controller(pool, b)
    n_pages = 300  # more than two of SGLang's 128-page batches
    tokens = list(range(n_pages * env.PAGE))
    hi = pool.alloc(len(tokens))
    ref = pool.kv_buffer.clone()
    assert ctl.backup(hi, tokens) == len(tokens)
    pool.kv_buffer.zero_()
    hit, done = ctl.prefetch(tokens, hi)
    assert (hit, done) == (len(tokens), len(tokens))
    assert env.pages_equal(pool, ref, hi)
    st = b.stats()
    assert st["stored"] == st["loaded"] == n_pages * b.pieces
    assert st["corrupt"] == 0
    b.close()


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_two_instances_share_pages_through_the_store(redis, kind, layout, request):
    ns = request.node.name
    pool_a, pool_b = env.host_pool(kind, layout), env.host_pool(kind, layout)
    a = env.backend(pool_a, remote(redis.url, namespace=ns))
    b = env.backend(pool_b, remote(redis.url, namespace=ns))
    tokens = list(range(40 * env.PAGE))
    hi_a, hi_b = pool_a.alloc(len(tokens)), pool_b.alloc(len(tokens))
    assert env.Controller(pool_a, a).backup(hi_a, tokens) == len(tokens)
    hit, done = env.Controller(pool_b, b).prefetch(tokens, hi_b)
    assert hit == done == len(tokens)
    # Instance B's pages (at its own host indices) hold what instance A wrote.
    pa, _ = pool_a.get_page_buffer_meta(hi_a)
    pb, sizes = pool_b.get_page_buffer_meta(hi_b)
    ua, ub = env.buffer(pool_a).flatten(), env.buffer(pool_b).flatten()
    ba, bb = pool_a.kv_buffer.data_ptr(), pool_b.kv_buffer.data_ptr()
    for x, y, s in zip(pa, pb, sizes):
        assert torch.equal(ua[x - ba:x - ba + s], ub[y - bb:y - bb + s])
    a.close()
    b.close()


def test_batch_exists_counts_consecutive_hits_from_the_start(redis, request):
    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url, namespace=request.node.name))
    keys = env.page_hashes(list(range(6 * env.PAGE)))
    hi = pool.alloc(6 * env.PAGE)
    stored = [0, 1, 3, 4, 5]  # page 2 missing
    for i in stored:
        assert b.batch_set_v1([keys[i]], hi[i * env.PAGE:(i + 1) * env.PAGE]) == [True]
    assert b.batch_exists(keys) == 2
    assert b.batch_exists(keys[3:]) == 3
    assert b.batch_exists([keys[2]] + keys[:2]) == 0
    assert b.exists(keys[0]) and not b.exists(keys[2])
    assert b.batch_exists([]) == 0
    b.close()


def test_a_page_missing_one_piece_is_a_miss(redis, request):
    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url, namespace=request.node.name))
    keys = env.page_hashes(list(range(2 * env.PAGE)))
    hi = pool.alloc(2 * env.PAGE)
    assert b.batch_set_v1(keys, hi) == [True, True]
    redis.cli("DEL", b.store_key(keys[1], piece=1))  # page 1's V piece
    fresh = env.backend(pool, remote(redis.url, namespace=request.node.name))
    assert fresh.batch_exists(keys) == 1
    assert fresh.batch_get_v1(keys, hi) == [True, False]
    b.close()
    fresh.close()


def test_a_flipped_byte_is_a_miss_and_leaves_the_page_alone(redis, request):
    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url, namespace=request.node.name))
    keys = env.page_hashes(list(range(2 * env.PAGE)))
    hi = pool.alloc(2 * env.PAGE)
    assert b.batch_set_v1(keys, hi) == [True, True]
    sk = b.store_key(keys[0], piece=0).encode()
    value = bytearray(redis.command(b"GET", sk))
    value[len(value) // 2] ^= 0x01  # one payload byte
    redis.command(b"SET", sk, bytes(value))
    env.randomize(pool)
    before = pool.kv_buffer.clone()
    assert b.batch_get_v1(keys, hi) == [False, True]
    ptrs, sizes = pool.get_page_buffer_meta(hi[:env.PAGE])
    base = pool.kv_buffer.data_ptr()
    k0 = ptrs[0] - base
    assert torch.equal(env.buffer(pool).flatten()[k0:k0 + sizes[0]],
                       before.view(torch.uint8).flatten()[k0:k0 + sizes[0]])
    assert b.stats()["corrupt"] == 1
    b.close()


@pytest.mark.parametrize("other", [{"model": "org/other-model"}, {"tp_size": 2},
                                   {"tp_rank": 1, "tp_size": 2}, {"pp": (0, 2)}, {"pp": (1, 2)},
                                   {"cp": (1, 2)}])
def test_another_model_or_tp_layout_never_reads_the_pages(redis, request, other):
    ns = request.node.name
    pool = env.host_pool()
    writer = env.backend(pool, remote(redis.url, namespace=ns))
    keys = env.page_hashes(list(range(3 * env.PAGE)))
    hi = pool.alloc(3 * env.PAGE)
    assert writer.batch_set_v1(keys, hi) == [True] * 3
    reader = env.backend(env.host_pool(), remote(redis.url, namespace=ns), **other)
    assert reader.batch_exists(keys) == 0
    assert reader.batch_get_v1(keys, hi) == [False] * 3
    assert reader.store_key(keys[0]) != writer.store_key(keys[0])
    # Another layout or dtype: other keys too.
    other_layout = env.backend(env.host_pool(layout="page_first_direct"),
                               remote(redis.url, namespace=ns))
    assert other_layout.batch_exists(keys) == 0
    other_dtype = env.backend(env.host_pool(dtype=torch.float16), remote(redis.url, namespace=ns))
    assert other_dtype.batch_exists(keys) == 0
    for x in (writer, reader, other_layout, other_dtype):
        x.close()


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_mla_rank_zero_writes_and_every_rank_reads(fresh_redis, layout):
    pools = [env.host_pool("mla", layout) for _ in range(2)]
    ranks = [env.backend(pools[r], remote(fresh_redis.url), tp_rank=r, tp_size=2) for r in (0, 1)]
    tokens = list(range(20 * env.PAGE))
    hi = [p.alloc(len(tokens)) for p in pools]
    # Rank 1 first: SGLang skips its backup (backup_skip), and a direct call writes nothing.
    assert env.Controller(pools[1], ranks[1]).backup(hi[1], tokens) == 0
    assert ranks[1].batch_set_v1(env.page_hashes(tokens), hi[1]) == [True] * 20
    assert fresh_redis.cli("DBSIZE") == b"0"
    assert env.Controller(pools[0], ranks[0]).backup(hi[0], tokens) == len(tokens)
    assert int(fresh_redis.cli("DBSIZE")) == 20  # one piece per MLA page
    ref = pools[0].kv_buffer.clone()
    hit, done = env.Controller(pools[1], ranks[1]).prefetch(tokens, hi[1])
    assert hit == done == len(tokens)
    # Rank 1's pages at its indices hold rank 0's bytes.
    p0, sizes = pools[0].get_page_buffer_meta(hi[0])
    p1, _ = pools[1].get_page_buffer_meta(hi[1])
    r0, r1 = ref.view(torch.uint8).flatten(), env.buffer(pools[1]).flatten()
    b0, b1 = pools[0].kv_buffer.data_ptr(), pools[1].kv_buffer.data_ptr()
    for x, y, s in zip(p0, p1, sizes):
        assert torch.equal(r0[x - b0:x - b0 + s], r1[y - b1:y - b1 + s])
    for r in ranks:
        r.close()


def test_legacy_interface_and_draft_pages(redis, request):
    """interface_v1: 0 — SGLang copies flat pages through batch_set / batch_get, and sends draft
    pages ("<hash>.draft") that way in either mode."""
    ns = request.node.name
    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url, namespace=ns, interface_v1=0))
    assert not b.interface_v1 and b.pieces == 1
    ctl = env.Controller(pool, b)
    tokens = list(range(130 * env.PAGE))
    hi = pool.alloc(len(tokens))
    ref = pool.kv_buffer.clone()
    assert ctl.backup(hi, tokens) == len(tokens)
    pool.kv_buffer.zero_()
    assert ctl.prefetch(tokens, hi) == (len(tokens), len(tokens))
    assert env.pages_equal(pool, ref, hi)
    # Draft pages of another size (a draft model's pool), through the legacy calls.
    draft = env.host_pool(layers=1)
    keys = [f"{h}.draft" for h in env.page_hashes(tokens[:3 * env.PAGE])]
    pages = [draft.get_data_page(i * env.PAGE) for i in range(3)]
    assert b.batch_set(keys, pages)
    dst = [draft.get_dummy_flat_data_page() for _ in keys]
    got = b.batch_get(keys + ["absent.draft"], dst + [draft.get_dummy_flat_data_page()])
    assert got[3] is None and all(torch.equal(g.view(torch.uint8), p.view(torch.uint8))
                                  for g, p in zip(got[:3], pages))  # random bytes hold NaNs
    assert b.get(keys[0], draft.get_dummy_flat_data_page()) is not None
    assert b.set("one-page", pool.get_data_page(0)) and b.exists("one-page")
    # The v1 and the legacy forms never answer for each other.
    v1 = env.backend(pool, remote(redis.url, namespace=ns))
    assert v1.batch_exists(env.page_hashes(tokens)) == 0
    b.close()
    v1.close()


def _calls_are_misses(b, pool, keys, hi):
    assert bounded(b.batch_exists, keys) == 0
    assert bounded(b.batch_get_v1, keys, hi) == [False] * len(keys)
    assert bounded(b.batch_set_v1, keys, hi) == [False] * len(keys)
    dst = [pool.get_dummy_flat_data_page()]
    assert bounded(b.batch_get, keys[:1], dst) == [None]


def _until(predicate, what):
    import time

    for _ in range(400):  # the breaker's backoff (100 ms doubling to 5 s) lets the node back
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(what)


def test_a_killed_store_gives_misses_and_is_used_again_when_back(store, caplog):
    pool = env.host_pool()
    b = env.backend(pool, remote(store.url, breaker_backoff_max_ms=200))
    keys = env.page_hashes(list(range(128 * env.PAGE)))  # one full SGLang batch
    hi = pool.alloc(len(keys) * env.PAGE)
    assert b.batch_set_v1(keys[:1], hi[:env.PAGE]) == [True]
    store.kill9()
    with caplog.at_level(logging.WARNING, logger="kvoffload.sglang"):
        for _ in range(3):
            _calls_are_misses(b, pool, keys[1:], hi[env.PAGE:])
    # Failed backups say why (rate-limited), with the store's key and the tier's reason.
    assert "batch_set_v1: 127 of 127 pages failed (last: failed: kvo1:" in caplog.text
    assert bounded(b.batch_get_v1, keys[:1], hi[:env.PAGE]) == [False]
    store.restart()  # empty
    _until(lambda: b.batch_set_v1(keys[1:2], hi[env.PAGE:2 * env.PAGE]) == [True],
           "the store came back but batch_set_v1 kept failing")
    assert b.batch_get_v1(keys[1:2], hi[env.PAGE:2 * env.PAGE]) == [True]
    b.close()


def test_a_frozen_store_gives_misses_within_the_deadlines(store):
    pool = env.host_pool()
    b = env.backend(pool, remote(store.url, breaker_backoff_max_ms=200,
                                 put_timeout_ms=1000))
    keys = env.page_hashes(list(range(128 * env.PAGE)))
    hi = pool.alloc(len(keys) * env.PAGE)
    assert b.batch_set_v1(keys[:4], hi[:4 * env.PAGE]) == [True] * 4
    store.freeze()
    try:
        _calls_are_misses(b, pool, keys[4:], hi[4 * env.PAGE:])
        assert bounded(b.batch_get_v1, keys[:4], hi[:4 * env.PAGE]) == [False] * 4
    finally:
        store.thaw()
    _until(lambda: b.batch_get_v1(keys[:4], hi[:4 * env.PAGE]) == [True] * 4,
           "the store thawed but batch_get_v1 kept missing")
    b.close()


def test_the_password_is_never_printed(caplog, tmp_path):
    server = store_servers.Server("redis", ["--requirepass", "s3cret-pw"])
    try:
        url = f"redis://:s3cret-pw@{server.endpoint}"
        with caplog.at_level(logging.DEBUG):
            pool = env.host_pool()
            b = env.backend(pool, remote(url))
            keys = env.page_hashes(list(range(2 * env.PAGE)))
            hi = pool.alloc(2 * env.PAGE)
            assert b.batch_set_v1(keys, hi) == [True, True]
            assert b.batch_exists(keys) == 2
        assert "s3cret-pw" not in caplog.text
        assert "s3cret-pw" not in repr(b.url) and "s3cret-pw" not in str(b.stats())
        assert server.endpoint in b.url
        b.close()
        # The secret from a file named in the URL (what docs/SGLANG.md advises: SGLang logs its
        # server arguments, the extra config included).
        secret = tmp_path / "redis-password"
        secret.write_text("s3cret-pw\n")
        c = env.backend(pool, remote(f"redis://{server.endpoint}?password_file={secret}"))
        assert c.batch_exists(keys) == 2
        c.close()
    finally:
        server.close()


def test_a_wrong_password_is_refused_at_attach():
    server = store_servers.Server("redis", ["--requirepass", "right-pw"])
    try:
        with pytest.raises(Exception, match="authentication failed") as info:
            env.backend(env.host_pool(), remote(f"redis://:wrong-pw@{server.endpoint}"))
        assert "wrong-pw" not in str(info.value)
    finally:
        server.close()


def test_get_stats_is_sglang_storage_metrics(redis, request):
    from sglang.srt.observability.metrics_collector import StorageMetrics

    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url, namespace=request.node.name), metrics=True)
    keys = env.page_hashes(list(range(5 * env.PAGE)))
    hi = pool.alloc(5 * env.PAGE)
    b.batch_set_v1(keys, hi)
    b.batch_get_v1(keys[:3], hi[:3 * env.PAGE])
    m = b.get_stats()
    assert isinstance(m, StorageMetrics)
    assert m.backup_pgs == [5] and m.prefetch_pgs == [3]
    assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
    assert b.get_stats().backup_pgs == []  # drained, as SGLang's collector expects
    b.close()


def test_clear_forgets_and_close_turns_calls_into_misses(redis, request):
    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url, namespace=request.node.name))
    keys = env.page_hashes(list(range(2 * env.PAGE)))
    hi = pool.alloc(2 * env.PAGE)
    assert b.batch_set_v1(keys, hi) == [True, True]
    b.clear()
    assert b.stats()["stored"] == 0  # the tiers were reopened
    assert b.batch_exists(keys) == 2  # the shared values stay for the other instances
    b.close()
    b.close()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys, hi) == [False, False]
    assert b.batch_set_v1(keys, hi) == [False, False]
    assert b.get(keys[0], pool.get_dummy_flat_data_page()) is None


@pytest.mark.parametrize("extra,match", [
    ({"kvoffload_backend": "nope"}, r"kvoffload_backend='nope' must be one of \['remote', "
                                    r"'file', 'pool'\]"),
    ({"kvoffload_backend": "pool"}, "'capacity_bytes' is required"),
    ({"kvoffload_backend": "remote"}, "'url' is required"),
    (remote("redis://127.0.0.1:1", colour="red"), r"unknown keys \['colour'\]"),
    (remote("redis://127.0.0.1:1", get_timeout_ms=2500), "get_timeout_ms=2500 exceeds 2000 ms"),
    (remote("redis://127.0.0.1:1", connect_timeout_ms=2001), "connect_timeout_ms=2001 exceeds"),
    (remote("redis://127.0.0.1:1", lookup_timeout_ms=5000), "lookup_timeout_ms=5000 exceeds"),
    (remote("redis://127.0.0.1:1", lookup_timeout_ms=-1), "lookup_timeout_ms=-1 must be"),
    (remote("ftp://127.0.0.1:1"), "ftp"),
])
def test_bad_configuration_is_refused_naming_the_value(extra, match):
    with pytest.raises(Exception, match=match):
        env.backend(env.host_pool(), extra)


def test_zero_copy_refuses_a_layout_it_does_not_serve():
    with pytest.raises(ValueError, match="interface_v1 with the host layout 'layer_first'"):
        env.backend(env.host_pool(layout="layer_first"), remote("redis://127.0.0.1:1"))


# Adapted from SGLang's test_mooncake_group_semantics.py (the key and pointer-layout checks):
# piece j of page i is the bytes at get_page_buffer_meta's pointer i * pieces + j, stored under
# its own key, and a page with one piece already held gets the other written and reports True.
@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_each_piece_is_the_bytes_at_its_pointer(redis, kind, layout, request):
    pool = env.host_pool(kind, layout)
    b = env.backend(pool, remote(redis.url, namespace=request.node.name))
    keys = ["page0", "page1", "page2"]
    hi = pool.alloc(3 * env.PAGE)
    ptrs, sizes = pool.get_page_buffer_meta(hi)
    assert len(ptrs) == 3 * b.pieces == 3 * (1 if kind == "mla" else 2)
    assert b.batch_set_v1(keys, hi) == [True] * 3
    flat, base = env.buffer(pool).flatten(), pool.kv_buffer.data_ptr()
    store_keys = set()
    for i, key in enumerate(keys):
        for j in range(b.pieces):
            sk = b.store_key(key, piece=j)
            store_keys.add(sk)
            value = redis.command(b"GET", sk.encode())
            p, s = ptrs[i * b.pieces + j], sizes[i * b.pieces + j]
            assert value[-s:] == bytes(flat[p - base:p - base + s].numpy())  # header, then piece
    assert len(store_keys) == 3 * b.pieces
    # One piece of page 1 lost: a second backup writes it again and reports the page stored.
    redis.cli("DEL", b.store_key("page1", piece=b.pieces - 1))
    fresh = env.backend(pool, remote(redis.url, namespace=request.node.name))
    assert fresh.batch_exists(keys) == 1
    assert fresh.batch_set_v1(keys, hi) == [True] * 3
    assert fresh.batch_exists(keys) == 3
    b.close()
    fresh.close()


def test_a_backup_larger_than_the_send_queue_goes_in_waves(redis, request):
    # SGLang backs up 128 pages a call (1 GiB of 8 MiB pages); the remote tier refuses puts beyond
    # max_queued_bytes at once, so the backend sends them in waves of half of it.
    pool = env.host_pool()
    b = env.backend(pool, remote(redis.url, namespace=request.node.name,
                                 max_queued_bytes=8 * 1024, max_inflight_bytes=8 * 1024))
    keys = env.page_hashes(list(range(128 * env.PAGE)))
    hi = pool.alloc(128 * env.PAGE)
    assert b.batch_set_v1(keys, hi) == [True] * 128
    assert b.batch_exists(keys) == 128
    assert b.stats()["put_errors"] == 0 and b.stats()["tasks"] >= 20  # 20 waves of 4 KiB
    b.close()


def test_pages_larger_than_memcacheds_items_are_refused_at_attach(memcached):
    # A 256-byte piece plus its 64-byte header does not fit items of 200 bytes: refused when SGLang
    # attaches the backend, naming the limit, not page by page later.
    with pytest.raises(Exception, match="a value of 320 bytes .* exceeds memcached's item size 200"):
        env.backend(env.host_pool(), remote(memcached.url, memcached_item_max=200))


def test_a_bad_url_is_refused_without_printing_its_password(caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(Exception) as info:
        env.backend(env.host_pool(), remote("redis://:pw-in-url@127.0.0.1:notaport"))
    assert "port 'notaport' is not a number" in str(info.value)
    assert "pw-in-url" not in str(info.value) and "pw-in-url" not in caplog.text
