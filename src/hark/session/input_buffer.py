"""The input audio buffer, placed on the session's sample clock."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Pcm = npt.NDArray[np.int16]

# Seconds of audio the buffer's array holds at first, and above which an emptied buffer
# shrinks back to that.
_INITIAL_CAPACITY_S = 2
_SHRINK_ABOVE_S = 30
# The most audio the buffer holds (OpenAI documents no bound but the 15 MiB of one append):
# as much as a conversation keeps of its audio (the core's ``AUDIO_RETENTION_S``), since a
# longer turn would lose its audio as soon as it was committed. 14 MB at 24 kHz; without it
# a client that never commits (no turn detection), or a VAD hearing speech without end,
# grows a session by 170 MB an hour.
MAX_BUFFERED_S = 5 * 60


class InputAudioBuffer:
    """Audio appended by the client and not yet committed.

    ``start_ms`` is the session-clock time of the first buffered sample, so VAD decisions
    (made on the session clock, possibly a little after the audio arrived) cut it exactly.
    It holds at most ``max_s`` seconds: audio appended past that is dropped (``append``
    says how much) until the buffer is emptied, and the clock still counts it, so that what
    comes after the buffer is emptied is placed where it was heard.
    """

    def __init__(self, rate: int, start_ms: float = 0.0, max_s: float = MAX_BUFFERED_S) -> None:
        self.rate = rate
        self.start_ms = start_ms
        self.max_samples = round(max_s * rate)
        # Samples dropped past the bound since the buffer was last emptied: after the
        # buffered ones on the clock, with no audio kept for them.
        self._overflow = 0
        # One array, the buffered samples at [_head, _head + _samples): an append copies its
        # few samples in, and cutting or reading the buffer joins nothing (a list of appended
        # arrays had to be joined, 50 small arrays a second, every time the buffer was cut).
        self._data: Pcm = np.empty(_INITIAL_CAPACITY_S * rate, np.int16)
        self._head = 0
        self._samples = 0

    @property
    def samples(self) -> int:
        """Buffered samples."""
        return self._samples

    @property
    def duration_ms(self) -> float:
        """Buffered audio in milliseconds."""
        return self._samples * 1000 / self.rate

    @property
    def end_ms(self) -> float:
        """Session-clock time just after the last sample appended (kept or dropped)."""
        return self.start_ms + (self._samples + self._overflow) * 1000 / self.rate

    @property
    def overflowing(self) -> bool:
        """Audio past the bound was dropped since the buffer was last emptied."""
        return self._overflow > 0

    def append(self, pcm: Pcm) -> int:
        """Add audio at the end; returns how many of its samples were dropped past the bound
        (all of them once any were, until the buffer is emptied: the audio kept stays whole)."""
        count = len(pcm)
        if not count:
            return 0
        room = 0 if self._overflow else self.max_samples - self._samples
        dropped = max(0, count - room)
        if dropped:
            self._overflow += dropped
            if not room:
                return dropped
            pcm = pcm[:room]
            count = room
        end = self._head + self._samples
        if end + count > len(self._data):
            self._make_room(count)
            end = self._samples
        self._data[end : end + count] = pcm
        self._samples += count
        return dropped

    def _make_room(self, count: int) -> None:
        """Move the buffered samples to the front, into a larger array if they would not fit."""
        needed = self._samples + count
        data = self._data
        if needed > len(data):
            data = np.empty(max(needed, 2 * len(data)), np.int16)
        data[: self._samples] = self._data[self._head : self._head + self._samples]
        self._data = data
        self._head = 0

    def _index(self, ms: float) -> int:
        return max(0, min(self._samples, round((ms - self.start_ms) * self.rate / 1000)))

    def _all(self) -> Pcm:
        return self._data[self._head : self._head + self._samples]

    def take(self, start_ms: float, end_ms: float) -> Pcm:
        """Return the audio in ``[start_ms, end_ms)`` and drop everything before ``end_ms``."""
        audio = self._all()
        first, last = self._index(start_ms), self._index(end_ms)
        taken = audio[first:last].copy()
        self._drop(last)
        return taken

    def peek(self, start_ms: float, end_ms: float) -> Pcm:
        """A copy of the audio in ``[start_ms, end_ms)``, leaving the buffer as it is."""
        audio = self._all()
        return audio[self._index(start_ms) : self._index(end_ms)].copy()

    def take_all(self) -> Pcm:
        """Return the whole buffer and empty it."""
        audio = self._all().copy()
        self._drop(self._samples)
        return audio

    def trim_before(self, ms: float) -> None:
        """Forget audio older than ``ms`` once more than half a second of it is buffered (bounds
        memory while nobody speaks; called for every VAD chunk)."""
        if ms - self.start_ms <= 500:
            return
        cut = self._index(ms)
        # Past the kept audio of an overflowing buffer, however little: the buffer must
        # empty for it to keep audio again.
        if cut > self.rate // 2 or (self._overflow and cut == self._samples):
            self._drop(cut)

    def _drop(self, count: int) -> None:
        self.start_ms += count * 1000 / self.rate
        self._samples -= count
        self._head = self._head + count if self._samples else 0
        if not self._samples and self._overflow:
            self.start_ms += self._overflow * 1000 / self.rate
            self._overflow = 0
        if not self._samples and len(self._data) > _SHRINK_ABOVE_S * self.rate:
            # A long utterance grew the array; nothing is buffered now, so give it back.
            self._data = np.empty(_INITIAL_CAPACITY_S * self.rate, np.int16)

    def clear(self) -> None:
        """Drop everything; the clock position moves to the end of the dropped audio."""
        self._drop(self._samples)
