"""Voice activity detection: a speech probability for every 32 ms of a session's audio.

Sessions push chunks at their input rate and carry on; the engine answers each chunk, in
order, through the stream's ``on_result`` callback on the session's event loop. The engine
resamples to the model's rate itself, so that it can do so for many sessions at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hark.engines.vad.delivery import Missed
from hark.engines.vad.resample import CHUNK_MS, UnsupportedRateError, chunk_samples

__all__ = [
    "CHUNK_MS",
    "Missed",
    "Outcomes",
    "UnsupportedRateError",
    "VadEngine",
    "VadStream",
    "chunk_samples",
]

# The answers of one push, in order: each chunk's probability, or a ``Missed`` in its place,
# with the epoch it was pushed under.
Outcomes = list[tuple[float | Missed, int]]


class VadStream(Protocol):
    """One session's audio on a VAD engine."""

    def push(self, chunk: npt.NDArray[np.int16] | npt.NDArray[np.float32], epoch: int) -> None:
        """Queue the next 32 ms chunk (int16, or float32 in [-1, 1]) at the input rate, or the
        next several as the rows of a 2-D array (each answered in turn, as if pushed one by
        one; their answers may come together, once the last is ready).

        A chunk whose ``epoch`` differs from the previous chunk's starts from fresh model
        state. Raises ``ValueError`` when the chunk is not 32 ms at a supported rate.
        """
        ...

    def deliver_ready(self) -> None:
        """Hand out at once the results the engine has ready for this stream's loop, which
        would otherwise wait for a callback behind whatever the loop has queued. Called on
        that loop at the start of a session's input handling, where any ``on_result`` may run.
        """
        ...

    def close(self) -> None:
        """Drop queued chunks; no result is delivered afterwards."""
        ...


class VadEngine(Protocol):
    """A VAD model shared by every session of the process."""

    chunk_ms: int

    def open_stream(
        self,
        on_result: Callable[[float, int], None],
        on_missed: Callable[[int, str | None], None] | None = None,
        *,
        on_outcomes: Callable[[Outcomes], None] | None = None,
    ) -> VadStream:
        """A stream with fresh state; ``on_result(probability, epoch)`` gets every chunk's
        answer, in order, on the event loop that opened it. A chunk the engine could not
        answer gets ``on_missed(epoch, error)`` in its place instead: ``error`` says why the
        model failed, or is None when the chunk was dropped because the engine fell behind.

        An engine that hands out a push's answers together may give them all to
        ``on_outcomes`` in one call instead (when it is given), so that what they make the
        session do is carried out once for the push rather than once a chunk; an engine that
        does not calls ``on_result`` and ``on_missed``."""
        ...

    async def warmup(self) -> None:
        """Load the model and run it once so the first real chunk is not slow."""
        ...
