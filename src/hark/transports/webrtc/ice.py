"""ICE on the shared port: aiortc's peer connection, gathering through the worker's UDP mux.

aiortc's ``RTCPeerConnection`` builds one ``aioice.Connection`` per ICE transport and
aioice binds a socket per host address while gathering. Here, between
``setRemoteDescription`` (which creates the transports) and ``setLocalDescription`` (which
gathers), each connection is switched to ``SharedPortConnection``: the same object and
state, whose ``get_component_candidates`` opens a ``MuxEndpoint`` instead of a socket and
returns the one host candidate of the shared port. Everything else (checks, nomination,
consent freshness, DTLS on top) is aioice's and aiortc's own code, unchanged. The server
runs full ICE in the controlled role (aioice has no lite mode): it answers the client's
checks and checks back, both through the shared socket; no STUN or TURN server is used.

This relies on gathering calling ``Connection.get_component_candidates(component,
addresses)`` once per component, and on private parts of aioice and aiortc reached through
``hark.transports.webrtc.aiortc_internals`` (the ``aioice.Connection`` of an ICE transport,
its STUN protocols, its local ufrag), where a test pins them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aioice import Candidate, Connection
from aioice.candidate import candidate_foundation, candidate_priority
from aioice.ice import StunProtocol, validate_username

from hark.transports.webrtc.aiortc_internals import (
    ice_connection,
    set_local_username,
    stun_protocols,
)

if TYPE_CHECKING:
    from aiortc import RTCIceTransport, RTCPeerConnection

    from hark.transports.webrtc.udp_mux import UdpMux


class SharedPortConnection(Connection):
    """An ``aioice.Connection`` whose only local candidate is the worker's shared port."""

    _hark_mux: UdpMux

    async def get_component_candidates(
        # aioice's signature, timeout included (it bounds STUN/TURN queries we never make).
        self,
        component: int,
        addresses: list[str],
        timeout: int = 5,  # noqa: ASYNC109
    ) -> list[Candidate]:
        """Register with the mux under this connection's ufrag; no socket is opened.

        ``addresses`` (this machine's interfaces) are ignored: clients are told of the
        shared port's advertised address only.
        """
        protocol = StunProtocol(self)
        endpoint = self._hark_mux.open(self.local_username, protocol)
        protocol.connection_made(endpoint)
        host, port = endpoint.get_extra_info("sockname")
        protocol.local_candidate = Candidate(
            foundation=candidate_foundation("host", "udp", host),
            component=component,
            transport="udp",
            priority=candidate_priority(component, "host"),
            host=host,
            port=port,
            type="host",
        )
        stun_protocols(self).append(protocol)
        return [protocol.local_candidate]


def ice_transports(pc: RTCPeerConnection) -> list[RTCIceTransport]:
    """The distinct ICE transports of a peer connection (one when the offer bundles)."""
    found: list[RTCIceTransport] = []
    for transceiver in pc.getTransceivers():
        ice = transceiver.receiver.transport.transport
        if ice not in found:
            found.append(ice)
    if pc.sctp is not None and pc.sctp.transport.transport not in found:
        found.append(pc.sctp.transport.transport)
    return found


def use_shared_port(pc: RTCPeerConnection, mux: UdpMux) -> list[str]:
    """Make ``pc`` gather on ``mux``; call after ``setRemoteDescription``, before answering.

    Each ICE transport gets a fresh server ufrag from the mux; returns them.
    """
    ufrags = []
    for transport in ice_transports(pc):
        connection = ice_connection(transport)
        if isinstance(connection, SharedPortConnection):
            continue
        if type(connection) is not Connection or connection.local_candidates:
            raise RuntimeError("this ICE transport has gathered already")
        ufrag = mux.new_ufrag()
        validate_username(ufrag)
        connection.__class__ = SharedPortConnection
        assert isinstance(connection, SharedPortConnection)
        connection._hark_mux = mux
        set_local_username(connection, ufrag)
        ufrags.append(ufrag)
    return ufrags
