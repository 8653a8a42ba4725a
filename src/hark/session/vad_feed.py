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
        # The chunk being filled, and how many of its samples are in.
        self._pending: npt.NDArray[np.int16] = np.empty(self._size, np.int16)
        self._filled = 0
        self._start_ms = start_ms
        self._answered = 0

    def push(self, pcm: npt.NDArray[np.int16]) -> None:
        """Input audio at the feed's rate; each chunk it completes goes to the VAD."""
        # Copied into the chunk being filled: an append rarely ends on a chunk boundary (20 ms
        # appends, 32 ms chunks), and a copy of the few samples costs less than joining arrays.
        filled = self._filled
        end = filled + len(pcm)
        size = self._size
        if end < size:
            self._pending[filled:end] = pcm
            self._filled = end
            return
        taken = 0
        while taken < len(pcm):
            count = min(size - filled, len(pcm) - taken)
            self._pending[filled : filled + count] = pcm[taken : taken + count]
            filled += count
            taken += count
            if filled == size:
                # Handed out as it is, so never written again: a new array for the next.
                self._outbox.act(AnalyzeSpeech(self._pending, self.epoch))
                self._pending = np.empty(size, np.int16)
                filled = 0
        self._filled = filled

    def answered(self) -> tuple[float, float]:
        """The VAD answered its oldest chunk of this epoch: where it starts and ends (ms)."""
        start = self._start_ms + self._answered * self._chunk_ms
        self._answered += 1
        return start, start + self._chunk_ms
