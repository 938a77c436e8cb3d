import pytest

import kvoffload


def test_remote_tier_options_round_trip_and_fingerprint():
    o = kvoffload.RemoteTierOptions("redis://127.0.0.1:6379/2", slot_bytes=4096, world_size=2,
                                    tensor_layout="layers=8", dtype="bf16")
    assert o.url == "redis://127.0.0.1:6379/2" and o.kind == "redis"
    assert o.nodes == [("127.0.0.1", 6379)]
    assert o.slot_bytes == 4096 and o.world_size == 2 and o.dtype == "bf16"
    assert o.lookup_timeout_ms == 50 and o.connections_per_node == 2
    o.validate()
    fp = o.fingerprint
    o.dtype = "fp8"
    assert o.fingerprint != fp
    o.lookup_timeout_ms = 20
    assert o.lookup_timeout_ms == 20
    assert "layout=layers=8" in o.geometry_description
    assert kvoffload.remote_value_bytes(4096) == 4160


def test_bad_urls_and_fields_name_what_is_wrong():
    with pytest.raises(kvoffload.Error, match="unknown scheme 'http'") as e:
        kvoffload.parse_remote_url("http://h:1")
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(kvoffload.Error, match="port 70000 is out of range") as e:
        kvoffload.RemoteTierOptions("redis://h:70000", slot_bytes=1)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    o = kvoffload.RemoteTierOptions("memcached://a:1,b:2", slot_bytes=2 << 20)
    with pytest.raises(kvoffload.Error, match="memcached's item size") as e:
        o.validate()
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    o.memcached_item_max = 4 << 20
    o.validate()
    o.connections_per_node = 0
    with pytest.raises(kvoffload.Error, match="connections_per_node 0") as e:
        o.validate()
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
    assert kvoffload.parse_remote_url("redis-cluster://a:1,b:2")["nodes"] == [("a", 1), ("b", 2)]


def test_credentials_are_parsed_and_never_shown(monkeypatch):
    d = kvoffload.parse_remote_url("rediss://alice:S3cret-pw@h:6380")
    assert d["user"] == "alice" and d["authenticates"] and d["tls"]
    assert d["password_source"] == "the URL"
    assert d["url"] == "rediss://alice:***@h:6380"
    assert "S3cret-pw" not in repr(d)
    monkeypatch.setenv("KVO_PY_TEST_PW", "S3cret-pw")
    o = kvoffload.RemoteTierOptions("redis://h:1?password_env=KVO_PY_TEST_PW", slot_bytes=1)
    assert o.url == "redis://h:1?password_env=KVO_PY_TEST_PW"
    with pytest.raises(kvoffload.Error, match="IPv6 host in brackets") as e:
        kvoffload.parse_remote_url("redis://:S3cret-pw@::1:6379")
    assert "S3cret-pw" not in str(e.value)
    assert e.value.code == kvoffload.ErrorCode.INVALID_ARGUMENT
