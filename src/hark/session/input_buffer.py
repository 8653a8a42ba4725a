"""The input audio buffer, placed on the session's sample clock."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Pcm = npt.NDArray[np.int16]

# Seconds of audio the buffer's array holds at first, and above which an emptied buffer
# shrinks back to that.
_INITIAL_CAPACITY_S = 2
_SHRINK_ABOVE_S = 30


class InputAudioBuffer:
    """Audio appended by the client and not yet committed.

    ``start_ms`` is the session-clock time of the first buffered sample, so VAD decisions
    (made on the session clock, possibly a little after the audio arrived) cut it exactly.
    """

    def __init__(self, rate: int, start_ms: float = 0.0) -> None:
        self.rate = rate
        self.start_ms = start_ms
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
        """Session-clock time just after the last buffered sample."""
        return self.start_ms + self.duration_ms

    def append(self, pcm: Pcm) -> None:
        """Add audio at the end."""
        count = len(pcm)
        if not count:
            return
        end = self._head + self._samples
        if end + count > len(self._data):
            self._make_room(count)
            end = self._samples
        self._data[end : end + count] = pcm
        self._samples += count

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
        if cut > self.rate // 2:
            self._drop(cut)

    def _drop(self, count: int) -> None:
        self.start_ms += count * 1000 / self.rate
        self._samples -= count
        self._head = self._head + count if self._samples else 0
        if not self._samples and len(self._data) > _SHRINK_ABOVE_S * self.rate:
            # A long utterance grew the array; nothing is buffered now, so give it back.
            self._data = np.empty(_INITIAL_CAPACITY_S * self.rate, np.int16)

    def clear(self) -> None:
        """Drop everything; the clock position moves to the end of the dropped audio."""
        self._drop(self._samples)
