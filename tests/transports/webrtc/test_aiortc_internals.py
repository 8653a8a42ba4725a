"""Pins each private part of aiortc and aioice that hark reaches
(``hark.transports.webrtc.aiortc_internals``) against the installed versions, on two real
peer connections: an upgrade that renames or reshapes one fails here, naming it."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator

import pylibsrtp
import pytest
from aioice import Connection
from aioice.ice import CandidatePair, StunProtocol
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpTransceiver
from aiortc.rtcrtpparameters import RTCRtpCodecParameters, RTCRtpHeaderExtensionParameters

from hark.transports.webrtc.aiortc_internals import (
    SENDER_REPORT_COUNTERS,
    header_extensions,
    ice_connection,
    missing_report_counters,
    negotiated_codecs,
    nominated_pair,
    sctp_receive,
    sender_ssrc,
    set_local_username,
    set_sctp_receive,
    srtp_sessions,
    stun_protocols,
)
from hark.transports.webrtc.ice import ice_transports
from tests.transports.conftest import until


def new_pc() -> RTCPeerConnection:
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


async def negotiate(client: RTCPeerConnection, server: RTCPeerConnection) -> RTCRtpTransceiver:
    """Offer audio and a data channel from ``client``; the server's audio transceiver."""
    client.addTransceiver("audio")
    client.createDataChannel("oai-events")
    await client.setLocalDescription(await client.createOffer())
    await server.setRemoteDescription(client.localDescription)
    (transceiver,) = server.getTransceivers()
    transceiver.direction = "sendrecv"
    return transceiver


@pytest.fixture
async def peers() -> AsyncIterator[tuple[RTCPeerConnection, RTCPeerConnection]]:
    client, server = new_pc(), new_pc()
    yield client, server
    await client.close()
    await server.close()


async def test_before_gathering(peers: tuple[RTCPeerConnection, RTCPeerConnection]) -> None:
    client, server = peers
    await negotiate(client, server)
    (transport,) = ice_transports(server)
    connection = ice_connection(transport)
    assert type(connection) is Connection
    # ice.SharedPortConnection overrides it, keeping aioice's signature.
    assert list(inspect.signature(connection.get_component_candidates).parameters) == [
        "component",
        "addresses",
        "timeout",
    ]
    assert stun_protocols(connection) == []
    assert nominated_pair(connection) is None
    set_local_username(connection, "hark")
    assert connection.local_username == "hark"
    dtls = server.getTransceivers()[0].receiver.transport
    assert srtp_sessions(dtls) == (None, None)


async def test_a_connected_call(peers: tuple[RTCPeerConnection, RTCPeerConnection]) -> None:
    client, server = peers
    transceiver = await negotiate(client, server)
    await server.setLocalDescription(await server.createAnswer())
    await client.setRemoteDescription(server.localDescription)
    await until(lambda: server.connectionState == "connected")

    connection = ice_connection(transceiver.receiver.transport.transport)
    protocols = stun_protocols(connection)
    assert protocols and all(isinstance(p, StunProtocol) for p in protocols)
    pair = nominated_pair(connection)
    assert isinstance(pair, CandidatePair) and pair.protocol in protocols
    rx, tx = srtp_sessions(transceiver.receiver.transport)
    assert isinstance(rx, pylibsrtp.Session) and isinstance(tx, pylibsrtp.Session)
    codecs = negotiated_codecs(transceiver)
    assert codecs and all(isinstance(c, RTCRtpCodecParameters) for c in codecs)
    assert "audio/opus" in {c.mimeType.lower() for c in codecs}
    extensions = header_extensions(transceiver)
    assert all(isinstance(e, RTCRtpHeaderExtensionParameters) for e in extensions)
    assert isinstance(sender_ssrc(transceiver.sender), int)
    assert missing_report_counters(transceiver.sender) == []
    assert len(SENDER_REPORT_COUNTERS) == 4

    sctp = server.sctp
    assert sctp is not None
    receive = sctp_receive(sctp)
    assert inspect.iscoroutinefunction(receive)
    assert list(inspect.signature(receive).parameters) == ["stream_id", "pp_id", "data"]
    heard: list[bytes] = []

    async def record(stream_id: int, pp_id: int, data: bytes) -> None:
        heard.append(data)
        await receive(stream_id, pp_id, data)

    set_sctp_receive(sctp, record)
    channel = client.createDataChannel("pinned")
    await until(lambda: channel.readyState == "open")
    channel.send("hello")
    await until(lambda: b"hello" in heard)
