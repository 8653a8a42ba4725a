"""Recognition: speech recognition in flight, and transcripts onto the user's items."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hark.audio.resample import resample
from hark.protocol import server_events as se
from hark.protocol.session_config import Transcription
from hark.session.actions import Transcribe
from hark.session.conversation import Conversation, Entry, Part
from hark.session.outbox import Outbox
from hark.session.speculation import Pause


class Recognition:
    """Requests the ASR engine works on, each for a user item or for a pause of the current
    turn (speculative recognition), and what their results do.

    ``transcription`` gives the session's current ``audio.input.transcription`` (None: the
    client did not ask for transcripts, and the words are only the LLM's); ``on_heard`` is
    called when an item's words become known, so responses waiting for them can start.
    """

    def __init__(
        self,
        outbox: Outbox,
        conversation: Conversation,
        asr_rate: int,
        transcription: Callable[[], Transcription | None],
        on_heard: Callable[[], None],
    ) -> None:
        self._outbox = outbox
        self._conversation = conversation
        self._asr_rate = asr_rate
        self._transcription = transcription
        self._on_heard = on_heard
        # Request id → the item it is for, or the pause it speculates on.
        self._requests: dict[str, str | Pause] = {}

    def _transcribe(self, request_id: str, pcm: npt.NDArray[np.int16], rate: int) -> None:
        transcription = self._transcription()
        self._outbox.act(
            Transcribe(
                request_id=request_id,
                audio=resample(pcm, rate, self._asr_rate).astype(np.float32) / 32768.0,
                language=transcription.language if transcription else None,
                prompt=transcription.prompt if transcription else None,
            )
        )

    def recognise(self, entry: Entry, part: Part) -> None:
        """Recognise an item's audio part."""
        assert part.audio is not None
        self._requests[entry.id] = entry.id
        self._transcribe(entry.id, part.audio, part.rate)

    def recognise_pause(self, pause: Pause, pcm: npt.NDArray[np.int16], rate: int) -> None:
        """Recognise the turn so far while its pause is waited out."""
        pause.asr_request = f"{pause.key}:asr"
        self._requests[pause.asr_request] = pause
        self._transcribe(pause.asr_request, pcm, rate)

    def forget(self, pause: Pause) -> None:
        """The pause is over without a turn: its recognition is of no use."""
        if pause.asr_request is not None:
            self._requests.pop(pause.asr_request, None)

    def commit(self, entry: Entry, part: Part, pause: Pause | None) -> None:
        """The turn became ``entry``: its words come from the pause's recognition, if that
        ran, or from recognising the item."""
        if pause is not None and pause.transcript is not None:
            # Recognised while the end of the turn was waited out: the words are known already.
            assert part.audio is not None
            self._transcribed(entry, part, pause.transcript, len(part.audio) / part.rate, True)
        elif pause is not None and pause.asr_request in self._requests:
            # Recognition of the turn is under way: its result is this item's transcript.
            self._requests[pause.asr_request] = entry.id
        else:
            self.recognise(entry, part)

    def _pending_part(self, item_id: str) -> tuple[Entry, Part] | None:
        if item_id not in self._conversation:
            return None
        entry = self._conversation.get(item_id)
        part = next((p for p in entry.parts if p.type == "input_audio" and p.heard is None), None)
        return None if part is None else (entry, part)

    def delta(self, request_id: str, delta: str) -> None:
        """A piece of a transcript."""
        item_id = self._requests.get(request_id)
        if (
            isinstance(item_id, str)
            and self._pending_part(item_id) is not None
            and self._transcription() is not None
        ):
            self._outbox.emit(
                se.InputTranscriptionDelta(item_id=item_id, content_index=0, delta=delta)
            )

    def done(self, request_id: str, transcript: str, audio_seconds: float) -> Pause | None:
        """A whole transcript; returns the pause it was for, if it was a pause's."""
        target = self._requests.pop(request_id, None)
        if isinstance(target, Pause):
            return target
        pending = self._pending_part(target) if target is not None else None
        if pending is not None:
            self._transcribed(*pending, transcript, audio_seconds, request_id != target)
        return None

    def _transcribed(
        self, entry: Entry, part: Part, transcript: str, seconds: float, send_delta: bool
    ) -> None:
        part.heard = transcript
        if self._transcription() is not None:
            part.transcript = transcript
            if send_delta:
                # Speculative recognition sent no deltas for this item: send the words once.
                self._outbox.emit(
                    se.InputTranscriptionDelta(item_id=entry.id, content_index=0, delta=transcript)
                )
            self._outbox.emit(
                se.InputTranscriptionCompleted(
                    item_id=entry.id,
                    content_index=0,
                    transcript=transcript,
                    usage={"type": "duration", "seconds": round(seconds, 3)},
                )
            )
        self._on_heard()

    def failed(self, request_id: str, message: str) -> None:
        """Recognition failed: the LLM will see no words for that audio."""
        target = self._requests.pop(request_id, None)
        if isinstance(target, Pause) or target is None:
            return
        pending = self._pending_part(target)
        if pending is None:
            return
        entry, part = pending
        part.heard = ""
        if self._transcription() is not None:
            self._outbox.emit(
                se.InputTranscriptionFailed(
                    item_id=entry.id,
                    content_index=0,
                    error={
                        "type": "server_error",
                        "code": "transcription_failed",
                        "message": message,
                        "param": None,
                    },
                )
            )
        self._on_heard()
