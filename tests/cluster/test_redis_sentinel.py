"""The Redis store behind real Sentinels (three ``redis-server --sentinel`` processes, a
master and a replica): it follows a failover that Sentinel is asked for without a failed
call, and one forced by a killed master with ``ClusterUnavailableError`` until Sentinel
has promoted the replica, and nothing it wrote before is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool

from hark.cluster.redis import RedisStore
from hark.cluster.store import CallRecord, ClusterUnavailableError, WorkerInfo
from tests.redis_server import RedisWithSentinels

# Sentinel calls a master down after a second without an answer: real time passes.
pytestmark = pytest.mark.realtime

SECRET = "fleet-secret-of-the-sentinel-tests-0123"
PASSWORD = "redis-Pa55word"
SENTINEL_PASSWORD = "sentinel-Pa55word"
# A bound on a hang, not a measure: how long the store may stay unavailable after a kill.
RECOVERY_S = 120.0
W1 = WorkerInfo(id="w1", url="http://w1.internal:8000")
T = TypeVar("T")


async def master_port(store: RedisStore) -> int:
    """The port of the master the store's Sentinel client names now."""
    pool = store.client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    _, port = await pool.get_master_address()
    return int(port)


async def until_available(operation: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``operation``'s result once the store answers, and how many times it failed first;
    any failure but ``ClusterUnavailableError`` fails the test."""
    failures = 0
    deadline = time.monotonic() + RECOVERY_S
    while True:
        try:
            return await operation(), failures
        except ClusterUnavailableError as exc:
            failures += 1
            assert time.monotonic() < deadline, f"still unavailable: {exc}"
            await asyncio.sleep(0.1)


async def test_the_store_follows_a_failover_and_a_killed_master(tmp_path: Path) -> None:
    with RedisWithSentinels(tmp_path, PASSWORD, sentinel_password=SENTINEL_PASSWORD) as sentinels:
        store = RedisStore(sentinels.url, SECRET, prefix="sentinel-test:")
        assert PASSWORD not in store.description and SENTINEL_PASSWORD not in store.description
        await store.start()
        now = time.time()
        await store.put_key("a1" * 32, b"before the failover", now + 600)
        await store.put_call(CallRecord("rtc_1", "owner", "w1", now))
        # Long enough that no heartbeat expires while the test runs, however slow.
        await store.heartbeat(W1, 600)
        assert await store.acquire_session("owner", "w1", 5)
        # Every write above reached the replica before it is promoted.
        await asyncio.to_thread(sentinels.wait_settled)
        first = sentinels.master_port()

        # A failover Sentinel is asked for: the store's connections are on the old master,
        # now a replica; its first write there answers READONLY, and the store moves to the
        # new master within the same call. Nothing fails.
        second = await asyncio.to_thread(sentinels.failover)
        assert second != first
        assert await store.get_key("a1" * 32, now) == b"before the failover"
        await store.put_key("b2" * 32, b"after the failover", now + 600)
        assert await store.get_call("rtc_1") == CallRecord("rtc_1", "owner", "w1", now)
        assert await store.acquire_session("owner", "w1", 5)
        assert await store.sessions_of("owner") == 2
        assert [w.id for w in await store.workers(time.time())] == ["w1"]
        # The store writes to the new master now.
        assert (await store.client.execute_command("ROLE"))[0] == b"master"
        assert await master_port(store) == second

        # The new master is killed: the store is unavailable until Sentinel promotes the
        # replica (the old master), then everything written before is there.
        await asyncio.to_thread(sentinels.wait_settled)
        third = await asyncio.to_thread(sentinels.kill_master)
        assert third == first
        key, _ = await until_available(lambda: store.get_key("b2" * 32, now))
        assert key == b"after the failover"
        assert await store.get_key("a1" * 32, now) == b"before the failover"
        assert await store.get_call("rtc_1") == CallRecord("rtc_1", "owner", "w1", now)
        assert await store.sessions_of("owner") == 2
        await store.release_session("owner", "w1")
        assert await store.sessions_of("owner") == 1
        await store.put_key("c3" * 32, b"after the kill", now + 600)
        assert await store.get_key("c3" * 32, now) == b"after the kill"
        assert await master_port(store) == third
        await store.aclose()
