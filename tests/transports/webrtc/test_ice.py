"""aiortc's ICE gathering on the shared port; pins the aioice/aiortc details it relies on."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from hark.transports.webrtc.aiortc_internals import ice_connection
from hark.transports.webrtc.ice import SharedPortConnection, ice_transports, use_shared_port
from hark.transports.webrtc.udp_mux import UdpMux, route_hint
from tests.transports.conftest import until


@pytest.fixture
async def mux() -> AsyncIterator[UdpMux]:
    mux = UdpMux("127.0.0.1", 0)
    await mux.start()
    yield mux
    await mux.close()


def new_pc() -> RTCPeerConnection:
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


async def offer_from(client: RTCPeerConnection) -> RTCSessionDescription:
    client.addTransceiver("audio")
    client.createDataChannel("oai-events")
    await client.setLocalDescription(await client.createOffer())
    return client.localDescription


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_bundled_offer_gathers_one_candidate_on_the_shared_port(mux: UdpMux) -> None:
    client, server = new_pc(), new_pc()
    try:
        await server.setRemoteDescription(await offer_from(client))
        (ufrag,) = use_shared_port(server, mux)
        assert route_hint(ufrag) == mux.route_hint
        fds = open_fds()
        await server.setLocalDescription(await server.createAnswer())
        assert open_fds() == fds, "gathering opened a socket"
        (transport,) = ice_transports(server)
        connection = ice_connection(transport)
        assert isinstance(connection, SharedPortConnection)
        assert connection.local_username == ufrag
        (candidate,) = transport.iceGatherer.getLocalCandidates()
        assert (candidate.ip, candidate.port, candidate.type) == (*mux.advertised, "host")
        answer = server.localDescription.sdp
        assert f"a=ice-ufrag:{ufrag}" in answer
        candidates = [line for line in answer.splitlines() if line.startswith("a=candidate:")]
        assert candidates and all(f" {mux.port} typ host" in line for line in candidates)
        assert mux.connections == 1
    finally:
        await server.close()
        await client.close()
    assert mux.connections == 0


async def test_sharing_twice_is_a_no_op_and_after_gathering_an_error(mux: UdpMux) -> None:
    client, server = new_pc(), new_pc()
    try:
        await server.setRemoteDescription(await offer_from(client))
        assert len(use_shared_port(server, mux)) == 1
        assert use_shared_port(server, mux) == []
        other = new_pc()
        await other.setRemoteDescription(await offer_from(new_pc()))
        await other.setLocalDescription(await other.createAnswer())
        with pytest.raises(RuntimeError):
            use_shared_port(other, mux)
        await other.close()
    finally:
        await server.close()
        await client.close()


async def test_peers_connect_through_one_socket(mux: UdpMux) -> None:
    pairs = []
    for _ in range(3):
        client, server = new_pc(), new_pc()
        channel = client.createDataChannel("oai-events")
        received: asyncio.Queue[str] = asyncio.Queue()
        channel.on("message", received.put_nowait)
        server.on("datachannel", lambda c: c.on("message", lambda m, c=c: c.send("echo " + m)))
        client.addTransceiver("audio")
        await client.setLocalDescription(await client.createOffer())
        await server.setRemoteDescription(client.localDescription)
        use_shared_port(server, mux)
        await server.setLocalDescription(await server.createAnswer())
        await client.setRemoteDescription(server.localDescription)
        pairs.append((client, server, channel, received))
    try:
        for n, (_, _, channel, received) in enumerate(pairs):
            await until(functools.partial(lambda c: c.readyState == "open", channel))
            channel.send(f"hello {n}")
            async with asyncio.timeout(5):
                assert await received.get() == f"echo hello {n}"
        assert mux.connections == 3
        assert mux.addresses >= 3
    finally:
        for client, server, _, _ in pairs:
            await client.close()
            await server.close()
    assert (mux.connections, mux.addresses) == (0, 0)
