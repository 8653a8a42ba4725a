"""The input audio buffer, placed on the session's sample clock."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Pcm = npt.NDArray[np.int16]


class InputAudioBuffer:
    """Audio appended by the client and not yet committed.

    ``start_ms`` is the session-clock time of the first buffered sample, so VAD decisions
    (made on the session clock, possibly a little after the audio arrived) cut it exactly.
    """

    def __init__(self, rate: int, start_ms: float = 0.0) -> None:
        self.rate = rate
        self.start_ms = start_ms
        self._chunks: list[Pcm] = []
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
        if len(pcm):
            self._chunks.append(pcm)
            self._samples += len(pcm)

    def _index(self, ms: float) -> int:
        return max(0, min(self._samples, round((ms - self.start_ms) * self.rate / 1000)))

    def _all(self) -> Pcm:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, np.int16)

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
        audio = self._all()
        rest = audio[count:]
        self.start_ms += count * 1000 / self.rate
        self._chunks = [rest] if len(rest) else []
        self._samples = len(rest)

    def clear(self) -> None:
        """Drop everything; the clock position moves to the end of the dropped audio."""
        self._drop(self._samples)
