"""Playout state: the responses whose audio the transport plays itself (WebRTC, SIP), and
what the client hears of them."""

from __future__ import annotations

from dataclasses import dataclass

from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError
from hark.session.actions import ClearAudio, FinishAudio, HoldAudio, ResumeAudio
from hark.session.conversation import Conversation, truncate_part
from hark.session.outbox import Outbox


@dataclass(frozen=True, slots=True)
class _Playout:
    """A response being played: the item its audio belongs to (the latest, for a response
    with several), and whether it is the conversation's."""

    item_id: str
    in_band: bool


class PlayoutState:
    """Which responses' audio is queued or playing, and the events and actions about it."""

    def __init__(self, outbox: Outbox, conversation: Conversation) -> None:
        self._outbox = outbox
        self._conversation = conversation
        self._playing: dict[str, _Playout] = {}
        # The responses held (``hold``) and not yet resumed, cleared or played out.
        self._held: list[str] = []

    def queued(self, response_id: str, item_id: str, in_band: bool) -> None:
        """Audio of ``item_id`` went to the player for ``response_id``."""
        self._playing[response_id] = _Playout(item_id, in_band)

    def item_ids(self) -> set[str]:
        """The items whose audio is playing (their audio must be kept)."""
        return {p.item_id for p in self._playing.values()}

    @property
    def plays_in_band(self) -> bool:
        """Whether the conversation's reply is queued or playing."""
        return any(playout.in_band for playout in self._playing.values())

    def finish(self, response_id: str) -> None:
        """The response will produce no more audio: the player plays out what it has."""
        if response_id in self._playing:
            self._outbox.act(FinishAudio(response_id))

    def clear(self, requested: bool) -> None:
        """Stop the audio playing: all of it when the client asks (``requested``), the
        conversation's reply on barge-in (an out-of-band response is not part of the turn the
        user interrupts)."""
        if requested and not self._playing:
            raise ProtocolError("No audio is playing.", code="output_audio_buffer_empty")
        for response_id, playout in self._playing.items():
            if requested or playout.in_band:
                self._outbox.act(ClearAudio(response_id))

    def hold(self) -> None:
        """Hold the conversation's reply where it is (speech over it is being judged)."""
        for response_id, playout in self._playing.items():
            if playout.in_band and response_id not in self._held:
                self._held.append(response_id)
                self._outbox.act(HoldAudio(response_id))

    def resume(self) -> None:
        """Play what ``hold`` held on from where it was."""
        held, self._held = self._held, []
        for response_id in held:
            if response_id in self._playing:
                self._outbox.act(ResumeAudio(response_id))

    def started(self, response_id: str) -> None:
        """The player began a response's audio."""
        self._outbox.emit(se.OutputAudioBufferStarted(response_id=response_id))

    def stopped(self, response_id: str) -> bool:
        """The player played a response's audio to the end; True for the conversation's."""
        playout = self._playing.pop(response_id, None)
        if playout is None:
            return False
        self._unhold(response_id)
        self._outbox.emit(se.OutputAudioBufferStopped(response_id=response_id))
        return playout.in_band

    def cleared(self, response_id: str, played_ms: int) -> None:
        """The player stopped early: the item keeps only what was heard."""
        playout = self._playing.pop(response_id, None)
        if playout is None:
            return
        self._unhold(response_id)
        conversation = self._conversation
        if playout.item_id in conversation:
            part = conversation.get(playout.item_id).parts[0]
            if part.audio is not None and played_ms < part.duration_ms():
                truncate_part(part, played_ms)
                self._outbox.emit(
                    se.ConversationItemTruncated(
                        item_id=playout.item_id, content_index=0, audio_end_ms=played_ms
                    )
                )
        self._outbox.emit(se.OutputAudioBufferCleared(response_id=response_id))

    def _unhold(self, response_id: str) -> None:
        if response_id in self._held:
            self._held.remove(response_id)
