"""RTP (RFC 3550) for every call transport: packing, parsing, the sender's counters and the
receiver's statistics.

Sans-I/O. The per-packet path is two functions that make no object per packet:
``pack_rtp`` writes the 12-byte header, an optional header extension block and the payload
into one ``bytes``, and ``parse_rtp`` reads a datagram's header fields and payload as a
tuple. SIP (``hark.transports.sip.media``) and WebRTC (``hark.transports.webrtc.rtp_audio``)
both send and receive through them. ``RtpPacket`` is the whole packet as a value (CSRCs,
extension, padding), for tools and tests. ``RtpSender`` numbers outgoing packets (random
initial sequence number, timestamp and SSRC, wrapping at 2^16 and 2^32);
``ReceptionStats`` follows one incoming source the way RFC 3550's appendix A.1 and A.8 do
(extended highest sequence number, loss, reordering, interarrival jitter), with the arrival
time given by the caller.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass, field

RTP_VERSION = 2
HEADER = struct.Struct("!BBHII")
HEADER_SIZE = HEADER.size
SEQ_MOD = 1 << 16
TS_MOD = 1 << 32
# The first byte of a packet: version 2, no padding, no CSRC, with or without an extension.
_FIRST = RTP_VERSION << 6
_FIRST_EXTENDED = _FIRST | 0x10
# RFC 3550 A.1: a jump beyond this many packets forward is a restarted source, not loss;
# this far behind is a reordered or duplicated packet.
MAX_DROPOUT = 3000
MAX_MISORDER = 100


class RtpError(ValueError):
    """A datagram that is not a well-formed RTP packet."""


def seq_diff(a: int, b: int) -> int:
    """``a - b`` for 16-bit sequence numbers, in [-2^15, 2^15)."""
    return (a - b + (SEQ_MOD >> 1)) % SEQ_MOD - (SEQ_MOD >> 1)


def ts_diff(a: int, b: int) -> int:
    """``a - b`` for 32-bit timestamps, in [-2^31, 2^31)."""
    return (a - b + (TS_MOD >> 1)) % TS_MOD - (TS_MOD >> 1)


def is_rtcp(data: bytes) -> bool:
    """Whether a datagram on a shared port is RTCP rather than RTP (RFC 5761 section 4).

    RTCP packet types 192-223 sit where RTP's marker bit and payload types 64-95 would,
    which no audio profile assigns.
    """
    return len(data) >= 2 and 192 <= data[1] <= 223


def is_rtp(datagram: bytes) -> bool:
    """Whether a datagram of a port shared with STUN and DTLS (first byte 128-191, RFC 7983)
    is RTP rather than RTCP (see ``is_rtcp``)."""
    return 127 < datagram[0] < 192 and not 191 < datagram[1] < 224


def pack_rtp(
    payload_type: int,
    sequence: int,
    timestamp: int,
    ssrc: int,
    payload: bytes,
    *,
    marker: bool = False,
    extension: bytes = b"",
) -> bytes:
    """One packet: the header, ``extension`` (a whole header extension block, its 4-byte
    profile and length included, or nothing) and ``payload``.

    The fields must already be in range (``sequence`` below 2^16, ``timestamp`` below 2^32).
    """
    second = payload_type | 0x80 if marker else payload_type
    if extension:
        return HEADER.pack(_FIRST_EXTENDED, second, sequence, timestamp, ssrc) + extension + payload
    return HEADER.pack(_FIRST, second, sequence, timestamp, ssrc) + payload


def parse_rtp(data: bytes) -> tuple[int, bool, int, int, int, bytes]:
    """A datagram's (payload type, marker, sequence, timestamp, SSRC, payload); ``RtpError``
    says what is wrong with one that is not RTP."""
    size = len(data)
    if size < HEADER_SIZE:
        raise RtpError(f"{size} bytes is shorter than an RTP header")
    first, second, sequence, timestamp, ssrc = HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise RtpError(f"RTP version {first >> 6}")
    if not first & 0x3F:
        return second & 0x7F, second > 0x7F, sequence, timestamp, ssrc, data[HEADER_SIZE:]
    start = HEADER_SIZE + 4 * (first & 0x0F)
    if size < start:
        raise RtpError("truncated CSRC list")
    if first & 0x10:
        if size < start + 4:
            raise RtpError("truncated header extension")
        start += 4 + 4 * (data[start + 2] << 8 | data[start + 3])
        if size < start:
            raise RtpError("truncated header extension")
    end = size
    if first & 0x20:
        padding = data[-1]
        if padding == 0 or end - padding < start:
            raise RtpError(f"padding of {padding} bytes does not fit")
        end -= padding
    return second & 0x7F, second > 0x7F, sequence, timestamp, ssrc, data[start:end]


@dataclass(slots=True)
class RtpPacket:
    """One RTP packet. ``extension`` is (profile-defined id, data in 32-bit words)."""

    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes = b""
    marker: bool = False
    csrc: tuple[int, ...] = ()
    extension: tuple[int, bytes] | None = None
    padding: int = 0

    def pack(self) -> bytes:
        """The packet as a datagram."""
        if len(self.csrc) > 15:
            raise ValueError("at most 15 CSRCs")
        if not 0 <= self.padding <= 255:
            raise ValueError("padding is 0 to 255 bytes")
        first = RTP_VERSION << 6 | (0x20 if self.padding else 0) | len(self.csrc)
        if self.extension is not None:
            first |= 0x10
        second = (0x80 if self.marker else 0) | (self.payload_type & 0x7F)
        parts = [
            HEADER.pack(first, second, self.sequence % SEQ_MOD, self.timestamp % TS_MOD, self.ssrc)
        ]
        parts.extend(struct.pack("!I", c) for c in self.csrc)
        if self.extension is not None:
            profile, data = self.extension
            if len(data) % 4:
                raise ValueError("extension data is whole 32-bit words")
            parts.append(struct.pack("!HH", profile, len(data) // 4) + data)
        parts.append(self.payload)
        if self.padding:
            parts.append(bytes(self.padding - 1) + bytes([self.padding]))
        return b"".join(parts)

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        """Parse a datagram; ``RtpError`` says what is wrong with it."""
        payload_type, marker, sequence, timestamp, ssrc, payload = parse_rtp(data)
        first = data[0]
        count = first & 0x0F
        csrc = struct.unpack_from(f"!{count}I", data, HEADER_SIZE)
        extension = None
        if first & 0x10:
            offset = HEADER_SIZE + 4 * count
            profile, words = struct.unpack_from("!HH", data, offset)
            extension = (profile, data[offset + 4 : offset + 4 + 4 * words])
        return cls(
            payload_type=payload_type,
            sequence=sequence,
            timestamp=timestamp,
            ssrc=ssrc,
            payload=payload,
            marker=marker,
            csrc=csrc,
            extension=extension,
            padding=data[-1] if first & 0x20 else 0,
        )


@dataclass(slots=True)
class RtpSender:
    """Numbers one outgoing stream: sequence and timestamp start at random and wrap.

    The timestamp follows the sampling clock (``advance``) whether or not a packet is sent,
    so a pause (hold) shows as a timestamp gap, and the first packet after one is marked.
    """

    payload_type: int
    ssrc: int = field(default_factory=lambda: secrets.randbits(32))
    sequence: int = field(default_factory=lambda: secrets.randbits(16))
    timestamp: int = field(default_factory=lambda: secrets.randbits(32))
    packets: int = 0
    octets: int = 0
    _gap: bool = True

    def packet(self, payload: bytes, *, payload_type: int | None = None) -> bytes:
        """The next packet, at the current timestamp, carrying ``payload``."""
        packet = pack_rtp(
            self.payload_type if payload_type is None else payload_type,
            self.sequence,
            self.timestamp,
            self.ssrc,
            payload,
            marker=self._gap,
        )
        self._gap = False
        self.sequence = (self.sequence + 1) % SEQ_MOD
        self.packets += 1
        self.octets += len(payload)
        return packet

    def advance(self, samples: int) -> None:
        """Move the timestamp on by ``samples`` of the sampling clock."""
        self.timestamp = (self.timestamp + samples) % TS_MOD

    def pause(self) -> None:
        """Sending stops for a while: mark the first packet after it."""
        self._gap = True


@dataclass(slots=True)
class ReceptionStats:
    """What one incoming source's packets say about the path (RFC 3550 A.1, A.3, A.8).

    ``update`` takes each packet's sequence number and timestamp with its arrival time in
    seconds; it answers whether the packet is new (not a duplicate, not from before a
    restart). ``jitter`` is in timestamp units, as reports carry it.
    """

    clock_rate: int
    ssrc: int | None = None
    base_seq: int = 0
    max_seq: int = 0
    cycles: int = 0
    received: int = 0
    reordered: int = 0
    duplicates: int = 0
    jitter: float = 0.0
    _last: tuple[float, int] | None = None
    _expected_prior: int = 0
    _received_prior: int = 0
    _bad_seq: int | None = None
    _seen: set[int] = field(default_factory=set)

    def update(self, ssrc: int, sequence: int, timestamp: int, arrival: float) -> bool:
        """Account for one packet; whether it is new."""
        if ssrc != self.ssrc:
            self._restart(ssrc, sequence)
            return self._accept(sequence, timestamp, arrival)
        delta = seq_diff(sequence, self.max_seq)
        if 0 < delta < MAX_DROPOUT:
            if sequence < self.max_seq:
                self.cycles += SEQ_MOD
            self.max_seq = sequence
            self._bad_seq = None
        elif delta == 0 or (-MAX_MISORDER <= delta < 0 and sequence in self._seen):
            self.duplicates += 1
            return False
        elif -MAX_MISORDER <= delta < 0:
            self.reordered += 1
        elif self._bad_seq is not None and sequence == self._bad_seq:
            # A big jump, and the next packet followed it: the source restarted.
            self._restart(ssrc, sequence)
        else:
            self._bad_seq = (sequence + 1) % SEQ_MOD
            return False
        return self._accept(sequence, timestamp, arrival)

    def _accept(self, sequence: int, timestamp: int, arrival: float) -> bool:
        self._remember(sequence)
        self.received += 1
        if self._last is not None:
            last_arrival, last_timestamp = self._last
            # The difference of the two packets' transit times, in timestamp units.
            d = (arrival - last_arrival) * self.clock_rate - ts_diff(timestamp, last_timestamp)
            self.jitter += (abs(d) - self.jitter) / 16
        self._last = (arrival, timestamp)
        return True

    @property
    def extended_max(self) -> int:
        """The highest sequence number seen, with its wrap count in the high bits."""
        return self.cycles + self.max_seq

    @property
    def expected(self) -> int:
        """Packets the source has sent since the first one seen, by sequence number."""
        if self.ssrc is None:
            return 0
        return self.extended_max - self.base_seq + 1

    @property
    def lost(self) -> int:
        """Packets expected and never received (negative with duplicates, as in RFC 3550)."""
        return self.expected - self.received

    def report_interval(self) -> tuple[int, int]:
        """(fraction lost in 1/256, cumulative lost) since the last call, for a report block."""
        expected, received = self.expected, self.received
        expected_interval = expected - self._expected_prior
        received_interval = received - self._received_prior
        self._expected_prior, self._received_prior = expected, received
        lost_interval = expected_interval - received_interval
        fraction = 0
        if expected_interval > 0 and lost_interval > 0:
            fraction = min(255, (lost_interval << 8) // expected_interval)
        return fraction, self.lost

    def _restart(self, ssrc: int, sequence: int) -> None:
        self.ssrc = ssrc
        self.base_seq = sequence
        self.max_seq = sequence
        self.cycles = 0
        self.received = 0
        self._expected_prior = 0
        self._received_prior = 0
        self._last = None
        self._bad_seq = None
        self._seen.clear()

    def _remember(self, sequence: int) -> None:
        self._seen.add(sequence)
        # Only the last MAX_MISORDER numbers can be duplicates worth telling apart.
        if len(self._seen) > 2 * MAX_MISORDER:
            floor = self.max_seq
            self._seen = {s for s in self._seen if 0 <= seq_diff(floor, s) < MAX_MISORDER}
