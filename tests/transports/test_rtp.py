"""RTP headers, the sender's counters and the receiver's statistics, sans I/O."""

from __future__ import annotations

import struct

import pytest

from hark.transports.rtp import (
    ReceptionStats,
    RtpError,
    RtpPacket,
    RtpSender,
    is_rtcp,
    is_rtp,
    pack_rtp,
    parse_rtp,
    seq_diff,
    ts_diff,
)


def test_a_plain_header_packs_as_rfc_3550_lays_it_out() -> None:
    packet = RtpPacket(payload_type=0, sequence=0x1234, timestamp=0xDEADBEEF, ssrc=7, payload=b"ab")
    assert (
        packet.pack() == bytes([0x80, 0x00, 0x12, 0x34]) + struct.pack("!II", 0xDEADBEEF, 7) + b"ab"
    )


def test_marker_csrc_extension_and_padding_round_trip() -> None:
    packet = RtpPacket(
        payload_type=8,
        sequence=65535,
        timestamp=1,
        ssrc=0xFFFFFFFF,
        payload=b"\xd5" * 160,
        marker=True,
        csrc=(1, 2, 3),
        extension=(0xBEDE, b"\x10\xff\x00\x00"),
        padding=4,
    )
    data = packet.pack()
    assert data[0] == 0x80 | 0x20 | 0x10 | 3
    assert data[1] == 0x80 | 8
    assert len(data) == 12 + 12 + 4 + 4 + 160 + 4
    assert RtpPacket.parse(data) == packet


def test_a_received_header_extension_is_skipped_to_reach_the_payload() -> None:
    header = bytes([0x90, 0x00, 0, 1]) + struct.pack("!II", 160, 9)
    extension = struct.pack("!HH", 0x1000, 2) + b"12345678"
    packet = RtpPacket.parse(header + extension + b"voice")
    assert packet.payload == b"voice"
    assert packet.extension == (0x1000, b"12345678")


@pytest.mark.parametrize("marker", [False, True])
@pytest.mark.parametrize(
    ("sequence", "timestamp"), [(0, 0), (65535, 2**32 - 1), (0x1234, 0xDEADBEEF)]
)
def test_pack_and_parse_round_trip_at_the_edges_of_each_field(
    sequence: int, timestamp: int, marker: bool
) -> None:
    data = pack_rtp(111, sequence, timestamp, 0xFFFFFFFF, b"opus", marker=marker)
    assert data[0] == 0x80 and data[1] == (0x80 if marker else 0) | 111
    assert parse_rtp(data) == (111, marker, sequence, timestamp, 0xFFFFFFFF, b"opus")
    assert RtpPacket.parse(data) == RtpPacket(
        111, sequence, timestamp, 0xFFFFFFFF, b"opus", marker=marker
    )


def test_a_packed_extension_block_is_flagged_and_skipped_when_parsed() -> None:
    block = struct.pack("!HH", 0xBEDE, 1) + b"\x40\x30\x00\x00"
    data = pack_rtp(96, 7, 960, 3, b"voice", extension=block)
    assert data[0] == 0x90 and data[12:20] == block
    assert parse_rtp(data) == (96, False, 7, 960, 3, b"voice")
    assert RtpPacket.parse(data).extension == (0xBEDE, b"\x40\x30\x00\x00")


def test_the_fast_parse_reads_csrcs_and_padding_as_the_full_one_does() -> None:
    packet = RtpPacket(0, 1, 2, 3, b"\xff" * 160, csrc=(9, 10), padding=3)
    assert parse_rtp(packet.pack()) == (0, False, 1, 2, 3, b"\xff" * 160)


def test_srtp_rtp_is_told_from_srtcp_by_its_packet_type() -> None:
    # RFC 5761 § 4: RTCP SR (200) and RR (201); RTP with and without the marker bit.
    assert not is_rtp(bytes([0x80, 200]))
    assert not is_rtp(bytes([0x81, 201]))
    assert is_rtp(bytes([0x80, 111]))
    assert is_rtp(bytes([0x80, 0x80 | 111]))
    # DTLS and STUN are not SRTP at all.
    assert not is_rtp(bytes([22, 254]))
    assert not is_rtp(bytes([0, 1]))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x80\x00\x00", "shorter"),
        (bytes([0x40]) + bytes(11), "version 1"),
        (bytes([0x82]) + bytes(11) + bytes(4), "CSRC"),
        (bytes([0x90]) + bytes(11) + b"\x00\x00\x00\x05", "extension"),
        (bytes([0xA0]) + bytes(11) + b"\x00\x00\x20", "padding"),
        (bytes([0xA0]) + bytes(11) + b"\x00", "padding"),
    ],
)
def test_malformed_packets_say_what_is_wrong(data: bytes, reason: str) -> None:
    with pytest.raises(RtpError, match=reason):
        parse_rtp(data)
    with pytest.raises(RtpError, match=reason):
        RtpPacket.parse(data)


