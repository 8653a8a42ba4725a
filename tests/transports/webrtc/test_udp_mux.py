"""The shared UDP socket: ufrags with a routing hint, and routing datagrams to calls."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aioice import stun

from hark.edge import framing
from hark.edge.relay_hello import HelloChecker, HelloSigner
from hark.edge.route_hint import Route, RouteSigner, RouteVerifier
from hark.edge.stun import stun_request_username
from hark.transports.webrtc.udp_mux import (
    UFRAG_HINT_LENGTH,
    UFRAG_RANDOM_LENGTH,
    UdpMux,
    make_ufrag,
    route_hint,
)
from tests.ice import binding_request
from tests.transports.conftest import until


class Recorder(asyncio.DatagramProtocol):
    """Keeps what it receives."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, tuple[str, int]]] = []
        self.lost = False

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.received.append((data, (addr[0], addr[1])))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


@pytest.fixture
async def mux() -> AsyncIterator[UdpMux]:
    mux = UdpMux("127.0.0.1", 0, route_hint="w007")
    await mux.start()
    yield mux
    await mux.close()


@pytest.fixture
def client_socket() -> Any:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2)
    yield sock
    sock.close()


def test_ufrag_starts_with_the_routing_hint() -> None:
    ufrag = make_ufrag("ab+/")
    assert len(ufrag) == UFRAG_HINT_LENGTH + UFRAG_RANDOM_LENGTH
    assert route_hint(ufrag) == "ab+/"
    assert ufrag[UFRAG_HINT_LENGTH:].isalnum()
    assert make_ufrag("ab+/") != ufrag


@pytest.mark.parametrize("hint", ["abc", "abcde", "ab:c", "ab c"])
def test_bad_routing_hints_are_refused(hint: str) -> None:
    with pytest.raises(ValueError):
        make_ufrag(hint)


def test_stun_username_of_binding_requests_only() -> None:
    assert stun_request_username(binding_request("srv:cli")) == "srv:cli"
    response = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.RESPONSE)
    assert stun_request_username(bytes(response)) is None
    assert stun_request_username(b"\x00\x01" + b"\x00" * 30) is None
    assert stun_request_username(b"\x80" + b"\x00" * 40) is None
    assert stun_request_username(b"") is None


async def test_the_mux_hands_out_ufrags_with_its_hint(mux: UdpMux) -> None:
    assert route_hint(mux.new_ufrag()) == "w007"
    assert mux.advertised == ("127.0.0.1", mux.port)
    assert mux.port != 0


async def test_first_binding_request_routes_by_ufrag_then_by_address(
    mux: UdpMux, client_socket: socket.socket
) -> None:
    a, b = Recorder(), Recorder()
    ufrag_a, ufrag_b = mux.new_ufrag(), mux.new_ufrag()
    mux.open(ufrag_a, a)
    mux.open(ufrag_b, b)
    client_socket.sendto(binding_request(f"{ufrag_b}:client"), mux.advertised)
    await until(lambda: len(b.received) == 1)
    client_socket.sendto(b"\x80dtls-or-rtp", mux.advertised)
    await until(lambda: len(b.received) == 2)
    assert b.received[1][0] == b"\x80dtls-or-rtp"
    assert b.received[1][1] == client_socket.getsockname()
    assert a.received == []


async def test_unknown_senders_are_dropped(mux: UdpMux, client_socket: socket.socket) -> None:
    a = Recorder()
    mux.open(mux.new_ufrag(), a)
    client_socket.sendto(b"\x80stray", mux.advertised)
    client_socket.sendto(binding_request("nobody12345:client"), mux.advertised)
    await until(lambda: mux.dropped == 2)
    assert a.received == []


async def test_sending_claims_the_address_for_replies(
    mux: UdpMux, client_socket: socket.socket
) -> None:
    a = Recorder()
    endpoint = mux.open(mux.new_ufrag(), a)
    endpoint.sendto(b"check", client_socket.getsockname())
    data, server = client_socket.recvfrom(100)
    assert data == b"check"
    assert server == mux.advertised
    client_socket.sendto(b"\x01reply", mux.advertised)
    await until(lambda: len(a.received) == 1)


async def test_a_binding_request_moves_an_address_to_its_call(
    mux: UdpMux, client_socket: socket.socket
) -> None:
    a, b = Recorder(), Recorder()
    endpoint_a = mux.open(mux.new_ufrag(), a)
    ufrag_b = mux.new_ufrag()
    mux.open(ufrag_b, b)
    endpoint_a.sendto(b"check", client_socket.getsockname())
    client_socket.sendto(binding_request(f"{ufrag_b}:client"), mux.advertised)
    client_socket.sendto(b"\x80media", mux.advertised)
    await until(lambda: len(b.received) == 2)
    assert a.received == []
    assert client_socket.getsockname() not in endpoint_a.addresses


async def test_closing_an_endpoint_unregisters_it(
    mux: UdpMux, client_socket: socket.socket
) -> None:
    a = Recorder()
    ufrag = mux.new_ufrag()
    endpoint = mux.open(ufrag, a)
    client_socket.sendto(binding_request(f"{ufrag}:client"), mux.advertised)
    await until(lambda: len(a.received) == 1)
    assert (mux.connections, mux.addresses) == (1, 1)
    endpoint.close()
    await until(lambda: a.lost)
    assert (mux.connections, mux.addresses) == (0, 0)
    client_socket.sendto(b"\x80late", mux.advertised)
    await until(lambda: mux.dropped == 1)
    assert len(a.received) == 1
    endpoint.sendto(b"after close", client_socket.getsockname())
    with pytest.raises(TimeoutError):
        client_socket.settimeout(0.2)
        client_socket.recvfrom(100)


