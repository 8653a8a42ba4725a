"""The Redis URL shapes (single, TLS, socket, Sentinel), the password given apart from the
URL, and what bad URLs are told: never with their password."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from hark.cluster import open_store
from hark.cluster.redis import RedisStore
from hark.cluster.redis_url import parse_redis_url, with_password
from hark.config import ConfigError, load_settings

SECRET = "fleet-secret-of-the-redis-url-tests-0123"
PASSWORD = "pw-Secret/with:odd@chars%"


def test_a_single_redis() -> None:
    target = parse_redis_url("redis://hark:pw-1@redis.internal:6380/2")
    assert not target.uses_sentinel and not target.tls
    assert target.connection == {
        "username": "hark",
        "password": "pw-1",
        "host": "redis.internal",
        "port": 6380,
        "db": 2,
    }
    assert target.description == "redis://hark@redis.internal:6380/2"
    assert parse_redis_url("redis://redis.internal").connection == {
        "host": "redis.internal",
        "port": 6379,
    }


def test_tls_with_a_private_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    target = parse_redis_url(f"rediss://:pw-1@10.0.0.5:6379/0?ssl_ca_certs={ca}")
    assert target.tls
    assert target.connection["ssl_ca_certs"] == str(ca)
    assert target.description == "rediss://10.0.0.5:6379/0"


def test_sentinel() -> None:
    target = parse_redis_url(
        "redis+sentinel://hark:pw-1@s1.internal:26380,s2.internal,[fd00::7]:26381/mymaster/3"
        "?sentinel_password=pw-2"
    )
    assert target.uses_sentinel and not target.tls
    assert target.sentinels == (("s1.internal", 26380), ("s2.internal", 26379), ("fd00::7", 26381))
    assert target.master == "mymaster"
    assert target.connection == {"username": "hark", "password": "pw-1", "db": 3}
    # The Sentinels' own password is theirs alone; Redis's stays Redis's.
    assert target.sentinel_connection == {"password": "pw-2"}
    assert target.description == (
        "redis+sentinel://hark@s1.internal:26380,s2.internal:26379,[fd00::7]:26381/mymaster/3"
    )
    assert set(target.secrets) == {"pw-1", "pw-2"}
    assert "pw-1" not in repr(target) and "pw-2" not in repr(target)


def test_sentinel_over_tls_trusts_the_same_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    target = parse_redis_url(f"rediss+sentinel://s1:26379/mymaster?ssl_ca_certs={ca}")
    assert target.tls
    assert target.sentinel_connection == {"ssl": True, "ssl_ca_certs": str(ca)}
    assert target.connection == {"ssl_ca_certs": str(ca)}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://:pw-1@10.0.0.5:6379/0", "starts with redis://"),
        ("redis+sentinel://:pw-1@s1:26379", "no master name"),
        ("redis+sentinel://:pw-1@s1:26379/", "no master name"),
        ("redis+sentinel://:pw-1@/mymaster", "no Sentinel address"),
        ("redis+sentinel://:pw-1@s1:26379,/mymaster", "no host"),
        ("redis+sentinel://:pw-1@s1:port/mymaster", "bad port"),
        ("redis+sentinel://:pw-1@fd00::7:26379/mymaster", "in brackets"),
        ("redis+sentinel://:pw-1@s1/mymaster/zero", "the database is a number"),
        ("redis://:pw-1@10.0.0.5:99999/0", "bad port"),
        ("redis://:pw-1@10.0.0.5/0?ssl_ca_certs=/etc/ca.pem", "use rediss://"),
        ("rediss://:pw-1@10.0.0.5/0?ssl_ca_certs=/no/such/ca.pem", "no file /no/such/ca.pem"),
        ("redis://:pw-1@10.0.0.5/0?socket_timeout=60", "unknown parameter 'socket_timeout'"),
        ("redis://:pw-1@10.0.0.5/0?sentinel_password=x", "unknown parameter"),
        ("redis://:pw-1@10.0.0.5/0?password=pw-1", "given twice"),
        ("redis://:pw-1@10.0.0.5/1?db=2", "given twice"),
        ("unix://:pw-1@redis.internal/run/redis.sock", "not a host"),
        ("rediss://:pw-1@10.0.0.5/0?ssl_cert_reqs=maybe", "bad ssl_cert_reqs"),
    ],
)
def test_a_bad_url_says_why_without_its_password(url: str, why: str) -> None:
    with pytest.raises(ValueError) as failed:
        RedisStore(url, SECRET)
    assert why in str(failed.value)
    assert "pw-1" not in str(failed.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://redis.internal:6379/0", "redis://:{quoted}@redis.internal:6379/0"),
        ("redis://hark@redis.internal:6379/0", "redis://hark:{quoted}@redis.internal:6379/0"),
        ("rediss://redis.internal?ssl_check_hostname=no", "rediss://:{quoted}@redis.internal?"),
        ("unix:///run/redis.sock?db=1", "unix://:{quoted}@/run/redis.sock?db=1"),
        ("redis+sentinel://hark@s1,s2/mymaster", "redis+sentinel://hark:{quoted}@s1,s2/mymaster"),
    ],
)
def test_a_password_given_apart_goes_in_whatever_it_holds(url: str, expected: str) -> None:
    quoted = "pw-Secret%2Fwith%3Aodd%40chars%25"
    merged = with_password(url, PASSWORD)
    assert merged.startswith(expected.format(quoted=quoted))
    assert parse_redis_url(merged).connection["password"] == PASSWORD


@pytest.mark.parametrize(
    "url", ["redis://:pw-1@redis.internal/0", "redis://redis.internal/0?password=pw-1"]
)
def test_a_password_given_twice_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="given twice") as failed:
        open_store(url, None, SECRET, redis_password=PASSWORD)
    assert PASSWORD not in str(failed.value) and "pw-1" not in str(failed.value)


def test_the_settings_take_the_password_apart_and_never_show_it() -> None:
    env = {
        # The Sentinels' own password is not Redis's: not a password given twice.
        "HARK_REDIS_URL": "redis+sentinel://hark@s1:26379,s2:26379/mymaster?sentinel_password=s",
        "HARK_REDIS_PASSWORD": PASSWORD,
        "HARK_FLEET_SECRET": SECRET,
    }
    settings = load_settings({}, env=env)
    assert settings.redis_password == PASSWORD
    assert PASSWORD not in repr(settings)
    store = open_store(
        settings.redis_url, None, settings.fleet_secret, redis_password=settings.redis_password
    )
    assert isinstance(store, RedisStore)
    assert store.description == "redis+sentinel://hark@s1:26379,s2:26379/mymaster"
    assert PASSWORD not in repr(store.client) and PASSWORD not in repr(store.client.connection_pool)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"HARK_REDIS_PASSWORD": PASSWORD}, "set redis_url too"),
        (
            {"HARK_REDIS_URL": "redis://:pw-1@redis.internal/0", "HARK_REDIS_PASSWORD": PASSWORD},
            "given twice",
        ),
        ({"HARK_REDIS_URL": "sentinel://:pw-1@s1/mymaster"}, "redis+sentinel://"),
        ({"HARK_REDIS_URL": "redis+sentinel://:pw-1@s1:26379"}, "no master name"),
        ({"HARK_REDIS_URL": "redis://:pw-1@redis.internal/0?ssl_ca_certs=/ca.pem"}, "rediss://"),
    ],
)
def test_the_settings_refuse_a_password_without_a_url_or_twice_and_unknown_schemes(
    env: dict[str, str], why: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(why)) as failed:
        load_settings({}, env={**env, "HARK_FLEET_SECRET": SECRET})
    assert PASSWORD not in str(failed.value) and "pw-1" not in str(failed.value)


async def test_an_unreachable_sentinel_fleet_is_unavailable_without_its_passwords(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens at the Sentinels' addresses: the store fails like any Redis that is
    down, and neither password shows in the error or the log."""
    caplog.set_level(logging.DEBUG)
    store = RedisStore(
        "redis+sentinel://:pw-1@127.0.0.1:1,127.0.0.1:2/mymaster?sentinel_password=pw-2", SECRET
    )
    with pytest.raises(Exception) as failed:
        await store.start()
    await store.aclose()
    assert type(failed.value).__name__ == "ClusterUnavailableError"
    assert "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster" in str(failed.value)
    for secret in ("pw-1", "pw-2"):
        assert secret not in str(failed.value)
        assert secret not in caplog.text


def test_the_settings_leave_the_tls_files_to_the_host_that_reads_them() -> None:
    """Settings read for a container elsewhere (the chart's tests) name its files; the
    store, made where it runs, checks them."""
    url = "rediss://redis.internal/0?ssl_ca_certs=/etc/hark/redis-tls/no-such-ca.crt"
    settings = load_settings({}, env={"HARK_REDIS_URL": url, "HARK_FLEET_SECRET": SECRET})
    with pytest.raises(ValueError, match="ssl_ca_certs: no file"):
        open_store(settings.redis_url, None, settings.fleet_secret)
