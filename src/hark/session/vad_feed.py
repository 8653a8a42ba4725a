"""The VAD feed: input audio cut into the VAD engine's chunks, and its answers placed on the
sample clock."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hark.session.actions import AnalyzeSpeech
from hark.session.outbox import Outbox


class VadFeed:
    """Cuts one input format's audio into chunks for the VAD (``AnalyzeSpeech``) and says
    which stretch of the session clock each answer is for.

    A new feed (a new input format or turn detection) has a new ``epoch``: answers for an
    older one are stale.
    """

    def __init__(self, outbox: Outbox, rate: int, chunk_ms: int, start_ms: float, epoch: int):
        """``rate``: the input rate; ``chunk_ms``: the VAD engine's chunk; ``start_ms``: the
        session clock at the feed's first sample."""
        self._outbox = outbox
        self.epoch = epoch
        # The clock counts whole samples, so a chunk lasts what its samples do.
        self._size = max(1, round(rate * chunk_ms / 1000))
        self._chunk_ms = self._size * 1000 / rate
        # The start of the next chunk, and how many of its samples are in. Never handed out,
        # so it is written again and again.
        self._pending: npt.NDArray[np.int16] = np.empty(self._size, np.int16)
        self._filled = 0
        self._start_ms = start_ms
        self._answered = 0

    def push(self, pcm: npt.NDArray[np.int16]) -> None:
        """Input audio at the feed's rate; each chunk it completes goes to the VAD."""
        filled = self._filled
        size = self._size
        end = filled + len(pcm)
        if end < size:
            self._pending[filled:end] = pcm
            self._filled = end
            return
        # The chunks it completes are cut from one new array, written once and handed out
        # whole, a chunk a row: a 100 ms append completes three, and a copy, an array and an
        # action per chunk cost more than the VAD's own share of them.
        count = end // size
        used = count * size - filled
        chunks = np.empty((count, size), np.int16)
        flat = chunks.reshape(-1)
        flat[:filled] = self._pending[:filled]
        flat[filled:] = pcm[:used]
        rest = end - count * size
        self._pending[:rest] = pcm[used:]
        self._filled = rest
        self._outbox.act(AnalyzeSpeech(chunks, self.epoch))

    def answered(self) -> tuple[float, float]:
        """The VAD answered its oldest chunk of this epoch: where it starts and ends (ms)."""
        start = self._start_ms + self._answered * self._chunk_ms
        self._answered += 1
        return start, start + self._chunk_ms
