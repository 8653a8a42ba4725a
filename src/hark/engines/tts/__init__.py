"""Speech synthesis: a piece of text in, mono 16-bit PCM out, streamed chunk by chunk."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


class TtsEngine(Protocol):
    """A speech synthesiser."""

    sample_rate: int

    def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0, slack_s: float = 0.0
    ) -> AsyncIterator[npt.NDArray[np.int16]]:
        """Speak ``text``; yields int16 chunks at ``sample_rate``. Cancelling stops the work.

        ``voice`` is the client's voice name: one of OpenAI's, which the engine maps onto a
        voice it has, or one of its own (``VoiceCatalog``); others get the default voice.
        ``slack_s`` is how long the listener can wait for this audio without a gap: the reply
        audio already sent and not yet played (0 for a reply's first words, which someone
        waits for in silence). Engines that share a model between sessions serve the least
        slack first.
        """
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...


@runtime_checkable
class VoiceCatalog(Protocol):
    """A speech synthesiser that says which voices it has."""

    def installed_voices(self) -> tuple[str, ...] | None:
        """The names of its own voices, which a client may pick as ``{"id": name}``; None
        when names go to a server that knows its own (the engine keeps no list)."""
        ...

    def voice_map(self) -> dict[str, str]:
        """Which voice speaks for each of the names it was built to map (``voices``: the
        server passes OpenAI's)."""
        ...


def installed_voices(tts: object) -> tuple[str, ...] | None:
    """The voices of ``tts`` a client may pick by name; None (any name) for engines that
    keep no list."""
    return tts.installed_voices() if isinstance(tts, VoiceCatalog) else None
