"""An offer's ICE candidates: a cap, and no checks from the server to addresses outside policy.

The end-to-end tests run a real server (``hark.server.app``) and real aiortc/aioice peers,
and watch what arrives on UDP sockets the offers name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator

import aiohttp
import pytest
from aioice import stun
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from hark.tools.egress import EgressPolicy
from hark.transports.webrtc.candidates import (
    MAX_OFFER_CANDIDATES,
    CandidatePolicy,
    TooManyCandidates,
    network_kind,
)
from hark.transports.webrtc.ice import ice_transports
from tests.transports.conftest import API_KEY, RtcServer, StartRtcServer, bearer, until

# What the server tells clients it is reached at, in the tests of a server on a public
# address: nothing is ever sent to it (no client is given the answer).
PUBLIC_ADVERTISED = "1.2.3.4"


def host_candidate(address: str, port: int, priority: int, n: int = 0) -> str:
    return f"a=candidate:h{n} 1 udp {priority} {address} {port} typ host\r\n"


def with_candidates(offer: str, lines: list[str], end_of_candidates: bool = True) -> str:
    """``offer`` with its own candidates replaced by ``lines`` (in its first media section)."""
    kept = [
        line
        for line in offer.splitlines()
        if not line.startswith("a=candidate:") and line != "a=end-of-candidates"
    ]
    media = [i for i, line in enumerate(kept) if line.startswith("m=")]
    second_media = media[1] if len(media) > 1 else len(kept)
    extra = [line.rstrip("\r\n") for line in lines]
    if end_of_candidates:
        extra.append("a=end-of-candidates")
    return "\r\n".join(kept[:second_media] + extra + kept[second_media:]) + "\r\n"


async def client_offer() -> tuple[RTCPeerConnection, str]:
    """A real aiortc client's offer (audio and the events channel), and the client."""
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    client.addTransceiver("audio")
    client.createDataChannel("oai-events")
    await client.setLocalDescription(await client.createOffer())
    return client, client.localDescription.sdp


@pytest.fixture
def listeners() -> Iterator[dict[str, socket.socket]]:
    """Plain non-blocking UDP sockets on two loopback addresses: what the server sends to an
    address lands in its socket's buffer before ``sendto`` returns."""
    made = {}
    for address in ("127.0.0.1", "127.0.0.2"):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((address, 0))
        sock.setblocking(False)
        made[address] = sock
    yield made
    for sock in made.values():
        sock.close()


def received(sock: socket.socket) -> list[bytes]:
    datagrams = []
    while True:
        try:
            datagrams.append(sock.recv(2048))
        except BlockingIOError:
            return datagrams


def received_into(sock: socket.socket, into: list[bytes]) -> list[bytes]:
    into.extend(received(sock))
    return into


def is_binding_request(data: bytes) -> bool:
    message = stun.parse_message(data)
    return (message.message_method, message.message_class) == (
        stun.Method.BINDING,
        stun.Class.REQUEST,
    )


async def post_offer(http: aiohttp.ClientSession, server: RtcServer, offer: str) -> tuple[int, str]:
    headers = {**bearer(API_KEY), "Content-Type": "application/sdp"}
    async with http.post(server.url + "/v1/realtime/calls", data=offer, headers=headers) as r:
        return r.status, await r.text()


