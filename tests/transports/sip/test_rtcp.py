"""RTCP compound packets and the report timer, sans I/O."""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from hark.transports.sip import rtcp


def test_a_compound_report_round_trips() -> None:
    block = rtcp.ReportBlock(
        ssrc=0xCAFE,
        fraction_lost=64,
        cumulative_lost=-3,
        highest_sequence=70000,
        jitter=12,
        last_sr=0x12345678,
        delay_since_last_sr=65536,
    )
    packets: list[rtcp.RtcpPacket] = [
        rtcp.SenderReport(1, rtcp.ntp_time(1_700_000_000.5), 160, 50, 8000, (block,)),
        rtcp.SourceDescription(((1, "hark@4000"),)),
        rtcp.Bye((1,), "call ended"),
    ]
    data = rtcp.pack_compound(*packets)
    assert len(data) % 4 == 0
    assert rtcp.parse_compound(data) == packets


def test_a_receiver_report_as_rfc_3550_lays_it_out() -> None:
    data = rtcp.pack(rtcp.ReceiverReport(7))
    assert data == bytes([0x80, 201, 0, 1]) + struct.pack("!I", 7)


def test_ntp_time_counts_from_1900_in_32_32_fixed_point() -> None:
    assert rtcp.ntp_time(0.0) == 2208988800 << 32
    assert rtcp.ntp_time(0.5) & 0xFFFFFFFF == 1 << 31
    assert rtcp.middle_ntp(rtcp.ntp_time(0.5)) == ((2208988800 & 0xFFFF) << 16) | 0x8000


def test_unknown_packet_types_are_skipped() -> None:
    app = bytes([0x80, 204, 0, 2]) + b"\0\0\0\1name"
    data = rtcp.pack(rtcp.ReceiverReport(9)) + app + rtcp.pack(rtcp.Bye((9,)))
    assert rtcp.parse_compound(data) == [rtcp.ReceiverReport(9), rtcp.Bye((9,))]


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\xc9",
        bytes([0x40, 201, 0, 1]) + bytes(4),
        bytes([0x80, 201, 0, 5]) + bytes(4),
        bytes([0x81, 201, 0, 1]) + bytes(4),
        bytes([0x80, 200, 0, 1]) + bytes(4),
        bytes([0x81, 202, 0, 2]) + b"\0\0\0\1\1\x09ab",
        bytes([0x80, 201, 0, 1]) + bytes(4) + b"\x80",
    ],
)
def test_malformed_datagrams_raise(data: bytes) -> None:
    with pytest.raises(rtcp.RtcpError):
        rtcp.parse_compound(data)


def test_a_compound_packet_must_begin_with_a_report() -> None:
    with pytest.raises(ValueError, match="begins with"):
        rtcp.pack_compound(rtcp.Bye((1,)))


def test_reports_come_every_five_seconds_on_average_spread_by_half() -> None:
    timer = rtcp.ReportTimer(0.0, rng=random.Random(1))
    now, sent = 0.0, []
    while now < 1000:
        if timer.poll(now):
            sent.append(now)
        now += 0.02
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert min(gaps) >= 2.5 and max(gaps) <= 7.5 + 0.02
    assert sum(gaps) / len(gaps) == pytest.approx(5.0, rel=0.1)
    assert not rtcp.ReportTimer(0.0).poll(0.0)
