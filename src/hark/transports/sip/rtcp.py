"""RTCP (RFC 3550 section 6): sender and receiver reports, SDES CNAME and BYE, and when to send.

Sans-I/O: ``pack_compound`` builds one compound datagram from reports, ``parse_compound``
reads the packets of one (unknown types are skipped, a malformed datagram raises
``RtcpError``), and ``ReportTimer`` says when the next report is due: every ``REPORT_INTERVAL``
on average, randomised by half either way so that calls started together spread out.
Times are NTP-style seconds since 1900 only on the wire; the callers hand in Unix seconds.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

SR = 200
RR = 201
SDES = 202
BYE = 203
_SDES_CNAME = 1
REPORT_INTERVAL = 5.0
_NTP_EPOCH_OFFSET = 2208988800
_BLOCK = struct.Struct("!IIIIII")
_MAX_BLOCKS = 31


class RtcpError(ValueError):
    """A datagram that is not a well-formed compound RTCP packet."""


def ntp_time(unix_seconds: float) -> int:
    """A Unix time as a 64-bit NTP timestamp (32.32 fixed point since 1900)."""
    return int((unix_seconds + _NTP_EPOCH_OFFSET) * (1 << 32)) & ((1 << 64) - 1)


def middle_ntp(ntp: int) -> int:
    """The middle 32 bits of an NTP timestamp, as the LSR field of a report block carries it."""
    return (ntp >> 16) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """Reception from one source: loss, highest sequence, jitter, and the last SR's echo."""

    ssrc: int
    fraction_lost: int
    cumulative_lost: int
    highest_sequence: int
    jitter: int
    last_sr: int = 0
    delay_since_last_sr: int = 0


@dataclass(frozen=True, slots=True)
class SenderReport:
    """An SR: what the sender sent by when, and its report blocks."""

    ssrc: int
    ntp_timestamp: int
    rtp_timestamp: int
    packets: int
    octets: int
    blocks: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class ReceiverReport:
    """An RR: a participant that has not sent lately, and its report blocks."""

    ssrc: int
    blocks: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceDescription:
    """SDES with the one item every compound packet needs: the CNAME of each source."""

    cnames: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class Bye:
    """BYE: these sources leave the session."""

    sources: tuple[int, ...]
    reason: str = ""


RtcpPacket = SenderReport | ReceiverReport | SourceDescription | Bye