def test_rtcp_is_told_apart_from_audio_on_a_shared_port() -> None:
    audio = RtpPacket(payload_type=0, sequence=1, timestamp=1, ssrc=1, marker=True).pack()
    events = RtpPacket(payload_type=101, sequence=1, timestamp=1, ssrc=1, marker=True).pack()
    assert not is_rtcp(audio) and not is_rtcp(events)
    assert is_rtcp(bytes([0x80, 200, 0, 6])) and is_rtcp(bytes([0x81, 203, 0, 1]))


def test_differences_wrap_around() -> None:
    assert seq_diff(2, 65534) == 4
    assert seq_diff(65534, 2) == -4
    assert ts_diff(80, 2**32 - 80) == 160
    assert ts_diff(2**32 - 80, 80) == -160


def test_the_sender_wraps_and_marks_the_first_packet_after_a_pause() -> None:
    sender = RtpSender(payload_type=0, ssrc=5, sequence=65535, timestamp=2**32 - 160)
    first = RtpPacket.parse(sender.packet(b"x" * 160))
    sender.advance(160)
    second = RtpPacket.parse(sender.packet(b"y" * 160))
    sender.advance(160)
    sender.pause()
    sender.advance(160 * 50)
    third = RtpPacket.parse(sender.packet(b"z" * 160, payload_type=101))
    assert (first.sequence, first.timestamp, first.marker) == (65535, 2**32 - 160, True)
    assert (second.sequence, second.timestamp, second.marker) == (0, 0, False)
    assert (third.sequence, third.timestamp, third.marker) == (1, 160 * 51, True)
    assert third.payload_type == 101
    assert (sender.packets, sender.octets) == (3, 480)


def test_reception_counts_loss_reordering_and_duplicates_across_the_wrap() -> None:
    stats = ReceptionStats(clock_rate=8000)
    arrivals = [65533, 65534, 0, 65535, 1, 1, 3, 4]  # 2 lost, 65535 late, 1 twice
    new = [stats.update(9, seq, (seq * 160) % 2**32, 0.0) for seq in arrivals]
    assert new == [True, True, True, True, True, False, True, True]
    assert stats.extended_max == 65536 + 4
    assert stats.expected == 8
    assert (stats.received, stats.lost) == (7, 1)
    assert (stats.reordered, stats.duplicates) == (1, 1)
    fraction, cumulative = stats.report_interval()
    assert (fraction, cumulative) == (256 // 8, 1)
    assert stats.report_interval() == (0, 1)


def test_a_first_packet_numbered_zero_expects_one() -> None:
    stats = ReceptionStats(clock_rate=8000)
    stats.update(1, 0, 0, 0.0)
    assert (stats.expected, stats.lost) == (1, 0)


def test_a_restarted_source_is_followed_after_two_packets_in_sequence() -> None:
    stats = ReceptionStats(clock_rate=8000)
    for seq in range(100, 110):
        stats.update(3, seq, seq * 160, 0.0)
    assert not stats.update(3, 40000, 0, 0.0)
    assert stats.update(3, 40001, 160, 0.0)
    assert (stats.max_seq, stats.expected, stats.lost) == (40001, 1, 0)


def test_a_new_ssrc_starts_the_counts_again() -> None:
    stats = ReceptionStats(clock_rate=8000)
    for seq in range(10):
        stats.update(3, seq, seq * 160, 0.0)
    stats.update(4, 500, 0, 0.0)
    assert (stats.ssrc, stats.received, stats.expected) == (4, 1, 1)


def test_interarrival_jitter_follows_rfc_3550() -> None:
    steady = ReceptionStats(clock_rate=8000)
    shaky = ReceptionStats(clock_rate=8000)
    for n in range(200):
        steady.update(1, n, n * 160, n * 0.02)
        # Every other packet 10 ms late: each transit difference is 80 timestamp units.
        shaky.update(1, n, n * 160, n * 0.02 + (0.01 if n % 2 else 0.0))
    assert steady.jitter == pytest.approx(0.0, abs=1e-6)
    assert shaky.jitter == pytest.approx(80.0, rel=1e-3)
