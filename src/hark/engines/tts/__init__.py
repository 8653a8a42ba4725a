"""Speech synthesis: a piece of text in, mono 16-bit PCM out, streamed chunk by chunk."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import numpy as np
import numpy.typing as npt


class TtsEngine(Protocol):
    """A speech synthesiser."""

    sample_rate: int

    def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        """Speak ``text``; yields int16 chunks at ``sample_rate``. Cancelling stops the work.

        ``voice`` is the client's voice name; engines map unknown names to their default.
        """
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...