def _header(count: int, packet_type: int, body: bytes) -> bytes:
    padded = body + bytes(-len(body) % 4)
    return struct.pack("!BBH", 0x80 | count, packet_type, len(padded) // 4) + padded


def _pack_blocks(blocks: tuple[ReportBlock, ...]) -> bytes:
    if len(blocks) > _MAX_BLOCKS:
        raise ValueError(f"at most {_MAX_BLOCKS} report blocks")
    out = []
    for b in blocks:
        lost = max(-(1 << 23), min((1 << 23) - 1, b.cumulative_lost)) & 0xFFFFFF
        out.append(
            _BLOCK.pack(
                b.ssrc,
                (b.fraction_lost & 0xFF) << 24 | lost,
                b.highest_sequence & 0xFFFFFFFF,
                b.jitter & 0xFFFFFFFF,
                b.last_sr & 0xFFFFFFFF,
                b.delay_since_last_sr & 0xFFFFFFFF,
            )
        )
    return b"".join(out)


def pack(packet: RtcpPacket) -> bytes:
    """One RTCP packet (a compound datagram is several of these concatenated)."""
    if isinstance(packet, SenderReport):
        body = struct.pack(
            "!IQIII",
            packet.ssrc,
            packet.ntp_timestamp,
            packet.rtp_timestamp & 0xFFFFFFFF,
            packet.packets & 0xFFFFFFFF,
            packet.octets & 0xFFFFFFFF,
        )
        return _header(len(packet.blocks), SR, body + _pack_blocks(packet.blocks))
    if isinstance(packet, ReceiverReport):
        body = struct.pack("!I", packet.ssrc) + _pack_blocks(packet.blocks)
        return _header(len(packet.blocks), RR, body)
    if isinstance(packet, SourceDescription):
        chunks = []
        for ssrc, cname in packet.cnames:
            text = cname.encode()[:255]
            chunk = struct.pack("!IBB", ssrc, _SDES_CNAME, len(text)) + text + b"\0"
            chunks.append(chunk + bytes(-len(chunk) % 4))
        return _header(len(packet.cnames), SDES, b"".join(chunks))
    reason = packet.reason.encode()[:255]
    body = b"".join(struct.pack("!I", s) for s in packet.sources)
    if reason:
        body += bytes([len(reason)]) + reason
    return _header(len(packet.sources), BYE, body)


def pack_compound(*packets: RtcpPacket) -> bytes:
    """A compound datagram; RFC 3550 wants it to begin with an SR or RR."""
    if not packets or not isinstance(packets[0], SenderReport | ReceiverReport):
        raise ValueError("a compound RTCP packet begins with an SR or RR")
    return b"".join(pack(p) for p in packets)


def _parse_blocks(data: bytes, offset: int, count: int) -> tuple[ReportBlock, ...]:
    if len(data) < offset + count * _BLOCK.size:
        raise RtcpError("truncated report blocks")
    blocks = []
    for i in range(count):
        ssrc, loss, highest, jitter, lsr, dlsr = _BLOCK.unpack_from(data, offset + i * _BLOCK.size)
        cumulative = loss & 0xFFFFFF
        if cumulative & 0x800000:
            cumulative -= 1 << 24
        blocks.append(ReportBlock(ssrc, loss >> 24, cumulative, highest, jitter, lsr, dlsr))
    return tuple(blocks)


def _parse_sdes(body: bytes, count: int) -> SourceDescription:
    cnames = []
    offset = 0
    for _ in range(count):
        if len(body) < offset + 4:
            raise RtcpError("truncated SDES chunk")
        (ssrc,) = struct.unpack_from("!I", body, offset)
        offset += 4
        while True:
            if offset >= len(body):
                raise RtcpError("SDES chunk without its end")
            item = body[offset]
            if item == 0:
                offset += 4 - offset % 4
                break
            if len(body) < offset + 2 or len(body) < offset + 2 + body[offset + 1]:
                raise RtcpError("truncated SDES item")
            length = body[offset + 1]
            if item == _SDES_CNAME:
                cnames.append(
                    (ssrc, body[offset + 2 : offset + 2 + length].decode("utf-8", "replace"))
                )
            offset += 2 + length
    return SourceDescription(tuple(cnames))


def parse_compound(data: bytes) -> list[RtcpPacket]:
    """The SR, RR, SDES and BYE packets of a compound datagram, in order."""
    packets: list[RtcpPacket] = []
    offset = 0
    if len(data) < 4:
        raise RtcpError(f"{len(data)} bytes is shorter than an RTCP header")
    while offset < len(data):
        if len(data) < offset + 4:
            raise RtcpError("trailing bytes after the last RTCP packet")
        first, packet_type, words = struct.unpack_from("!BBH", data, offset)
        if first >> 6 != 2:
            raise RtcpError(f"RTCP version {first >> 6}")
        end = offset + 4 + 4 * words
        if end > len(data):
            raise RtcpError("RTCP packet longer than the datagram")
        body = data[offset + 4 : end]
        if first & 0x20:
            if not body or body[-1] == 0 or body[-1] > len(body):
                raise RtcpError("bad RTCP padding")
            body = body[: -body[-1]]
        count = first & 0x1F
        if packet_type == SR:
            if len(body) < 24:
                raise RtcpError("truncated SR")
            ssrc, ntp, rtp_ts, sent, octets = struct.unpack_from("!IQIII", body)
            blocks = _parse_blocks(body, 24, count)
            packets.append(SenderReport(ssrc, ntp, rtp_ts, sent, octets, blocks))
        elif packet_type == RR:
            if len(body) < 4:
                raise RtcpError("truncated RR")
            (ssrc,) = struct.unpack_from("!I", body)
            packets.append(ReceiverReport(ssrc, _parse_blocks(body, 4, count)))
        elif packet_type == SDES:
            packets.append(_parse_sdes(body, count))
        elif packet_type == BYE:
            if len(body) < 4 * count:
                raise RtcpError("truncated BYE")
            sources = struct.unpack_from(f"!{count}I", body)
            rest = body[4 * count :]
            reason = ""
            if rest and len(rest) >= 1 + rest[0]:
                reason = rest[1 : 1 + rest[0]].decode("utf-8", "replace")
            packets.append(Bye(sources, reason))
        offset = end
    return packets


class ReportTimer:
    """When the next report is due: ``interval`` on average, each one drawn from 0.5-1.5 times it.

    ``rng`` makes the draws reproducible in tests.
    """

    def __init__(
        self, now: float, *, interval: float = REPORT_INTERVAL, rng: random.Random | None = None
    ) -> None:
        self._interval = interval
        self._rng = rng or random.Random()
        self.due = now + self._draw()

    def _draw(self) -> float:
        return self._interval * self._rng.uniform(0.5, 1.5)

    def poll(self, now: float) -> bool:
        """Whether a report is due at ``now``; when it is, the next one is scheduled."""
        if now < self.due:
            return False
        self.due = now + self._draw()
        return True
