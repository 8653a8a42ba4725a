"""DTMF from a phone: RFC 4733 telephone-event packets, and SIP INFO bodies.

A key press is one event, sent as several RTP packets that share the event's timestamp (its
duration growing) and end with three copies of the packet with the end bit; any of them may
be lost, duplicated or reordered. ``DtmfReceiver`` reports the digit at the first packet of
an event it has not seen, so the session hears it at once, and never again for the same
timestamp. An event longer than a packet's 16-bit duration is sent as segments with new
timestamps (RFC 4733 section 2.5.1.3); a segment that continues the previous one is not a
new key press.

These packets carry no audio: the media layer routes the telephone-event payload type here
and never into the jitter buffer.

Phones that send keys in the signalling instead send one SIP INFO per key press, its body
``application/dtmf-relay`` (``Signal=5``) or ``application/dtmf`` (``5``);
``digit_from_info`` reads those.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from hark.transports.rtp import TS_MOD

# RFC 4733 section 3.2: events 0-15 are the keypad's sixteen keys.
DIGITS = "0123456789*#ABCD"
_RECENT = 16
# An INFO body longer than this is not a key press; it is not read.
_MAX_INFO_BYTES = 1024


class DtmfError(ValueError):
    """A telephone-event payload that is too short."""


@dataclass(frozen=True, slots=True)
class TelephoneEvent:
    """One RFC 4733 payload: the event code, whether it has ended, volume and duration."""

    event: int
    end: bool
    volume: int
    duration: int

    @classmethod
    def parse(cls, payload: bytes) -> TelephoneEvent:
        """Parse the first four bytes of a telephone-event payload."""
        if len(payload) < 4:
            raise DtmfError(f"{len(payload)} bytes is shorter than a telephone event")
        event, flags, duration = struct.unpack_from("!BBH", payload)
        return cls(event, bool(flags & 0x80), flags & 0x3F, duration)

    def pack(self) -> bytes:
        """The four-byte payload."""
        return struct.pack(
            "!BBH", self.event, (0x80 if self.end else 0) | self.volume, self.duration
        )

    @property
    def digit(self) -> str | None:
        """The key, or None for events that are not keys (flash, tones)."""
        return DIGITS[self.event] if self.event < len(DIGITS) else None


class DtmfReceiver:
    """Turns telephone-event packets into digits, one per key press."""

    def __init__(self) -> None:
        self._recent: deque[int] = deque(maxlen=_RECENT)
        self._last: tuple[int, TelephoneEvent] | None = None

    def receive(self, timestamp: int, payload: bytes) -> str | None:
        """The digit a packet starts, or None (repeats, ends, continuations, non-keys).

        A malformed payload raises ``DtmfError``.
        """
        event = TelephoneEvent.parse(payload)
        if timestamp in self._recent:
            if self._last is not None and self._last[0] == timestamp:
                self._last = (timestamp, event)
            return None
        continues = (
            self._last is not None
            and not self._last[1].end
            and self._last[1].event == event.event
            and (self._last[0] + self._last[1].duration) % TS_MOD == timestamp
        )
        self._recent.append(timestamp)
        self._last = (timestamp, event)
        if continues:
            return None
        return event.digit


def digit_from_info(content_type: str, body: bytes) -> str | None:
    """The key of a SIP INFO DTMF body, or None when it is not one."""
    kind = content_type.split(";")[0].strip().lower()
    if kind not in ("application/dtmf-relay", "application/dtmf") or len(body) > _MAX_INFO_BYTES:
        return None
    text = body.decode("ascii", "replace").strip()
    if kind == "application/dtmf-relay":
        signal = ""
        for line in text.splitlines():
            name, _, value = line.partition("=")
            if name.strip().lower() == "signal":
                signal = value.strip()
        text = signal
    key = text.upper()
    return key if len(key) == 1 and key in DIGITS else None
