"""RFC 4733 telephone events: one digit per key press, whatever the network does to the packets."""

from __future__ import annotations

import pytest

from hark.transports.sip.dtmf import (
    DIGITS,
    DtmfError,
    DtmfReceiver,
    TelephoneEvent,
    digit_from_info,
)


def press(event: int, timestamp: int, steps: int = 4) -> list[tuple[int, bytes]]:
    """A key press as a phone sends it: growing durations, then the end packet three times."""
    packets = [
        (timestamp, TelephoneEvent(event, False, 10, 160 * (n + 1)).pack()) for n in range(steps)
    ]
    end = TelephoneEvent(event, True, 10, 160 * (steps + 1)).pack()
    return packets + [(timestamp, end)] * 3


def digits(receiver: DtmfReceiver, packets: list[tuple[int, bytes]]) -> list[str]:
    return [d for ts, payload in packets if (d := receiver.receive(ts, payload)) is not None]


def test_the_payload_as_rfc_4733_lays_it_out() -> None:
    event = TelephoneEvent(event=11, end=True, volume=10, duration=800)
    assert event.pack() == bytes([11, 0x80 | 10, 0x03, 0x20])
    assert TelephoneEvent.parse(event.pack() + b"extra") == event
    assert event.digit == "#"


def test_every_key_has_its_event_code() -> None:
    receiver = DtmfReceiver()
    packets = [p for code in range(16) for p in press(code, 1000 + code * 8000)]
    assert "".join(digits(receiver, packets)) == "0123456789*#ABCD" == DIGITS


def test_one_press_is_one_digit_at_its_first_packet() -> None:
    receiver = DtmfReceiver()
    packets = press(5, 4000)
    assert receiver.receive(*packets[0]) == "5"
    assert [receiver.receive(ts, p) for ts, p in packets[1:]] == [None] * (len(packets) - 1)


def test_the_same_key_twice_is_two_digits() -> None:
    receiver = DtmfReceiver()
    assert digits(receiver, press(1, 4000) + press(1, 12000)) == ["1", "1"]


def test_a_press_whose_first_packets_were_lost_still_counts_once() -> None:
    receiver = DtmfReceiver()
    assert digits(receiver, press(7, 4000)[-3:]) == ["7"]


def test_reordered_and_duplicated_packets_of_two_presses() -> None:
    first, second = press(2, 4000), press(3, 12000)
    shuffled = [second[0], first[1], first[0], second[2], first[5], second[1], first[0], *second]
    assert digits(DtmfReceiver(), shuffled) == ["3", "2"]


def test_a_long_press_in_segments_is_one_digit() -> None:
    receiver = DtmfReceiver()
    segment = [(1000, TelephoneEvent(9, False, 10, 0xFFFF).pack())]
    continued = [(1000 + 0xFFFF, TelephoneEvent(9, False, 10, 800).pack())]
    ended = [(1000 + 0xFFFF, TelephoneEvent(9, True, 10, 1600).pack())] * 3
    assert digits(receiver, segment + continued + ended) == ["9"]
    assert digits(receiver, press(9, 1000 + 0xFFFF + 8000)) == ["9"]


def test_events_that_are_not_keys_give_no_digit() -> None:
    assert digits(DtmfReceiver(), press(16, 4000)) == []


def test_a_short_payload_raises() -> None:
    with pytest.raises(DtmfError):
        DtmfReceiver().receive(1, b"\x01\x80")


@pytest.mark.parametrize(
    ("content_type", "body", "key"),
    [
        ("application/dtmf-relay", b"Signal=5\r\nDuration=160\r\n", "5"),
        ("application/dtmf-relay; charset=x", b"signal= *\r\n", "*"),
        ("application/dtmf", b"b", "B"),
        ("application/dtmf-relay", b"Signal=12\r\n", None),
        ("application/sdp", b"5", None),
        ("application/dtmf", b"5" * 2000, None),
        ("application/dtmf", b"", None),
        ("application/dtmf", b"12", None),
    ],
)
def test_sip_info_bodies_give_keys(content_type: str, body: bytes, key: str | None) -> None:
    assert digit_from_info(content_type, body) == key