async def test_a_ufrag_is_registered_once(mux: UdpMux) -> None:
    ufrag = mux.new_ufrag()
    mux.open(ufrag, Recorder())
    with pytest.raises(ValueError):
        mux.open(ufrag, Recorder())


async def test_a_wildcard_bind_advertises_a_real_address() -> None:
    mux = UdpMux("0.0.0.0", 0, advertise_ip="198.51.100.7")
    await mux.start()
    try:
        assert mux.advertised == ("198.51.100.7", mux.port)
    finally:
        await mux.close()


RELAY_ADDRESS = ("192.0.2.7", 3478)
SECRET, WORKER_ID = "fleet-secret-for-tests-0123456789", "wrk_00000000beef"


@pytest.fixture
async def relayed_mux() -> AsyncIterator[UdpMux]:
    """A worker's mux behind the relay at ``RELAY_ADDRESS`` (signed hints, hellos checked)."""
    mux = UdpMux(
        "127.0.0.1",
        0,
        relay=RELAY_ADDRESS,
        signer=RouteSigner(SECRET, WORKER_ID),
        hellos=HelloChecker(SECRET, WORKER_ID),
    )
    await mux.start()
    yield mux
    await mux.close()


async def say_hello(mux: UdpMux, relay: socket.socket) -> None:
    """``relay`` plays the relay: it says its signed hello, and the mux trusts it."""
    hello = HelloSigner(SECRET).hello(WORKER_ID)
    assert hello is not None
    relay.sendto(hello, mux.advertised)
    await until(lambda: mux.relays == [relay.getsockname()])


async def test_behind_a_relay_calls_advertise_it_and_answer_through_it(
    relayed_mux: UdpMux, client_socket: socket.socket
) -> None:
    mux = relayed_mux
    a = Recorder()
    ufrag = mux.new_ufrag()
    endpoint = mux.open(ufrag, a)
    assert endpoint.get_extra_info("sockname") == RELAY_ADDRESS
    route = RouteVerifier(SECRET).verify(ufrag)
    assert isinstance(route, Route) and route.worker_id == WORKER_ID
    # The test's socket plays the relay: it says hello, then wraps what a client at
    # 198.51.100.9 sent.
    await say_hello(mux, client_socket)
    client = ("198.51.100.9", 50000)
    request = binding_request(f"{ufrag}:client")
    client_socket.sendto(framing.encode_header(client) + request, mux.advertised)
    await until(lambda: len(a.received) == 1)
    assert a.received[0] == (request, client)
    client_socket.sendto(framing.encode_header(client) + b"\x80media", mux.advertised)
    await until(lambda: len(a.received) == 2)
    assert a.received[1] == (b"\x80media", client)

    endpoint.sendto(b"\x80reply", client)
    data, _ = client_socket.recvfrom(100)
    assert framing.decode(data) == (client, b"\x80reply")
    # Nothing goes straight to an address never heard through the relay.
    endpoint.sendto(b"check", client_socket.getsockname())
    client_socket.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client_socket.recvfrom(100)


class Answerer(Recorder):
    """Answers every datagram within its delivery, as ICE answers a Binding request."""

    def __init__(self) -> None:
        super().__init__()
        self.endpoint: Any = None

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        super().datagram_received(data, addr)
        self.endpoint.sendto(b"\x01answer", addr)


async def test_behind_a_relay_the_answer_to_a_new_clients_first_check_goes_back_through_it(
    relayed_mux: UdpMux, client_socket: socket.socket
) -> None:
    mux = relayed_mux
    answerer = Answerer()
    ufrag = mux.new_ufrag()
    answerer.endpoint = mux.open(ufrag, answerer)
    await say_hello(mux, client_socket)
    client = ("198.51.100.9", 50000)
    request = binding_request(f"{ufrag}:client")
    # Before, the answer made during the first check's delivery found the client not yet
    # recorded as relayed and was dropped: a client's first check cost a retransmission.
    client_socket.sendto(framing.encode_header(client) + request, mux.advertised)
    await until(lambda: len(answerer.received) == 1)
    data, _ = client_socket.recvfrom(100)
    assert framing.decode(data) == (client, b"\x01answer")
    client_socket.sendto(framing.encode_header(client) + b"\x80media", mux.advertised)
    await until(lambda: len(answerer.received) == 2)
    data, _ = client_socket.recvfrom(100)
    assert framing.decode(data) == (client, b"\x01answer")
    # A framed datagram for nobody leaves no record of its client.
    stranger = ("198.51.100.10", 50000)
    client_socket.sendto(framing.encode_header(stranger) + b"\x80media", mux.advertised)
    await until(lambda: mux.dropped == 1)
    answerer.endpoint.sendto(b"\x80to-stranger", stranger)
    client_socket.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client_socket.recvfrom(100)


async def test_without_a_relay_wrapped_datagrams_are_not_unwrapped(
    mux: UdpMux, client_socket: socket.socket
) -> None:
    a = Recorder()
    ufrag = mux.new_ufrag()
    mux.open(ufrag, a)
    wrapped = framing.encode_header(("198.51.100.9", 50000)) + binding_request(f"{ufrag}:c")
    client_socket.sendto(wrapped, mux.advertised)
    await until(lambda: mux.dropped == 1)
    assert a.received == []
