"""The Redis store against a real redis-server: TTLs kept by Redis, a Redis that goes away
and comes back, passwords that never show."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from hark.cluster import open_store
from hark.cluster.redis import CONNECT_TIMEOUT_S, OPERATION_TIMEOUT_S, RedisStore
from hark.cluster.store import CallRecord, ClusterUnavailableError, WorkerInfo
from tests.cluster.conftest import EXPIRY_GUARD_S
from tests.redis_server import RedisServer

PASSWORD = "s3cret-Pa55word"
SECRET = "fleet-secret-of-the-redis-tests-0123"
W1 = WorkerInfo(id="w1", url="http://w1.internal:8000")


def operations(store: RedisStore) -> dict[str, Callable[[], Awaitable[object]]]:
    """One call of every store method."""
    now = time.time()
    return {
        "start": store.start,
        "put_key": lambda: store.put_key("ab" * 32, b"r", now + 60),
        "get_key": lambda: store.get_key("ab" * 32, now),
        "put_call": lambda: store.put_call(CallRecord("rtc_1", "o", "w1", now)),
        "get_call": lambda: store.get_call("rtc_1"),
        "delete_call": lambda: store.delete_call("rtc_1"),
        "heartbeat": lambda: store.heartbeat(W1, 60),
        "workers": lambda: store.workers(now),
        "remove_worker": lambda: store.remove_worker("w1"),
        "sweep": lambda: store.sweep(now),
        "acquire_session": lambda: store.acquire_session("o", "w1", 5),
        "release_session": lambda: store.release_session("o", "w1"),
        "sessions_of": lambda: store.sessions_of("o"),
        "add_usage": lambda: store.add_usage("o", "requests", 1, now),
    }


async def test_a_stopped_redis_fails_every_call_and_a_restarted_one_serves_again(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path, password=PASSWORD) as server:
        store = RedisStore(server.url, SECRET)
        await store.start()
        await store.heartbeat(W1, 60)
        assert PASSWORD not in store.description

        server.stop()
        for name, operation in operations(store).items():
            with pytest.raises(ClusterUnavailableError) as failed:
                await operation()
            assert "Redis at redis://127.0.0.1:" in str(failed.value), name
            assert PASSWORD not in str(failed.value), name
            assert failed.value.__cause__ is None and failed.value.__context__ is not None

        server.start()
        # The same object, no reconnect asked for: Redis came back empty, the store serves.
        for operation in operations(store).values():
            await operation()
        await store.heartbeat(W1, 60)
        assert [w.id for w in await store.workers(time.time())] == ["w1"]
        await store.aclose()


async def test_a_redis_restarted_under_pooled_connections_serves_the_next_call(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path) as server:
        store = RedisStore(server.url, SECRET)
        await store.start()
        # Several connections in the pool, all of which the restart cuts.
        await asyncio.gather(*(store.add_usage("o", "requests", 1, 0) for _ in range(5)))
        server.restart()
        assert await store.add_usage("o", "requests", 1, 0) == 1
        # The scripts Redis forgot are loaded again.
        await store.heartbeat(W1, 60)
        assert await store.acquire_session("o", "w1", 1)
        await store.aclose()


async def test_a_redis_that_never_answers_times_out(tmp_path: Path) -> None:
    """A listener that accepts and says nothing (a hung Redis): the call ends with
    ClusterUnavailableError after the operation timeout instead of waiting forever."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        store = RedisStore(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", SECRET)
        with pytest.raises(ClusterUnavailableError, match="Timeout"):
            await store.start()
        await store.aclose()


def test_the_client_has_short_timeouts() -> None:
    store = RedisStore("redis://127.0.0.1:1/0", SECRET)
    kwargs = store.client.connection_pool.connection_kwargs
    assert kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT_S == 1.0
    assert kwargs["socket_timeout"] == OPERATION_TIMEOUT_S == 2.0


async def test_a_wrong_password_is_unavailable_and_never_shown(tmp_path: Path) -> None:
    with RedisServer(tmp_path, password=PASSWORD) as server:
        wrong = "wr0ng-" + PASSWORD
        store = RedisStore(f"redis://user:{wrong}@127.0.0.1:{server.port}/0", SECRET)
        with pytest.raises(ClusterUnavailableError) as failed:
            await store.start()
        assert wrong not in str(failed.value)
        assert PASSWORD not in str(failed.value)
        await store.aclose()


@pytest.mark.parametrize(
    ("url", "description"),
    [
        ("redis://:pw-1@10.0.0.5:6379/0", "redis://10.0.0.5:6379/0"),
        ("redis://hark:pw-1@redis.internal:6380/2", "redis://hark@redis.internal:6380/2"),
        ("rediss://:pw-1@[fd00::5]:6379", "rediss://[fd00::5]:6379"),
        ("redis://redis.internal/0?password=pw-1", "redis://redis.internal/0"),
        ("unix://:pw-1@/run/redis.sock?db=1", "unix:///run/redis.sock"),
    ],
)
def test_the_description_never_holds_the_password(url: str, description: str) -> None:
    store = open_store(url, None, SECRET)
    assert isinstance(store, RedisStore)
    assert store.description == description


def test_a_bad_redis_url_fails_without_its_password() -> None:
    with pytest.raises(ValueError) as failed:
        RedisStore("http://:pw-1@10.0.0.5:6379/0", SECRET)
    assert "pw-1" not in str(failed.value)


async def test_redis_expires_keys_heartbeats_and_usage_by_itself(
    redis_server: RedisServer,
) -> None:
    """Nothing is left behind for a caller to clean: every key the store writes for a
    minted key, a heartbeat or a usage window carries a TTL."""
    store = RedisStore(redis_server.url, SECRET, prefix="ttl-test:")
    await store.start()
    client = store.client
    now = time.time()
    await store.put_key("ab" * 32, b"r", now + 30)
    # Long enough that no busy machine reads it after it expired.
    await store.heartbeat(W1, 600)
    await store.add_usage("o", "tokens", 10, now, window_s=60)

    [key] = [k async for k in client.scan_iter(match="ttl-test:key:*")]
    key_ttl = await client.pttl(key)
    assert 0 < key_ttl <= 30_000
    assert 0 < await client.pttl("ttl-test:worker:w1") <= 600_000
    [usage_key] = [k async for k in client.scan_iter(match="ttl-test:usage:*")]
    assert 0 < await client.pttl(usage_key) <= 120_000

    # And Redis's clock alone expires a heartbeat.
    await store.heartbeat(W1, 0.2)
    deadline = time.monotonic() + EXPIRY_GUARD_S
    while await store.workers(time.time()):
        assert time.monotonic() < deadline, "the heartbeat never expired"
        await asyncio.sleep(0.05)
    assert await store.sweep(time.time()) == 1
    await store.aclose()
