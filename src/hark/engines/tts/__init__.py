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
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        """Speak ``text``; yields int16 chunks at ``sample_rate``. Cancelling stops the work.

        ``voice`` is the client's voice name; engines map unknown names to their default.
        ``slack_s`` is how long the listener can wait for this audio without a gap: the reply
        audio already sent and not yet played (0 for a reply's first words, which someone
        waits for in silence). Engines that share a model between sessions serve the least
        slack first.
        """
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...
