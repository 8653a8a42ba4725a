"""Speculation: work started during a pause in the user's turn, before anyone knows whether
the turn has ended.

During a pause the turn so far is recognised, and a reply to it is started and held unseen
(``Speculate``); if the turn ends with the same words, the held reply becomes the response
(``AdoptSpeculation``), and if the user goes on it is thrown away (``DiscardSpeculation``).
With ``semantic_vad`` the pause's words are also judged by the end-of-turn model
(``ScoreTurn``), and that verdict waits a little for the speculated reply to read its prompt.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hark.session.actions import (
    AdoptSpeculation,
    DiscardSpeculation,
    Generate,
    ScoreTurn,
    Speculate,
)
from hark.session.outbox import Outbox

# semantic_vad's end-of-turn verdict waits at most this long (wall time) for the reply
# speculated on the same words to have read its prompt (about 85 ms on two cores for a short
# question): the reply, not the verdict, is what the user waits for, and the verdict still
# comes well before its audio.
SCORE_AFTER_READ_MAX_S = 0.2
# The end-of-turn probability assumed when scoring fails: wait as for an utterance that may
# well be over.
UNKNOWN_TURN_SCORE = 0.5


@dataclass(slots=True)
class Pause:
    """A pause in the current turn, and the speculative work started during it."""

    key: str
    start_ms: float
    asr_request: str | None = None
    transcript: str | None = None
    # The speculative reply started on ``transcript``, and whether it has read its prompt.
    speculation: Generate | None = None
    answering: bool = False
    # The end-of-turn verdict held back until the speculative reply answers or ``score_due``.
    score: ScoreTurn | None = None
    score_due: float | None = None


class Speculation:
    """The current turn's pause and the one speculative reply the driver runs."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self.pause: Pause | None = None
        # The pause whose speculative reply the driver is running (it outlives the pause
        # until the turn's response adopts or discards it).
        self._speculated: Pause | None = None
        self._pauses = 0

    def pause_started(self, item_id: str | None, ms: float) -> None:
        """Silence began at ``ms`` in the turn that will become ``item_id``."""
        self._pauses += 1
        self.pause = Pause(key=f"{item_id}#{self._pauses}", start_ms=ms)

    def end_pause(self) -> Pause | None:
        """The turn ended in its pause: the pause, whose work the turn may use."""
        pause, self.pause = self.pause, None
        return pause

    def drop_pause(self) -> Pause | None:
        """The user went on (or the turn was reset): the pause's reply is thrown away, and the
        pause returned so that its recognition can be forgotten."""
        pause, self.pause = self.pause, None
        if pause is not None and self._speculated is pause:
            self.discard()
        return pause

    def discard(self) -> None:
        """Throw away the speculative reply, if one runs."""
        speculated, self._speculated = self._speculated, None
        if speculated is not None:
            self._outbox.act(DiscardSpeculation(speculated.key))

    def speculate(self, pause: Pause, generate: Generate) -> None:
        """Start ``generate`` (with no response id yet) as the pause's speculative reply."""
        self.discard()
        pause.speculation = generate
        self._outbox.act(Speculate(pause.key, generate))
        self._speculated = pause

    def adopt(self, generate: Generate) -> bool:
        """The conversation's response needs ``generate``: True when the speculative reply
        is that work and becomes the response; otherwise it is discarded."""
        speculated, self._speculated = self._speculated, None
        if speculated is None:
            return False
        if dataclasses.replace(generate, response_id="") == speculated.speculation:
            # The user said what was speculated on: the held reply becomes the response.
            self._outbox.act(AdoptSpeculation(speculated.key, generate.response_id))
            return True
        self._outbox.act(DiscardSpeculation(speculated.key))
        return False

    def judge(self, pause: Pause, score: ScoreTurn, now: float) -> None:
        """Ask for the verdict on the pause's words, once its speculative reply (if any) has
        read its prompt, or ``SCORE_AFTER_READ_MAX_S`` after ``now``."""
        if pause.speculation is not None and not pause.answering:
            # The reply speculated on the same words reads its prompt first, on every core
            # if no other model computes (hark.engines.activity).
            pause.score = score
            pause.score_due = now + SCORE_AFTER_READ_MAX_S
        else:
            self._outbox.act(score)

    def _release_score(self, pause: Pause) -> None:
        if pause.score is not None:
            self._outbox.act(pause.score)
            pause.score = pause.score_due = None

    def answering(self, key: str) -> None:
        """The speculative reply ``key`` has read its prompt or ended."""
        pause = self.pause
        if pause is not None and pause.key == key:
            pause.answering = True
            self._release_score(pause)

    def handle_timer(self, now: float) -> None:
        """A held verdict whose wait is over goes out."""
        pause = self.pause
        if pause is not None and pause.score_due is not None and now >= pause.score_due:
            self._release_score(pause)

    def deadline(self) -> float | None:
        """When a held verdict must go out, if one is held."""
        pause = self.pause
        return pause.score_due if pause is not None else None
