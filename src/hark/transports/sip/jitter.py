"""An adaptive jitter buffer: RTP audio in as it arrives, even 20 ms frames out on time.

Sans-I/O: ``put`` takes a packet's RTP timestamp and decoded samples with its arrival time,
``get`` is asked for the next frame at each tick of the caller's clock. Samples are placed
on the sender's timeline (the RTP timestamp, unwrapped), so packets of any size, reordered
or duplicated, land where they belong; a packet whose place has already been played is late
and dropped.

The playout point follows the network. Each packet's transit (arrival minus its timestamp)
is compared with the quickest transit of the last ``WINDOW`` packets; the target delay is
the largest such lateness in that window plus a frame, bounded to [``min_delay``,
``max_delay``], so it grows at the first late burst and shrinks again once the burst has
left the window. The sample with timestamp T is due at T + quickest transit + target delay.
When the frames handed out run a frame or more ahead of that schedule a frame is inserted
(where the audio is quiet, or where the next packet is missing anyway), and when they run
behind one is skipped (where the audio is quiet); at three frames off, wherever it is.
Late packets are dropped but still measured: they are what the delay must cover.

A frame with samples missing is concealed: the last good frame repeated and faded to zero
over ``FADE_FRAMES`` frames, then silence. Nothing is held without bound: at most
``capacity`` seconds ahead of the playout point and ``MAX_PACKETS`` packets; a timestamp
beyond that, either way, is a restarted stream and starts the buffer afresh.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hark.transports.rtp import TS_MOD, ts_diff

WINDOW = 250
FADE_FRAMES = 3
MAX_PACKETS = 200
# Off the schedule by this many frames, the delay is corrected even in the middle of speech.
_FORCE_FRAMES = 3
# A frame whose samples all stay below this is quiet enough to drop or to pad unheard.
_QUIET_PEAK = 1024


@dataclass(slots=True)
class JitterStats:
    """What the buffer did with the packets it was given."""

    received: int = 0
    late: int = 0
    duplicates: int = 0
    overflow: int = 0
    concealed: int = 0
    dropped: int = 0
    inserted: int = 0
    restarts: int = 0


class _SlidingExtremes:
    """The minimum and maximum of the last ``size`` values, in constant amortised time."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._count = 0
        self._min: deque[tuple[int, float]] = deque()
        self._max: deque[tuple[int, float]] = deque()

    def push(self, value: float) -> None:
        index = self._count
        self._count += 1
        while self._min and self._min[-1][1] >= value:
            self._min.pop()
        self._min.append((index, value))
        while self._max and self._max[-1][1] <= value:
            self._max.pop()
        self._max.append((index, value))
        floor = index - self._size
        while self._min[0][0] <= floor:
            self._min.popleft()
        while self._max[0][0] <= floor:
            self._max.popleft()

    @property
    def low(self) -> float:
        return self._min[0][1]

    @property
    def high(self) -> float:
        return self._max[0][1]

    def clear(self) -> None:
        self._min.clear()
        self._max.clear()


