"""The relay with a Redis that hangs: a real redis-server of the test's own, with a password,
stopped with SIGSTOP (it keeps its connections open and answers nothing, as a Redis on a
host that froze or behind a network that black-holes packets would), or holding writes
(``CLIENT PAUSE … WRITE``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

from hark.cluster.redis import RedisStore
from hark.edge.relay import STOP_TIMEOUT_S, FlowMirror, Registry, Relay, RelayConfig
from tests.edge.conftest import SECRET, Fleet, Recorder, until
from tests.ice import binding_request
from tests.redis_server import RedisServer

# Waits for what a Redis call's time limit brings about: far longer than any of them, so
# that only a call with no limit at all (the code before) runs into it.
HANG_S = 30.0


@pytest.fixture
def password() -> str:
    return secrets.token_hex(16)


@pytest.fixture
def own_redis(tmp_path: Path, password: str) -> Iterator[RedisServer]:
    """A redis-server this test alone uses (it is stopped and continued)."""
    with RedisServer(tmp_path, password=password) as server:
        yield server


@contextlib.contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """``server`` stopped with SIGSTOP for the block, continued after it."""
    with redis.Redis.from_url(server.url) as client:
        pid = int(client.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
async def hang_fleet(own_redis: RedisServer) -> AsyncIterator[Fleet]:
    fleet = Fleet(own_redis.url)
    await fleet.start()
    yield fleet
    await fleet.close()


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    sockets = []
    for _ in range(3):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    yield sockets
    for sock in sockets:
        sock.close()


async def relay_on(fleet: Fleet, mirror_client: redis.asyncio.Redis, idle_s: float) -> Relay:
    """A started relay of ``fleet`` whose flow mirror talks to Redis through
    ``mirror_client``."""
    store = RedisStore(fleet.url, SECRET, prefix=fleet.prefix)
    fleet.stores.append(store)
    relay = Relay(
        RelayConfig(listen=("127.0.0.1", 0), fleet_secret=SECRET, idle_s=idle_s),
        Registry(store),
        FlowMirror(mirror_client, idle_s, SECRET, prefix=fleet.prefix + "relay-flow:"),
    )
    await relay.start()
    fleet.relays.append(relay)
    return relay


async def new_flow(fleet: Fleet, relay: Relay, client: socket.socket) -> Recorder:
    """A call's first binding request from ``client`` through ``relay``, to the fleet's first
    worker; returned once the worker has it."""
    mux = fleet.muxes[0]
    received = Recorder()
    ufrag = mux.new_ufrag()
    mux.open(ufrag, received)
    client.sendto(binding_request(f"{ufrag}:c"), relay.address)
    await until(lambda: len(received.received) == 1, HANG_S)
    return received


async def mirrored(fleet: Fleet, client: socket.socket) -> bool:
    assert fleet.store is not None
    host, port = client.getsockname()
    return bool(await fleet.store.client.exists(f"{fleet.prefix}relay-flow:{host}:{port}"))


async def until_mirrored(fleet: Fleet, client: socket.socket) -> None:
    # (Redis has no event for a key being written: it is asked again.)
    async with asyncio.timeout(HANG_S):
        while True:
            if await mirrored(fleet, client):
                return
            await asyncio.sleep(0.05)


async def test_a_hung_redis_holds_up_neither_forwarding_nor_the_mirror(
    hang_fleet: Fleet,
    own_redis: RedisServer,
    password: str,
    clients: list[socket.socket],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = hang_fleet
    await fleet.worker("wrk_00000000000a")
    # A client with no socket timeout of its own: the mirror's limit is all there is.
    plain = redis.asyncio.Redis.from_url(own_redis.url)
    try:
        relay = await relay_on(fleet, plain, idle_s=3.0)
        one, two, _ = clients
        first = await new_flow(fleet, relay, one)
        await until_mirrored(fleet, one)
        with frozen(own_redis):
            # A new call and the media of the one before go through while Redis hangs.
            await new_flow(fleet, relay, two)
            one.sendto(b"\x17media while redis hangs", relay.address)
            await until(lambda: len(first.received) == 2, HANG_S)
            # The new flow's write ran out of time: counted, and the loop went on.
            await until(lambda: relay.counters["mirror_failures"] >= 1, HANG_S)
            assert relay.counters["flows"] == 2
        # Redis is back: the write that failed is made on a later pass.
        await until_mirrored(fleet, two)
        assert "flow mirror write failed: no answer from Redis" in caplog.text
        assert password not in caplog.text
    finally:
        await plain.aclose()


async def test_stop_writes_the_flows_not_yet_mirrored(
    hang_fleet: Fleet, own_redis: RedisServer, clients: list[socket.socket]
) -> None:
    fleet = hang_fleet
    await fleet.worker("wrk_00000000000a")
    # The store's own client, as `hark relay` has it (its socket timeout included). A long
    # idle time: the write loop's next pass would come long after the stop.
    relay = await fleet.relay(idle_s=600.0)
    client = clients[0]
    assert fleet.store is not None
    # Writes held (reads still answered); a write given up on is never made.
    await fleet.store.client.execute_command("CLIENT", "PAUSE", "600000", "WRITE")
    try:
        await new_flow(fleet, relay, client)
        await until(lambda: relay.counters["mirror_failures"] >= 1, HANG_S)
        assert not await mirrored(fleet, client)
    finally:
        await fleet.store.client.execute_command("CLIENT", "UNPAUSE")
    await relay.stop()
    fleet.relays.remove(relay)
    # The stop wrote it: a relay that starts now forwards the flow at once.
    assert await mirrored(fleet, client)
    restarted = await fleet.relay()
    assert restarted.counters["flows_restored"] == 1


async def test_stop_returns_within_its_bound_while_redis_hangs(
    hang_fleet: Fleet,
    own_redis: RedisServer,
    password: str,
    clients: list[socket.socket],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = hang_fleet
    await fleet.worker("wrk_00000000000a")
    plain = redis.asyncio.Redis.from_url(own_redis.url)
    try:
        relay = await relay_on(fleet, plain, idle_s=600.0)
        with frozen(own_redis):
            # A flow whose write is in flight, and one the write loop has not taken yet.
            await new_flow(fleet, relay, clients[0])
            await new_flow(fleet, relay, clients[1])
            failures = relay.counters["mirror_failures"]
            async with asyncio.timeout(HANG_S):
                await relay.stop(timeout_s=STOP_TIMEOUT_S)
            fleet.relays.remove(relay)
            assert relay.counters["mirror_failures"] > failures
        assert "flow(s) were not mirrored before the stop" in caplog.text
        assert password not in caplog.text
    finally:
        await plain.aclose()
