"""A worker takes framed datagrams only from relays that said a signed hello: real UDP
sockets on loopback playing relays and strangers, a real mux behind them."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from hark.edge import framing
from hark.edge.relay_hello import HELLO_WINDOW_S, HelloChecker, HelloSigner
from hark.transports.webrtc.udp_mux import UdpMux
from tests.edge.conftest import SECRET, Fleet, Recorder, until
from tests.ice import binding_request

WORKER = "wrk_00000000000a"
CLIENT = ("198.51.100.9", 50000)


@pytest.fixture
async def mux() -> AsyncIterator[UdpMux]:
    """A worker's mux behind a relay, checking hellos with the fleet secret."""
    mux = UdpMux(
        "127.0.0.1",
        0,
        relay=("127.0.0.1", 3478),
        hellos=HelloChecker(SECRET, WORKER),
    )
    await mux.start()
    yield mux
    await mux.close()


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    found = []
    for _ in range(2):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        found.append(sock)
    yield found
    for sock in found:
        sock.close()


def framed_request(ufrag: str) -> bytes:
    return framing.encode_header(CLIENT) + binding_request(f"{ufrag}:c")


async def test_a_framed_datagram_from_an_address_no_relay_said_hello_from_is_dropped(
    mux: UdpMux, sockets: list[socket.socket]
) -> None:
    received = Recorder()
    ufrag = mux.new_ufrag()
    mux.open(ufrag, received)
    stranger, relay = sockets
    # A stranger who can reach the worker's port speaks for a client: not taken.
    stranger.sendto(framed_request(ufrag), mux.advertised)
    await until(lambda: mux.dropped_unrelayed == 1)
    assert received.received == []
    # The same frame from a relay that said hello is.
    hello = HelloSigner(SECRET).hello(WORKER)
    assert hello is not None
    relay.sendto(hello, mux.advertised)
    relay.sendto(framed_request(ufrag), mux.advertised)
    await until(lambda: len(received.received) == 1)
    assert received.received[0][1] == CLIENT
    assert mux.relays == [relay.getsockname()]
    # And the stranger is still a stranger.
    stranger.sendto(framed_request(ufrag), mux.advertised)
    await until(lambda: mux.dropped_unrelayed == 2)
    assert len(received.received) == 1


async def test_forged_replayed_and_stale_hellos_are_refused(
    mux: UdpMux, sockets: list[socket.socket]
) -> None:
    received = Recorder()
    ufrag = mux.new_ufrag()
    mux.open(ufrag, received)
    relay, stranger = sockets
    genuine = HelloSigner(SECRET).hello(WORKER)
    refused = [
        HelloSigner("another-fleets-secret-0123456789").hello(WORKER),
        HelloSigner(SECRET).hello("wrk_00000000000b"),
        HelloSigner(SECRET, clock=lambda: 1_000_000_000.0).hello(WORKER),
        HelloSigner(SECRET, clock=lambda: 4_000_000_000.0).hello(WORKER),
    ]
    for hello in refused:
        assert hello is not None
        stranger.sendto(hello, mux.advertised)
    assert genuine is not None
    relay.sendto(genuine, mux.advertised)
    await until(lambda: mux.relays == [relay.getsockname()])
    # The relay's own hello, sent again by someone who saw it go by.
    stranger.sendto(genuine, mux.advertised)
    stranger.sendto(framed_request(ufrag), mux.advertised)
    await until(lambda: mux.dropped_unrelayed == len(refused) + 2)
    assert mux.relays == [relay.getsockname()]
    assert received.received == []


def test_a_hello_names_its_worker_and_its_time() -> None:
    now = 1_800_000_000.0
    hello = HelloSigner(SECRET, clock=lambda: now).hello(WORKER)
    assert hello is not None and hello[:2] == bytes((framing.MAGIC, framing.CONTROL))
    assert framing.decode(hello) is None
    assert HelloChecker(SECRET, WORKER, clock=lambda: now + HELLO_WINDOW_S - 1).check(hello)
    late = HelloChecker(SECRET, WORKER, clock=lambda: now + HELLO_WINDOW_S + 1)
    assert not late.check(hello)
    assert HelloSigner(SECRET).hello("w1") is None
    assert SECRET not in repr(HelloSigner(SECRET)) + repr(HelloChecker(SECRET, WORKER))


async def test_a_relay_says_hello_to_each_worker_before_it_forwards(fleet: Fleet) -> None:
    a = await fleet.worker(WORKER)
    b = await fleet.worker("wrk_00000000000b")
    relay = await fleet.relay()
    source = ("127.0.0.1", relay.internal_address[1])
    await until(lambda: a.relays == [source] and b.relays == [source])