class JitterBuffer:
    """Reorders, conceals and paces one stream of mono int16 audio at ``clock_rate``."""

    def __init__(
        self,
        *,
        clock_rate: int = 8000,
        frame_ms: int = 20,
        min_delay: float = 0.04,
        max_delay: float = 0.2,
        capacity: float = 1.0,
    ) -> None:
        if not 0 < min_delay <= max_delay < capacity:
            raise ValueError("need 0 < min_delay <= max_delay < capacity")
        self.clock_rate = clock_rate
        self.frame_samples = clock_rate * frame_ms // 1000
        self._frame_seconds = frame_ms / 1000
        self.min_delay = min_delay
        self.max_delay = max_delay
        self._capacity = int(capacity * clock_rate)
        self.stats = JitterStats()
        self.target_delay = min_delay
        self._silence = np.zeros(self.frame_samples, np.int16)
        self._reset_state()

    def _reset_state(self) -> None:
        self._packets: dict[int, npt.NDArray[np.int16]] = {}
        self._starts: list[int] = []
        self._reference: int | None = None
        self._position: int | None = None
        self._transits = _SlidingExtremes(WINDOW)
        self._last_good = self._silence
        self._missing_run = 0
        self.target_delay = self.min_delay

    @property
    def started(self) -> bool:
        """Whether frames are coming out (from the first due packet until ``reset``)."""
        return self._position is not None

    @property
    def jitter(self) -> float:
        """The largest lateness in the window, in seconds (zero before any packet)."""
        if self._reference is None:
            return 0.0
        return self._transits.high - self._transits.low

    def reset(self) -> None:
        """Forget the stream (a re-negotiation, a new source): frames stop until packets come."""
        self._reset_state()

    def put(self, timestamp: int, pcm: npt.NDArray[np.int16], now: float) -> None:
        """A packet's RTP timestamp and decoded samples, arriving at ``now`` (seconds)."""
        if not len(pcm):
            return
        start = self._unwrap(timestamp)
        end = start + len(pcm)
        position = self._position
        if position is not None:
            long_late = end <= position - self.max_delay * self.clock_rate
            idle = not self._packets and self._missing_run > FADE_FRAMES
            if abs(start - position) > self._capacity or (long_late and idle):
                # Out of any range we keep, or later than any delay we keep while nothing
                # is buffered and nothing has come for a while: a sender that restarted its
                # timestamps (a new stream, or a pause), not a late packet.
                start, end = self._restart(timestamp, len(pcm))
        # Late packets count too: they are what the delay has to cover.
        self._transits.push(now - start / self.clock_rate)
        lateness = self._transits.high - self._transits.low
        self.target_delay = min(self.max_delay, max(self.min_delay, lateness + self._frame_seconds))
        if self._position is not None and end <= self._position:
            self.stats.late += 1
            return
        if start in self._packets:
            self.stats.duplicates += 1
            return
        if len(self._packets) >= MAX_PACKETS:
            self.stats.overflow += 1
            return
        self.stats.received += 1
        self._packets[start] = pcm
        bisect.insort(self._starts, start)

    def get(self, now: float) -> npt.NDArray[np.int16] | None:
        """The next frame at ``now``: None until the stream's first frame is due."""
        if self._position is None:
            if not self._starts or now < self._due(self._starts[0]):
                return None
            self._position = self._starts[0]
        off = (self._position - self._ideal(now)) / self.frame_samples
        quiet = _quiet(self._last_good)
        if off >= 1 and (off >= _FORCE_FRAMES or quiet or not self._available()):
            # Playing ahead of the schedule (the target grew): wait a frame, best where it is
            # quiet or where the next packet has not come yet anyway.
            self.stats.inserted += 1
            return self._silence if quiet else self._concealment()
        if off <= -1:
            frame, complete = self._assemble()
            if off <= -_FORCE_FRAMES or (complete and _quiet(frame)):
                # Behind the schedule (the target shrank): skip a frame.
                self.stats.dropped += 1
                return self._finish(*self._assemble())
            return self._finish(frame, complete)
        return self._finish(*self._assemble())

    def _available(self) -> bool:
        return bool(self._starts) and self._starts[0] <= (self._position or 0)

    def _concealment(self) -> npt.NDArray[np.int16]:
        """The next frame of a gap: the last good one repeated and fading, then silence."""
        self._missing_run += 1
        run = self._missing_run
        if run > FADE_FRAMES:
            return self._silence
        self.stats.concealed += 1
        return _faded(self._last_good, 1 - (run - 1) / FADE_FRAMES, 1 - run / FADE_FRAMES)

    def _finish(self, frame: npt.NDArray[np.int16], complete: bool) -> npt.NDArray[np.int16]:
        if complete:
            self._missing_run = 0
            self._last_good = frame
        return frame

    def _due(self, start: int) -> float:
        return start / self.clock_rate + self._transits.low + self.target_delay

    def _ideal(self, now: float) -> float:
        return (now - self._transits.low - self.target_delay) * self.clock_rate

    def _assemble(self) -> tuple[npt.NDArray[np.int16], bool]:
        """Cut the frame at the playout point and move past it; whether it was all there."""
        assert self._position is not None
        begin = self._position
        end = begin + self.frame_samples
        self._position = end
        out = np.zeros(self.frame_samples, np.int16)
        covered = np.zeros(self.frame_samples, bool)
        while self._starts and self._starts[0] < end:
            start = self._starts[0]
            pcm = self._packets[start]
            lo, hi = max(start, begin), min(start + len(pcm), end)
            if hi > lo:
                out[lo - begin : hi - begin] = pcm[lo - start : hi - start]
                covered[lo - begin : hi - begin] = True
            if start + len(pcm) > end:
                break
            del self._packets[start]
            self._starts.pop(0)
        if covered.all():
            return out, True
        self._missing_run += 1
        run = self._missing_run
        if run <= FADE_FRAMES:
            self.stats.concealed += 1
            fill = _faded(self._last_good, 1 - (run - 1) / FADE_FRAMES, 1 - run / FADE_FRAMES)
            out[~covered] = fill[~covered]
        return out, False

    def _unwrap(self, timestamp: int) -> int:
        if self._reference is None:
            # Far from zero, so that a timeline moving backwards never goes negative.
            self._reference = TS_MOD + timestamp
        extended = self._reference + ts_diff(timestamp, self._reference % TS_MOD)
        self._reference = max(self._reference, extended)
        return extended

    def _restart(self, timestamp: int, samples: int) -> tuple[int, int]:
        """Start afresh from this packet; its place on the new timeline."""
        self.stats.restarts += 1
        self._reset_state()
        start = self._unwrap(timestamp)
        return start, start + samples


def _quiet(frame: npt.NDArray[np.int16]) -> bool:
    return int(np.max(np.abs(frame.astype(np.int32)))) < _QUIET_PEAK


def _faded(frame: npt.NDArray[np.int16], begin: float, end: float) -> npt.NDArray[np.int16]:
    ramp = np.linspace(begin, end, len(frame), endpoint=False, dtype=np.float32)
    return (frame * ramp).astype(np.int16)
