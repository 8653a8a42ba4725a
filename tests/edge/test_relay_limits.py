"""What a hint may still do once it is old, and how many flows one source or one hint may
make: the relay on loopback with real worker muxes and a real Redis."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from hark.edge.route_hint import HINT_TTL_S, Route, RouteSigner, RouteVerifier
from tests.edge.conftest import SECRET, Fleet, Recorder, until
from tests.ice import binding_request

WORKER = "wrk_00000000000a"


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    """Twelve client sockets on 127.0.0.1: one source IP, twelve addresses."""
    sockets = []
    for _ in range(12):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    yield sockets
    for sock in sockets:
        sock.close()


async def test_an_expired_hint_makes_no_flow(fleet: Fleet, clients: list[socket.socket]) -> None:
    mux = await fleet.worker(WORKER)
    relay = await fleet.relay()
    # An answer given longer ago than a hint lives.
    stale = RouteSigner(SECRET, WORKER, clock=lambda: time.time() - HINT_TTL_S - 5).ufrag()
    a = Recorder()
    mux.open(stale, a)
    clients[0].sendto(binding_request(f"{stale}:c"), relay.address)
    await until(lambda: relay.counters["drop_expired_hint"] == 1)
    assert relay.counters["flows"] == 0
    assert relay.counters["flows_created"] == 0
    assert a.received == []


async def test_a_hint_that_expires_keeps_its_calls_flow_and_makes_no_new_one(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux = await fleet.worker(WORKER)
    relay = await fleet.relay()
    # A hint with a few seconds left to live.
    ufrag = RouteSigner(SECRET, WORKER, clock=lambda: time.time() - HINT_TTL_S + 5).ufrag()
    route = RouteVerifier(SECRET).verify(ufrag)
    assert isinstance(route, Route)
    a = Recorder()
    mux.open(ufrag, a)
    caller, stranger = clients[0], clients[1]
    caller.sendto(binding_request(f"{ufrag}:c"), relay.address)
    await until(lambda: len(a.received) == 1)
    await asyncio.sleep(max(0.0, route.expires_at + 0.1 - time.time()))
    # The call's consent checks go on with the hint it was answered with ...
    caller.sendto(binding_request(f"{ufrag}:c"), relay.address)
    await until(lambda: len(a.received) == 2)
    # ... but the hint makes no flow for another address any more.
    stranger.sendto(binding_request(f"{ufrag}:c"), relay.address)
    await until(lambda: relay.counters["drop_expired_hint"] == 1)
    assert relay.counters["flows"] == 1
    assert [source for _, source in a.received] == [caller.getsockname()] * 2


async def test_one_hint_makes_flows_for_a_few_addresses_only(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux = await fleet.worker(WORKER)
    relay = await fleet.relay()
    ufrag = mux.new_ufrag()
    a = Recorder()
    mux.open(ufrag, a)
    for client in clients[:9]:
        client.sendto(binding_request(f"{ufrag}:c"), relay.address)
    await until(lambda: relay.counters["drop_hint_exhausted"] == 1)
    await until(lambda: len(a.received) == 8)
    assert relay.counters["flows_created"] == 8


async def test_a_flood_of_new_flows_from_one_source_is_limited(
    fleet: Fleet, clients: list[socket.socket]
) -> None:
    mux = await fleet.worker(WORKER)
    # Five at once, then one a thousand seconds: nothing refills during the test.
    relay = await fleet.relay(source_flows_per_s=0.001, source_flow_burst=5)
    received = Recorder()
    for client in clients:
        # Each a call of its own: a fresh hint, so that only the source limit applies.
        ufrag = mux.new_ufrag()
        mux.open(ufrag, received)
        client.sendto(binding_request(f"{ufrag}:c"), relay.address)
    await until(lambda: relay.counters["drop_rate_limited"] == len(clients) - 5)
    assert relay.counters["flows_created"] == 5
    assert relay.counters["flows"] == 5
    await until(lambda: len(received.received) == 5)
    # What was made was written to the mirror; what was refused never reached Redis.
    await until(lambda: not relay._to_write)
    assert fleet.store is not None
    keys = [k async for k in fleet.store.client.scan_iter(match=f"{fleet.prefix}relay-flow:*")]
    assert len(keys) == 5
