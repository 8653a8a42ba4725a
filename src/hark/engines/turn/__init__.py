"""End of turn: how likely an utterance is complete, and how long to wait for more.

``semantic_vad`` ends the user's turn after a pause whose length depends on what was said:
during a pause the session asks an :class:`EndOfTurnEngine` how likely the transcript so far
is a finished turn, and :func:`silence_for` turns that probability and the session's
eagerness into the silence to wait before ending the turn.
"""

from __future__ import annotations

import math
from typing import Protocol

# The longest semantic_vad waits in a pause, by eagerness (OpenAI's figures).
MAX_SILENCE_MS = {"low": 8000, "medium": 4000, "high": 2000, "auto": 4000}
# The shortest: an utterance that is clearly complete still gets this much silence, about the
# gap between turns in human conversation.
MIN_SILENCE_MS = 200
# From this probability up the turn ends fast: with eagerness auto, after at most ~310 ms.
END_FAST_PROBABILITY = 0.85


class EndOfTurnEngine(Protocol):
    """Judges whether the user has finished their turn from what they said so far."""

    async def probability(self, transcript: str, *, context: str | None = None) -> float:
        """Probability that ``transcript`` is a complete turn (``context``: the assistant's
        previous message, if any)."""
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...


def silence_for(probability: float, eagerness: str) -> int:
    """Silence (ms) to wait before ending the turn, given how likely it is complete.

    The wait falls geometrically from the eagerness's cap (``probability`` 0) to
    ``MIN_SILENCE_MS`` (``probability`` 1): ``MIN × (cap / MIN) ** (1 − p)``. Pauses inside a
    turn have a long tail (a speaker looking up a number pauses for seconds, most pauses
    are short), so the wait is set on a log scale: each tenth of probability lost multiplies
    it by the same factor (1.35 with eagerness auto). With auto, a probability of 0.9 waits
    270 ms, 0.5 waits 890 ms and 0.4 waits 1.2 s; only an utterance judged unfinished waits
    seconds. Out-of-range probabilities are clamped, and NaN counts as 0 (wait the most).
    Raises ``ValueError`` for an eagerness other than low, medium, high or auto.
    """
    cap = MAX_SILENCE_MS.get(eagerness)
    if cap is None:
        raise ValueError(f"unknown eagerness {eagerness!r}")
    p = 0.0 if math.isnan(probability) else min(1.0, max(0.0, probability))
    return round(MIN_SILENCE_MS * (cap / MIN_SILENCE_MS) ** (1.0 - p))