# ---------------------------------------------------------------------------- the policy


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("8.8.8.8", "public"),
        ("2a00:1450::1", "public"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.251", None),
        ("ff02::1", None),
        ("0.0.0.0", None),
        ("::", None),
        ("255.255.255.255", None),
        ("192.0.2.1", None),
    ],
)
def test_network_kinds(address: str, kind: str | None) -> None:
    assert network_kind(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize(
    ("server", "allowed"),
    [
        # A browser on the same machine as a server on loopback.
        ("127.0.0.1", {"8.8.8.8", "127.0.0.1", "::1"}),
        # A LAN, or a container's network: the hosts on it.
        ("192.168.1.10", {"8.8.8.8", "10.1.2.3", "192.168.1.20", "100.64.0.1", "fd00::1"}),
        ("169.254.10.10", {"8.8.8.8", "169.254.169.254", "fe80::1"}),
        # The internet: nothing but the internet.
        (PUBLIC_ADVERTISED, {"8.8.8.8"}),
        ("2a00:1450::80", {"8.8.8.8"}),
        # An address on no network a peer is on (documentation): the same.
        ("192.0.2.80", {"8.8.8.8"}),
    ],
)
def test_which_candidates_a_server_checks(server: str, allowed: set[str]) -> None:
    candidates = [
        "8.8.8.8",
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "192.168.1.20",
        "100.64.0.1",
        "fd00::1",
        "169.254.169.254",
        "fe80::1",
        "224.0.0.251",
        "0.0.0.0",
        "255.255.255.255",
        "192.0.2.1",
    ]
    policy = CandidatePolicy.serving_at(server)
    assert {c for c in candidates if policy.allows(ipaddress.ip_address(c))} == allowed


def test_the_egress_allow_list_opens_networks_for_candidates() -> None:
    policy = CandidatePolicy.serving_at(PUBLIC_ADVERTISED, EgressPolicy.parse(["10.0.0.0/8"]))
    assert policy.allows(ipaddress.ip_address("10.9.9.9"))
    assert not policy.allows(ipaddress.ip_address("192.168.1.1"))
    assert not policy.allows(ipaddress.ip_address("127.0.0.1"))


def test_screening_keeps_what_may_be_checked_and_drops_end_of_candidates() -> None:
    lines = [
        "v=0\r\n",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
        host_candidate("8.8.8.8", 5000, 100),
        host_candidate("10.1.2.3", 5000, 100),
        "a=candidate:m 1 udp 100 1f4e0c1b-7e2c-4b1a.local 54321 typ host\r\n",
        "a=candidate:t 1 tcp 100 8.8.4.4 9 typ host tcptype active\r\n",
        "a=candidate:x 1 udp 100 8.8.4.4\r\n",
        "a=candidate:s 1 udp 90 8.8.4.4 6000 typ srflx raddr 10.0.0.1 rport 6000\r\n",
        "a=end-of-candidates\r\n",
    ]
    screened = CandidatePolicy.serving_at(PUBLIC_ADVERTISED).screen("".join(lines))
    assert screened == "".join([*lines[:3], lines[7]])


def test_an_offer_may_list_a_bounded_number_of_candidates() -> None:
    policy = CandidatePolicy.serving_at("127.0.0.1")
    many = [host_candidate("10.0.0.1", 1000 + n, 100, n) for n in range(MAX_OFFER_CANDIDATES)]
    # A candidate repeated in another media section is the same candidate.
    offer = "v=0\r\nm=audio 9 x\r\n" + "".join(many) + "m=application 9 x\r\n" + "".join(many)
    policy.screen(offer)
    with pytest.raises(TooManyCandidates, match=str(MAX_OFFER_CANDIDATES)):
        policy.screen(offer + host_candidate("10.0.0.2", 9, 100))


# ---------------------------------------------------------------------------- real peers


async def test_a_public_server_sends_no_check_to_an_address_an_offer_merely_lists(
    start_rtc_server: StartRtcServer,
    http: aiohttp.ClientSession,
    listeners: dict[str, socket.socket],
) -> None:
    # Clients reach this server at a public address (a 1:1 NAT in front of it, say); the
    # operator allows 127.0.0.2 to be reached, and nothing else that is not public.
    server = await start_rtc_server(rtc_advertise_ip=PUBLIC_ADVERTISED, egress_allow=("127.0.0.2",))
    stranger = listeners["127.0.0.1"].getsockname()
    allowed = listeners["127.0.0.2"].getsockname()
    client, offer = await client_offer()
    await client.close()
    # Highest priority first: the stranger's would be the first check sent.
    lines = [
        host_candidate(stranger[0], stranger[1], 2130706431, 1),
        host_candidate("10.1.2.3", 9, 2130706430, 2),
        host_candidate("169.254.169.254", 9, 2130706429, 3),
        host_candidate("100.64.0.1", 9, 2130706428, 4),
        host_candidate("224.0.0.251", 5353, 2130706427, 5),
        host_candidate("0.0.0.0", 9, 2130706426, 6),
        host_candidate(allowed[0], allowed[1], 100, 7),
    ]
    status, answer = await post_offer(http, server, with_candidates(offer, lines))
    assert status == 201, answer
    assert f" {PUBLIC_ADVERTISED} " in answer
    # The server checks the allowed address; by then the stranger's check would be there.
    checks: list[bytes] = []
    await until(lambda: bool(received_into(listeners["127.0.0.2"], checks)))
    assert all(is_binding_request(data) for data in checks)
    assert received(listeners["127.0.0.1"]) == []
    (call,) = server.calls
    (transport,) = ice_transports(call.pc)
    assert [(c.ip, c.port) for c in transport.getRemoteCandidates()] == [allowed]


async def test_a_loopback_server_checks_a_loopback_candidate(
    start_rtc_server: StartRtcServer,
    http: aiohttp.ClientSession,
    listeners: dict[str, socket.socket],
) -> None:
    # The default deployment: a browser on the same machine.
    server = await start_rtc_server()
    local = listeners["127.0.0.1"].getsockname()
    client, offer = await client_offer()
    await client.close()
    lines = [host_candidate(local[0], local[1], 2130706431), host_candidate("10.1.2.3", 9, 100)]
    status, answer = await post_offer(http, server, with_candidates(offer, lines))
    assert status == 201, answer
    (call,) = server.calls
    (transport,) = ice_transports(call.pc)
    assert [(c.ip, c.port) for c in transport.getRemoteCandidates()] == [local]
    found: list[bytes] = []
    await until(lambda: bool(received_into(listeners["127.0.0.1"], found)))
    assert all(is_binding_request(data) for data in found)


async def test_a_client_whose_candidates_are_all_refused_still_connects(
    start_rtc_server: StartRtcServer, http: aiohttp.ClientSession
) -> None:
    # What a browser that waited for its candidates sends: mDNS names and end-of-candidates.
    # None can be checked; the client's own checks find the way.
    server = await start_rtc_server()
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    client.addTransceiver("audio")
    channel = client.createDataChannel("oai-events")
    messages: asyncio.Queue[str] = asyncio.Queue()
    channel.on("message", messages.put_nowait)
    try:
        await client.setLocalDescription(await client.createOffer())
        lines = ["a=candidate:m 1 udp 2130706431 1f4e0c1b-7e2c-4b1a.local 54321 typ host\r\n"]
        offer = with_candidates(client.localDescription.sdp, lines)
        status, answer = await post_offer(http, server, offer)
        assert status == 201, answer
        await client.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await until(lambda: client.connectionState in ("connected", "failed"), limit_s=30)
        assert client.connectionState == "connected"
        async with asyncio.timeout(30):
            assert '"session.created"' in await messages.get()
    finally:
        await client.close()


async def test_an_offer_with_too_many_candidates_is_400(
    start_rtc_server: StartRtcServer, http: aiohttp.ClientSession
) -> None:
    server = await start_rtc_server()
    client, offer = await client_offer()
    await client.close()
    lines = [host_candidate("10.0.0.1", 1000 + n, 100, n) for n in range(MAX_OFFER_CANDIDATES)]
    status, text = await post_offer(
        http, server, with_candidates(offer, [*lines, host_candidate("10.0.0.2", 9, 100)])
    )
    assert status == 400
    assert f"more than {MAX_OFFER_CANDIDATES} ICE candidates" in text
    assert '"invalid_offer"' in text
    assert len(server.calls) == 0
    status, text = await post_offer(http, server, with_candidates(offer, lines))
    assert status == 201, text


def test_a_server_address_that_is_no_ip_address_checks_public_candidates_only() -> None:
    policy = CandidatePolicy.serving_at("media.example.com")
    assert policy.allows(ipaddress.ip_address("8.8.8.8"))
    assert not policy.allows(ipaddress.ip_address("127.0.0.1"))
    assert not policy.allows(ipaddress.ip_address("10.1.2.3"))
