"""A call's audio RTP, sent and received here, over aiortc's ICE, DTLS and SRTP keys.

aiortc handles every RTP packet in several layers of Python: aioice tries to parse it as
STUN, queues it for the DTLS transport's task, which parses an ``RtpPacket`` and routes it
to the receiver, whose jitter buffer assembles a frame for a decoder thread, which wakes
the event loop again to hand back an ``AudioFrame`` to be resampled. Sending, a track's
packet goes through an encoder wrapper, an ``RtpPacket`` with header extensions and two
awaits per packet, on a timer per call. That is most of what a call costs the server.

``AudioPath`` takes a call's audio over once the peer connection is connected (DTLS done,
SRTP keys made), and leaves everything else to aiortc: ICE checks and consent freshness,
DTLS and the data channel, RTCP. Received, a datagram of the call that is SRTP but not
SRTCP (RFC 5761, RFC 7983) is taken off before aioice sees it, decrypted with the DTLS
transport's SRTP session and decoded by ``InputAudio``; everything else goes on to aioice
as before. Sent, the worker's ``Pacer`` (``hark.transports.ticker``) takes each frame of the
``PlayoutTrack`` as its playout makes it due, and each becomes one RTP packet
(``hark.transports.rtp``: the negotiated Opus payload type, the sender's SSRC, the MID
header extension when negotiated), protected with the transport's SRTP session and written
to the nominated ICE pair. aiortc's sender stays in place, idle (its
track gives nothing), sending its RTCP sender reports, whose counts are kept up to date;
aiortc's receiver is never started (no decoder thread, no receiver reports).

This relies on private parts of aiortc and aioice, reached through
``hark.transports.webrtc.aiortc_internals`` (where a test pins them): the DTLS transport's
SRTP sessions; the ICE connection's ``StunProtocol`` objects, each with the ``MuxEndpoint``
as its ``transport`` (see ``hark.transports.webrtc.ice``), and its nominated pair; the
transceiver's negotiated codecs and header extensions; the sender's SSRC and the counters
its sender reports are made of (also checked as each call starts). And on the peer
connection starting the receiver with ``receiver.receive`` after the "connected" state is
announced (``tests/transports/webrtc/test_webrtc_rtp_audio.py``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pylibsrtp
from aiortc import clock

from hark.transports.rtp import RtpError, is_rtp, pack_rtp, parse_rtp
from hark.transports.ticker import Pacer
from hark.transports.webrtc.aiortc_internals import (
    SENDER_NTP,
    SENDER_OCTETS,
    SENDER_PACKETS,
    SENDER_RTP,
    header_extensions,
    ice_connection,
    missing_report_counters,
    negotiated_codecs,
    nominated_pair,
    sender_ssrc,
    srtp_sessions,
    stun_protocols,
)
from hark.transports.webrtc.input_audio import InputAudio
from hark.transports.webrtc.playout import FRAME_SAMPLES, PlayoutTrack
from hark.transports.webrtc.udp_mux import MuxEndpoint

if TYPE_CHECKING:
    from aioice import Connection
    from aiortc import RTCRtpSender, RTCRtpTransceiver
    from aiortc.rtcrtpparameters import RTCRtpReceiveParameters

    from hark.transports.playout import Playout

logger = logging.getLogger(__name__)

MID_EXTENSION = "urn:ietf:params:rtp-hdrext:sdes:mid"
# Packets between readings of the NTP clock for the sender reports (a second of frames).
_CLOCK_EVERY = 50


def mid_extension(extension_id: int, mid: str) -> bytes:
    """An RTP header extension block (RFC 8285, one-byte form) carrying the MID."""
    value = mid.encode()
    element = bytes([(extension_id << 4) | (len(value) - 1)]) + value
    element += bytes(-len(element) % 4)
    return b"\xbe\xde" + struct.pack("!H", len(element) // 4) + element


@dataclass(slots=True, eq=False)
class AudioReceiver(asyncio.DatagramProtocol):
    """Between a call's ``MuxEndpoint`` and aioice's protocol (``inner``): RTP comes off
    here, unprotected with ``srtp``, and its audio of ``payload_types`` goes to ``audio``."""

    inner: asyncio.DatagramProtocol
    srtp: pylibsrtp.Session
    payload_types: frozenset[int]
    audio: InputAudio
    packets: int = field(default=0, init=False)
    rejected: int = field(default=0, init=False)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        """Decode the call's RTP; hand anything else to aioice."""
        if len(data) > 12 and is_rtp(data):
            self._rtp(data)
        else:
            self.inner.datagram_received(data, addr)

    def error_received(self, exc: Exception) -> None:
        """Passed on to aioice."""
        self.inner.error_received(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        """Passed on to aioice (the mux endpoint closed)."""
        self.inner.connection_lost(exc)

    def _rtp(self, data: bytes) -> None:
        try:
            packet = self.srtp.unprotect(data)
        except pylibsrtp.Error:
            self.rejected += 1
            return
        try:
            payload_type, _, sequence, timestamp, ssrc, payload = parse_rtp(packet)
        except RtpError:
            self.rejected += 1
            return
        if payload_type not in self.payload_types:
            self.rejected += 1
            return
        if not payload:
            return
        self.packets += 1
        self.audio.packet(ssrc, sequence, timestamp, payload)


class AudioSender:
    """Sends ``track``'s frames as the call's RTP, one packet per frame as it falls due."""

    def __init__(
        self,
        track: PlayoutTrack,
        srtp: pylibsrtp.Session,
        ice: Connection,
        sender: RTCRtpSender,
        payload_type: int,
        extension: bytes,
    ) -> None:
        # The sender's report counters are kept up to date here: an aiortc that renamed them
        # fails the call (and the tests) instead of sending reports that count nothing.
        missing = missing_report_counters(sender)
        if missing:
            raise RuntimeError(f"this aiortc's RTCRtpSender has no {', '.join(missing)}")
        self.track = track
        self._srtp = srtp
        self._ice = ice
        self._sender = sender
        self._ssrc = sender_ssrc(sender)
        self._payload_type = payload_type
        self._extension = extension
        self._sequence = random.getrandbits(16)
        self._timestamp_origin = random.getrandbits(32)
        self.packets = 0
        self._octets = 0

    @property
    def playout(self) -> Playout:
        """The track's playout, whose schedule the pacer follows."""
        return self.track.playout

    def send_frame(self, due: float) -> None:
        """Send the track's next frame, due now (the pacer's ``PacedStream``)."""
        playout = self.track.playout
        # Frames a stall skipped count: the timestamp is the frame's time on the clock.
        frames = playout.frames_sent + playout.frames_skipped
        timestamp = (self._timestamp_origin + frames * FRAME_SAMPLES) & 0xFFFFFFFF
        self._send(timestamp, self.track.next_payload())

    def frames_sent(self) -> None:
        """Nothing waits for the tick's frames: the caller's audio is passed on as it comes."""

    def _send(self, timestamp: int, payload: bytes) -> None:
        packet = pack_rtp(
            self._payload_type,
            self._sequence,
            timestamp,
            self._ssrc,
            payload,
            extension=self._extension,
        )
        self._sequence = (self._sequence + 1) & 0xFFFF
        pair = nominated_pair(self._ice)
        if pair is None:
            return
        pair.protocol.transport.sendto(self._srtp.protect(packet), pair.remote_addr)
        self.packets += 1
        self._octets += len(payload)
        # What aiortc's sender reports (RTCP SR) comes from these. The NTP time of a packet
        # (slow to read in aiortc) is taken once a second: a report's NTP and RTP times need
        # to name the same instant, not the latest one.
        sender = self._sender
        if self.packets % _CLOCK_EVERY == 1:
            setattr(sender, SENDER_NTP, clock.current_ntp_time())
            setattr(sender, SENDER_RTP, timestamp)
        setattr(sender, SENDER_PACKETS, self.packets)
        setattr(sender, SENDER_OCTETS, self._octets)


async def _not_receiving(parameters: RTCRtpReceiveParameters) -> None:
    """What ``RTCRtpReceiver.receive`` becomes: the receiver stays as it was made."""


@dataclass(slots=True, eq=False)
class AudioPath:
    """A call's audio in both directions, taken over from aiortc; see the module. The
    ``pacer`` sends the ``sender``'s frames from the start."""

    receivers: list[tuple[MuxEndpoint, AudioReceiver]]
    sender: AudioSender
    pacer: Pacer

    def __post_init__(self) -> None:
        self.pacer.add(self.sender)

    @classmethod
    def take_over(
        cls,
        transceiver: RTCRtpTransceiver,
        track: PlayoutTrack,
        pacer: Pacer,
        audio: InputAudio,
    ) -> AudioPath:
        """Take the audio of a connected call's ``transceiver`` over from aiortc."""
        dtls = transceiver.receiver.transport
        rx, tx = srtp_sessions(dtls)
        if rx is None or tx is None:
            raise RuntimeError("the call's DTLS transport has no SRTP keys yet")
        ice = ice_connection(dtls.transport)
        opus = [
            c.payloadType
            for c in negotiated_codecs(transceiver)
            if c.mimeType.lower() == "audio/opus" and c.payloadType is not None
        ]
        extension = b""
        for parameters in header_extensions(transceiver):
            if parameters.uri == MID_EXTENSION and transceiver.mid:
                extension = mid_extension(parameters.id, transceiver.mid)
        track.drive()
        # aiortc's receiver is never started: it would run a decoder thread and an RTCP
        # task for a stream that no longer reaches it.
        setattr(transceiver.receiver, "receive", _not_receiving)  # noqa: B010
        sender = AudioSender(track, tx, ice, transceiver.sender, opus[0], extension)
        receivers = []
        for protocol in stun_protocols(ice):
            endpoint = protocol.transport
            if isinstance(endpoint, MuxEndpoint):
                receiver = AudioReceiver(protocol, rx, frozenset(opus), audio)
                endpoint.set_protocol(receiver)
                receivers.append((endpoint, receiver))
        return cls(receivers, sender, pacer)

    def close(self) -> None:
        """Stop sending; what arrives from now on goes to aioice, which is closing too."""
        self.pacer.remove(self.sender)
        for endpoint, receiver in self.receivers:
            if endpoint.get_protocol() is receiver:
                endpoint.set_protocol(receiver.inner)
