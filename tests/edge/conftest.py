"""Fixtures of the edge tests: a real redis-server, and workers' muxes behind a relay."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from hark.cluster.redis import RedisStore
from hark.cluster.store import WorkerInfo
from hark.edge.relay import FlowMirror, Registry, Relay, RelayConfig
from hark.edge.relay_hello import HelloChecker
from hark.edge.route_hint import RouteSigner
from hark.transports.webrtc.udp_mux import UdpMux
from tests.redis_server import RedisServer

SECRET = "fleet-secret-for-the-edge-tests-0123"


class Recorder(asyncio.DatagramProtocol):
    """Keeps what an ICE connection's endpoint receives."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, tuple[str, int]]] = []

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.received.append((data, (addr[0], addr[1])))


@dataclass
class Fleet:
    """A Redis-backed registry, worker muxes registered in it, and relays in front."""

    url: str
    prefix: str = field(default_factory=lambda: f"test-{secrets.token_hex(4)}:")
    store: RedisStore | None = None
    muxes: list[UdpMux] = field(default_factory=list)
    relays: list[Relay] = field(default_factory=list)
    stores: list[RedisStore] = field(default_factory=list)

    async def start(self) -> None:
        """Open the fleet's store."""
        self.store = RedisStore(self.url, SECRET, prefix=self.prefix)
        await self.store.start()

    async def worker(self, worker_id: str) -> UdpMux:
        """A started mux of a worker registered with its media address, signing hints and
        taking frames from the relays that say hello."""
        assert self.store is not None
        mux = UdpMux(
            "127.0.0.1",
            0,
            relay=("127.0.0.1", 3478),
            signer=RouteSigner(SECRET, worker_id),
            hellos=HelloChecker(SECRET, worker_id),
        )
        await mux.start()
        self.muxes.append(mux)
        await self.register(worker_id, mux)
        return mux

    async def register(self, worker_id: str, mux: UdpMux) -> None:
        """(Re)write the worker's registry entry."""
        assert self.store is not None
        host, port = mux.advertised
        info = WorkerInfo(id=worker_id, url="http://127.0.0.1:1", media_address=f"{host}:{port}")
        await self.store.heartbeat(info, 60)

    async def relay(self, port: int = 0, idle_s: float = 30.0, **limits: Any) -> Relay:
        """A started relay on 127.0.0.1:``port`` reading this fleet's registry (``limits``:
        more ``RelayConfig`` fields)."""
        store = RedisStore(self.url, SECRET, prefix=self.prefix)
        self.stores.append(store)
        relay = Relay(
            RelayConfig(listen=("127.0.0.1", port), fleet_secret=SECRET, idle_s=idle_s, **limits),
            Registry(store),
            FlowMirror(store.client, idle_s, SECRET, prefix=self.prefix + "relay-flow:"),
        )
        await relay.start()
        self.relays.append(relay)
        return relay

    async def close(self) -> None:
        """Stop everything this fleet started."""
        for relay in self.relays:
            await relay.stop()
        for mux in self.muxes:
            await mux.close()
        for store in [*self.stores, *([self.store] if self.store else [])]:
            await store.aclose()


@pytest.fixture
async def fleet(redis_server: RedisServer) -> AsyncIterator[Fleet]:
    """A fleet on the session's Redis under a key prefix of its own."""
    fleet = Fleet(redis_server.url)
    await fleet.start()
    yield fleet
    await fleet.close()


async def until(predicate: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Wait until ``predicate()`` holds (polling), or fail."""
    async with asyncio.timeout(limit_s):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.01)
