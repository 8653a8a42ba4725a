"""End of turn: how likely an utterance is complete.

``semantic_vad`` ends the user's turn after a pause whose length depends on what was said:
during a pause the session asks an :class:`EndOfTurnEngine` how likely the transcript so far
is a finished turn. What the session does with that probability (how long it then waits) is
its turn policy, ``hark.session.turn_policy``.
"""

from __future__ import annotations

from typing import Protocol


class EndOfTurnEngine(Protocol):
    """Judges whether the user has finished their turn from what they said so far."""

    async def probability(self, transcript: str, *, context: str | None = None) -> float:
        """Probability that ``transcript`` is a complete turn (``context``: the assistant's
        previous message, if any)."""
        ...

    async def warmup(self) -> None:
        """Load the model and run it once."""
        ...
