"""Fixtures of the cluster tests: a real redis-server, and each store backend behind one
helper so that a contract test runs against both."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio

from hark.cluster.embedded import EmbeddedStore
from hark.cluster.redis import RedisStore
from hark.cluster.store import ClusterStore
from tests.redis_server import RedisServer

# How long a test waits for Redis to expire a key by its own clock before failing; the TTLs
# involved are a millisecond to a second.
EXPIRY_GUARD_S = 15.0
FLEET_SECRET = "fleet-secret-of-the-cluster-tests-0123"


class Clock:
    """A clock the test moves by hand, starting at the real time (Redis expiry is absolute)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Backend:
    """One backend under test: opens stores on the same shared state (one store per
    "worker"), makes heartbeats expire, and shows the raw data the backend holds."""

    def __init__(self, name: str, tmp_path: Path, server: RedisServer | None) -> None:
        self.name = name
        self.tmp_path = tmp_path
        self.redis = server
        self.clock = Clock()
        self.prefix = f"test-{secrets.token_hex(4)}:"
        # Heartbeats given this TTL expire in ``expire_heartbeats``, never before it however
        # slow the test: the embedded store's clock is moved past it by hand; Redis is told
        # then to expire them at once, which it does by its own clock.
        self.short_ttl = 5.0 if server is None else 600.0
        self.stores: list[ClusterStore] = []

    async def open(self) -> ClusterStore:
        """A started store on this backend's shared state."""
        store: ClusterStore
        if self.redis is None:
            store = EmbeddedStore(self.tmp_path, clock=self.clock)
        else:
            store = RedisStore(self.redis.url, FLEET_SECRET, prefix=self.prefix)
        await store.start()
        self.stores.append(store)
        return store

    async def expire_heartbeats(self, *worker_ids: str) -> None:
        """Let the heartbeats of ``worker_ids``, given ``short_ttl``, expire."""
        if self.redis is None:
            self.clock.advance(self.short_ttl)
            return
        client = self._redis_client()
        keys = [f"{self.prefix}worker:{w}" for w in worker_ids]
        for key in keys:
            assert await client.pexpire(key, 1), f"{key} was gone before its time"
        deadline = time.monotonic() + EXPIRY_GUARD_S
        while await client.exists(*keys):
            assert time.monotonic() < deadline, f"Redis never expired {keys}"
            await asyncio.sleep(0.05)

    def _redis_client(self) -> redis.asyncio.Redis:
        store = next(s for s in self.stores if isinstance(s, RedisStore))
        return store.client

    async def raw(self) -> bytes:
        """Every byte of state the backend holds: the SQLite files, or every key of this
        test's prefix with its value."""
        if self.redis is None:
            files = sorted(self.tmp_path.glob("cluster.sqlite3*"))
            assert files, "no SQLite file"
            return b"".join(f.read_bytes() for f in files)
        client = self._redis_client()
        out = []
        async for key in client.scan_iter(match=f"{self.prefix}*"):
            out.append(key)
            kind = await client.type(key)
            if kind == b"string":
                out.append(await client.get(key))
            elif kind == b"hash":
                for field, value in (await client.hgetall(key)).items():
                    out += [field, value]
            elif kind == b"set":
                out += list(await client.smembers(key))
            else:
                raise AssertionError(f"unexpected Redis type {kind!r} of {key!r}")
        return b"\n".join(out)

    async def aclose(self) -> None:
        for store in self.stores:
            await store.aclose()


@pytest.fixture(params=["embedded", "redis"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Each backend in turn."""
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    backend = Backend(request.param, tmp_path, server)
    yield backend
    await backend.aclose()
