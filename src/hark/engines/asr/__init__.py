"""Speech recognition: 16 kHz audio in, text out, streamed segment by segment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import numpy as np
import numpy.typing as npt


class AsrEngine(Protocol):
    """A speech recogniser."""

    sample_rate: int

    def transcribe(
        self,
        audio: npt.NDArray[np.float32],
        *,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsyncIterator[str]:
        """Transcribe mono float32 audio at ``sample_rate``; yields text deltas in order.

        The concatenation of the deltas is the whole transcript (deltas carry their own
        leading spaces). Cancelling the iteration stops the work.
        """
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...
