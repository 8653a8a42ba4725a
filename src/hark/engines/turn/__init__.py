"""End of turn: how likely an utterance is complete, and how long to wait for more."""

from __future__ import annotations

from typing import Protocol

# The longest semantic_vad waits in a pause, by eagerness.
MAX_SILENCE_MS = {"low": 8000, "medium": 4000, "high": 2000, "auto": 4000}
# The shortest: an utterance that is clearly complete still gets this much silence.
MIN_SILENCE_MS = 200


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
    """Silence (ms) to wait before ending the turn, falling from the cap to the floor as the
    utterance sounds more complete; the curve is steep so a likely-complete question ends fast
    and a likely-unfinished one gets most of the cap."""
    cap = MAX_SILENCE_MS.get(eagerness, MAX_SILENCE_MS["auto"])
    p = min(1.0, max(0.0, probability))
    return int(MIN_SILENCE_MS + (cap - MIN_SILENCE_MS) * (1.0 - p) ** 2)
