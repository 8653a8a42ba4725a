"""Voice activity detection: a speech probability for every 32 ms of a session's audio.

Sessions push chunks at their input rate and carry on; the engine answers each push, in
order, through the stream's ``on_outcomes`` callback on the session's event loop. The engine
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
        that loop at the start of a session's input handling, where any ``on_outcomes`` may
        run.
        """
        ...

    def close(self) -> None:
        """Drop queued chunks; no result is delivered afterwards."""
        ...


class VadEngine(Protocol):
    """A VAD model shared by every session of the process."""

    chunk_ms: int

    def open_stream(self, on_outcomes: Callable[[Outcomes], None]) -> VadStream:
        """A stream with fresh state; ``on_outcomes`` gets the answers of every push, in order
        and together in one call, on the event loop that opened the stream: each chunk's
        probability, or a ``Missed`` in its place when the engine could not answer it (its
        ``error`` says why the model failed, or is None when the chunk was dropped because
        the engine fell behind). One call a push lets what the answers make the session do
        be carried out once for the push rather than once a chunk."""
        ...

    async def warmup(self) -> None:
        """Load the model and run it once so the first real chunk is not slow."""
        ...
