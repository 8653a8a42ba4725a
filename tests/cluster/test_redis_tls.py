"""The Redis store against a real redis-server that speaks only TLS and knows only an ACL
user, as a managed Redis does: the certificates are made here, by a CA of the test's own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from hark.cluster import open_store
from hark.cluster.redis import RedisStore
from hark.cluster.store import ClusterUnavailableError, WorkerInfo
from tests.cluster.fleet_ca import FleetCa
from tests.cluster.test_redis import operations
from tests.cluster.test_redis_sentinel import master_port
from tests.redis_server import RedisSentinel, RedisServer, RedisTls, running_redis

SECRET = "fleet-secret-of-the-redis-tls-tests-0123"
USER = "hark"
# Characters a URL must encode, so that the tests see them carried intact.
PASSWORD = "acl-Pa55/w:rd@%"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> FleetCa:
    """The test's own CA."""
    return FleetCa(tmp_path_factory.mktemp("redis-ca"), name="hark redis test CA")


@pytest.fixture(scope="module")
def tls_redis(ca: FleetCa, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis on TLS alone whose one user is ``hark`` (the default user is off)."""
    cert, key = ca.issue("redis", addresses=("127.0.0.1", "localhost"))
    with running_redis(
        tmp_path_factory.mktemp("redis-tls"),
        tls=RedisTls(cert=cert, key=key, ca=ca.cert),
        # One word an argument: redis-server quotes an argument that holds a space.
        args=[
            *("--user", "default", "off"),
            *("--user", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all"),
        ],
    ) as server:
        yield server


def url(server: RedisServer, ca: Path | None, *, user: str = USER, password: str = PASSWORD) -> str:
    """``rediss://`` to ``server`` as ``user``, trusting ``ca`` (the system's CAs when None)."""
    query = f"?ssl_ca_certs={ca}" if ca is not None else ""
    auth = f"{user}:{quote(password, safe='')}" if password else user
    return f"rediss://{auth}@{server.host}:{server.port}/0{query}"


async def test_every_operation_works_over_tls_as_an_acl_user(
    tls_redis: RedisServer, ca: FleetCa
) -> None:
    store = RedisStore(url(tls_redis, ca.cert), SECRET, prefix="tls-test:")
    assert store.description == f"rediss://{USER}@127.0.0.1:{tls_redis.port}/0"
    for operation in operations(store).values():
        await operation()
    await store.heartbeat(WorkerInfo(id="w1", url="http://w1.internal:8000"), 60)
    assert [w.id for w in await store.workers(time.time())] == ["w1"]
    # The store is logged in as the ACL user (the default user is off).
    assert await store.client.acl_whoami() == USER
    assert await store.client.exists("tls-test:worker:w1") == 1
    await store.aclose()


async def test_the_password_apart_from_the_url_logs_in_the_acl_user(
    tls_redis: RedisServer, ca: FleetCa
) -> None:
    """``HARK_REDIS_PASSWORD``'s way: the URL names the user, the password comes apart and
    needs no encoding however odd its characters."""
    store = open_store(url(tls_redis, ca.cert, password=""), None, SECRET, redis_password=PASSWORD)
    assert isinstance(store, RedisStore)
    await store.start()
    assert await store.client.acl_whoami() == USER
    assert PASSWORD not in store.description
    await store.aclose()


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("no CA: the system's trust does not know the test's", "CERTIFICATE_VERIFY_FAILED"),
        ("a wrong password", "AuthenticationError"),
        ("plain redis:// to the TLS port", ""),
    ],
)
async def test_what_cannot_log_in_is_unavailable_and_never_shows_the_password(
    tls_redis: RedisServer, ca: FleetCa, case: str, cause: str
) -> None:
    if case.startswith("no CA"):
        target = url(tls_redis, None)
    elif case.startswith("a wrong"):
        target = url(tls_redis, ca.cert, password="wr0ng-" + PASSWORD)
    else:
        target = f"redis://{USER}:{quote(PASSWORD, safe='')}@127.0.0.1:{tls_redis.port}/0"
    store = RedisStore(target, SECRET)
    with pytest.raises(ClusterUnavailableError) as failed:
        await store.start()
    await store.aclose()
    message = str(failed.value)
    assert cause in message, message
    for secret in (PASSWORD, quote(PASSWORD, safe=""), "wr0ng-"):
        assert secret not in message, message


async def test_sentinel_over_tls_finds_the_master_over_tls(
    tls_redis: RedisServer, ca: FleetCa, tmp_path: Path
) -> None:
    """``rediss+sentinel://``: a Sentinel on TLS alone names the TLS-only master; the store
    asks it and logs in to the master as the ACL user, both over TLS."""
    cert, key = ca.issue("sentinel", addresses=("127.0.0.1",))
    tls = RedisTls(cert=cert, key=key, ca=ca.cert)
    # The Sentinel logs in to the master as the ACL user too.
    with RedisSentinel(
        tmp_path, tls_redis.port, auth_user=USER, auth_pass=PASSWORD, tls=tls
    ) as sentinel:
        target = (
            f"rediss+sentinel://{USER}:{quote(PASSWORD, safe='')}@127.0.0.1:{sentinel.port}"
            f"/mymaster/0?ssl_ca_certs={ca.cert}"
        )
        store = RedisStore(target, SECRET, prefix="tls-sentinel-test:")
        for operation in operations(store).values():
            await operation()
        assert await store.client.acl_whoami() == USER
        assert await master_port(store) == tls_redis.port
        await store.aclose()
