"""The private parts of aiortc and aioice that hark's WebRTC transport relies on, in one place.

aiortc has no public way to gather on a socket it did not open (``hark.transports.webrtc.ice``),
to take a connected call's audio over (``hark.transports.webrtc.rtp_audio``) or to hold a
data channel's reading back (``hark.transports.webrtc.call``). Those modules do it through
the names below and no others; ``tests/transports/webrtc/test_aiortc_internals.py`` checks
each against the installed aiortc and aioice, so that an upgrade that renames one fails
there, naming it, rather than in a call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pylibsrtp
    from aioice import Connection
    from aioice.ice import CandidatePair, StunProtocol
    from aiortc import RTCDtlsTransport, RTCIceTransport, RTCRtpSender, RTCRtpTransceiver
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters, RTCRtpHeaderExtensionParameters
    from aiortc.rtcsctptransport import RTCSctpTransport

# What an SCTP transport calls with each message of a data channel: (stream id, payload
# protocol id, data).
SctpReceive = Callable[[int, int, bytes], Awaitable[None]]

# The private state of aiortc's RTCRtpSender its RTCP sender reports are made of: the NTP and
# RTP times of one packet, and the packets and octets sent.
SENDER_NTP = "_RTCRtpSender__ntp_timestamp"
SENDER_RTP = "_RTCRtpSender__rtp_timestamp"
SENDER_PACKETS = "_RTCRtpSender__packet_count"
SENDER_OCTETS = "_RTCRtpSender__octet_count"
SENDER_REPORT_COUNTERS = (SENDER_NTP, SENDER_RTP, SENDER_PACKETS, SENDER_OCTETS)


def ice_connection(transport: RTCIceTransport) -> Connection:
    """The ``aioice.Connection`` behind an ICE transport (its gatherer's ``_connection``)."""
    connection: Connection = transport.iceGatherer._connection
    return connection


def stun_protocols(connection: Connection) -> list[StunProtocol]:
    """The connection's STUN protocols, one per local candidate (``_protocols``): the list
    itself, which ``Connection.close`` closes them from."""
    protocols: list[StunProtocol] = connection._protocols
    return protocols


def set_local_username(connection: Connection, ufrag: str) -> None:
    """Make ``ufrag`` the connection's local ICE username fragment (``_local_username``)."""
    connection._local_username = ufrag


def nominated_pair(connection: Connection) -> CandidatePair | None:
    """The nominated candidate pair of the connection's component 1 (``_nominated``), None
    until ICE has nominated one."""
    pair: CandidatePair | None = connection._nominated.get(1)
    return pair


def srtp_sessions(
    dtls: RTCDtlsTransport,
) -> tuple[pylibsrtp.Session | None, pylibsrtp.Session | None]:
    """The DTLS transport's SRTP sessions, receiving and sending (``_rx_srtp``,
    ``_tx_srtp``): None until the handshake has made the keys."""
    return dtls._rx_srtp, dtls._tx_srtp


def negotiated_codecs(transceiver: RTCRtpTransceiver) -> list[RTCRtpCodecParameters]:
    """The codecs the transceiver negotiated (``_codecs``)."""
    codecs: list[RTCRtpCodecParameters] = transceiver._codecs
    return codecs


def header_extensions(transceiver: RTCRtpTransceiver) -> list[RTCRtpHeaderExtensionParameters]:
    """The RTP header extensions the transceiver negotiated (``_headerExtensions``)."""
    extensions: list[RTCRtpHeaderExtensionParameters] = transceiver._headerExtensions
    return extensions


def sender_ssrc(sender: RTCRtpSender) -> int:
    """The SSRC the sender's RTP and RTCP carry (``_ssrc``)."""
    ssrc: int = sender._ssrc
    return ssrc


def missing_report_counters(sender: Any) -> list[str]:
    """Which of ``SENDER_REPORT_COUNTERS`` ``sender`` lacks (none, for the aiortc pinned)."""
    return [name for name in SENDER_REPORT_COUNTERS if not hasattr(sender, name)]


def sctp_receive(sctp: RTCSctpTransport) -> SctpReceive:
    """Where the SCTP transport hands each data channel message on (``_receive``)."""
    receive: SctpReceive = sctp._receive
    return receive


def set_sctp_receive(sctp: RTCSctpTransport, receive: SctpReceive) -> None:
    """Make ``receive`` take the SCTP transport's data channel messages (``_receive``)."""
    setattr(sctp, "_receive", receive)  # noqa: B010
