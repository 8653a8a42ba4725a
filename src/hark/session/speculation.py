"""Speculation: work started during a pause in the user's turn, before anyone knows whether
the turn has ended.

During a pause the turn so far is recognised, and a reply to it is started and held unseen
(``Speculate``); if the turn ends with the same words, the held reply becomes the response
(``AdoptSpeculation``), and if the user goes on it is thrown away (``DiscardSpeculation``).
With ``semantic_vad`` the pause's words are also judged by the end-of-turn model
(``ScoreTurn``) as soon as they are known: the verdict decides when the turn ends, the reply
is only speculative until then, so the verdict is not held back for the reply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hark.session.actions import AdoptSpeculation, DiscardSpeculation, Generate, Speculate
from hark.session.outbox import Outbox


@dataclass(slots=True)
class Pause:
    """A pause in the current turn, and the speculative work started during it."""

    key: str
    start_ms: float
    asr_request: str | None = None
    transcript: str | None = None
    # The speculative reply started on ``transcript``.
    speculation: Generate | None = None


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
