"""A Realtime translation session (``/v1/realtime/translations``) as a cascade of hark's
engines, sans I/O.

The input is cut into utterances where the speaker pauses, as ``server_vad`` cuts turns
(speech above 0.5, 300 ms kept before it, ended by 500 ms of silence, and at 30 s, which is
what the recogniser hears). Each utterance is recognised, its words are translated by the
LLM into the session's output language and the translation is spoken: one utterance at a
time, so that what comes out is in the order it was said. The core takes client events, the
VAD's answers and the engines' results, and gives server events and the work to do
(``TranslationAction``); the driver (``hark.transports.translation``) runs the engines.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from hark.protocol import server_events as se
from hark.protocol import translation as tr

# The VAD hears 32 ms chunks.
CHUNK_SAMPLES = tr.RATE * 32 // 1000
_THRESHOLD = 0.5
_PREFIX_CHUNKS = 300 // 32
_SILENCE_CHUNKS = 500 // 32
_MAX_CHUNKS = 30_000 // 32
# Speech waiting for its translation, at most: a client that sends audio faster than it is
# translated has its newest utterances dropped, each with an error, past this.
MAX_WAITING_S = 120.0
# An append carries at most this much audio (OpenAI's 15 MiB event, base64).
_MAX_APPEND_BYTES = 15 * 1024 * 1024
# The translation's language when the session names none.
DEFAULT_LANGUAGE = "en"
_NAMES = {
    "ar": "Arabic",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "hi": "Hindi",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ru": "Russian",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "zh": "Chinese",
}

Pcm = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class Listen:
    """Push these 32 ms chunks (rows, 24 kHz int16) to the VAD; answer with ``on_vad``."""

    chunks: Pcm


@dataclass(frozen=True, slots=True)
class Recognise:
    """Recognise an utterance (24 kHz int16); answer with ``on_recognised``."""

    utterance: int
    audio: Pcm


@dataclass(frozen=True, slots=True)
class Translate:
    """Have the LLM translate ``text`` (``instructions`` say into what); answer with
    ``on_translation_delta`` for each piece and ``on_translated``."""

    utterance: int
    instructions: str
    text: str


@dataclass(frozen=True, slots=True)
class Speak:
    """Speak ``text``; answer with ``on_speech`` for each chunk and ``on_spoken``."""

    utterance: int
    text: str


@dataclass(frozen=True, slots=True)
class Close:
    """The session is over: close the connection."""


TranslationAction = Listen | Recognise | Translate | Speak | Close


def instructions_for(language: str | None) -> str:
    """The LLM's instructions for a translation into ``language`` (an ISO-639-1 code)."""
    code = (language or DEFAULT_LANGUAGE).split("-")[0].lower()
    name = _NAMES.get(code, f"the language whose ISO-639-1 code is {code!r}")
    return (
        f"You are an interpreter. Translate what the user says into {name}. Answer with the "
        "translation alone: no explanations, no quotes, no notes."
    )


class TranslationSession:
    """One translation session: its configuration, its audio and the utterance in work."""

    def __init__(self, config: tr.TranslationConfig) -> None:
        self.config = config
        self._events: list[se.ServerEvent] = []
        self._actions: list[TranslationAction] = []
        self._counter = 0
        # Audio not yet a whole chunk.
        self._partial = np.zeros(0, dtype=np.int16)
        # Chunks pushed to the VAD and not yet answered, and those kept for an utterance.
        self._unanswered: deque[Pcm] = deque()
        self._kept: deque[Pcm] = deque(maxlen=_PREFIX_CHUNKS)
        self._speech: list[Pcm] | None = None
        self._silent = 0
        # Utterances waiting for their turn, and the one in work.
        self._waiting: deque[tuple[int, Pcm]] = deque()
        self._busy: int | None = None
        self._utterances = 0
        self._said_any = False
        self._heard_any = False
        # The translation of the utterance in work, so far.
        self._translation: list[str] = []
        self._closing = False
        self.closed = False
        self._emit(se.SessionCreated(session=config.to_wire()))

    # ----------------------------------------------------------------- outputs

    def take(self) -> tuple[list[se.ServerEvent], list[TranslationAction]]:
        """The events to send and the work to do since the last call."""
        events, self._events = self._events, []
        actions, self._actions = self._actions, []
        return events, actions

    def _emit(self, event: se.ServerEvent) -> None:
        self._counter += 1
        event.event_id = f"event_{self.config.id[5:]}_{self._counter}"
        self._events.append(event)

    def _error(
        self, code: str, message: str, event_id: str | None, param: str | None = None
    ) -> None:
        self._emit(
            se.Error(
                error=se.ErrorDetail(
                    type="invalid_request_error",
                    code=code,
                    message=message,
                    param=param,
                    event_id=event_id,
                )
            )
        )

    # ----------------------------------------------------------------- client events

    def receive(self, text: str) -> None:
        """A client event, as the WebSocket carried it."""
        try:
            raw = json.loads(text)
        except ValueError:
            self._error("invalid_json", "The event is not valid JSON.", None)
            return
        if not isinstance(raw, dict):
            self._error("invalid_event", "An event is a JSON object.", None)
            return
        event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
        kind = raw.get("type")
        if self._closing and kind != "session.close":
            self._error("session_closing", "The session is closing.", event_id)
        elif kind == "session.update":
            self._update(raw.get("session"), event_id)
        elif kind == "session.input_audio_buffer.append":
            self._append(raw.get("audio"), event_id)
        elif kind == "session.close":
            self._close()
        elif kind is None:
            self._error("invalid_event", "The 'type' field is missing.", event_id, "type")
        else:
            self._error(
                "invalid_event",
                f"Invalid value: '{str(kind)[:100]}'. A translation session takes "
                "'session.update', 'session.input_audio_buffer.append' and 'session.close'.",
                event_id,
                "type",
            )

    def _update(self, session: Any, event_id: str | None) -> None:
        try:
            update = msgspec.convert(session, tr.TranslationUpdate)
        except msgspec.ValidationError as exc:
            self._error("invalid_value", f"Invalid 'session': {exc}", event_id, "session")
            return
        if not isinstance(update.type, msgspec.UnsetType) and update.type != "translation":
            self._error(
                "invalid_value",
                "A session's type cannot be changed.",
                event_id,
                "session.type",
            )
            return
        if not isinstance(update.model, msgspec.UnsetType) and update.model != self.config.model:
            self._error(
                "invalid_value",
                "A translation session's model is set when it is created.",
                event_id,
                "session.model",
            )
            return
        self.config = self.config.updated(update)
        self._emit(se.SessionUpdated(session=self.config.to_wire()))

    def _append(self, audio: Any, event_id: str | None) -> None:
        if not isinstance(audio, str):
            self._error("invalid_value", "'audio' is base64 PCM16.", event_id, "audio")
            return
        if len(audio) > _MAX_APPEND_BYTES:
            self._error("invalid_value", "'audio' is larger than 15 MiB.", event_id, "audio")
            return
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            self._error("invalid_value", "'audio' is not valid base64.", event_id, "audio")
            return
        if len(data) % 2:
            self._error("invalid_value", "PCM16 audio has an even length.", event_id, "audio")
            return
        pcm = np.concatenate([self._partial, np.frombuffer(data, dtype="<i2").astype(np.int16)])
        whole = len(pcm) // CHUNK_SAMPLES * CHUNK_SAMPLES
        self._partial = pcm[whole:]
        if whole:
            chunks = pcm[:whole].reshape(-1, CHUNK_SAMPLES)
            self._unanswered.extend(chunks)
            self._actions.append(Listen(chunks))

    def _close(self) -> None:
        self._closing = True
        self._partial = np.zeros(0, dtype=np.int16)
        self._finish_if_done()

    # ----------------------------------------------------------------- the VAD

    def on_vad(self, probabilities: Sequence[float | None]) -> None:
        """The VAD's answers to the oldest chunks pushed, in order (None: not answered,
        taken as silence)."""
        for probability in probabilities:
            if not self._unanswered:
                break
            chunk = self._unanswered.popleft()
            speech = probability is not None and probability >= _THRESHOLD
            if self._speech is None:
                if speech:
                    self._speech = [*self._kept, chunk]
                    self._kept.clear()
                    self._silent = 0
                else:
                    self._kept.append(chunk)
                continue
            self._speech.append(chunk)
            self._silent = 0 if speech else self._silent + 1
            if self._silent >= _SILENCE_CHUNKS or len(self._speech) >= _MAX_CHUNKS:
                self._cut()
        self._finish_if_done()

    def _cut(self) -> None:
        """The utterance being said ends here."""
        assert self._speech is not None
        audio = np.concatenate(self._speech)
        self._speech = None
        self._silent = 0
        waiting = sum(len(pcm) for _, pcm in self._waiting) + len(audio)
        if waiting > MAX_WAITING_S * tr.RATE:
            self._emit(
                se.Error(
                    error=se.ErrorDetail(
                        type="invalid_request_error",
                        code="translation_backlog",
                        message=f"Over {MAX_WAITING_S:.0f} s of speech already waits for "
                        "its translation: an utterance was dropped.",
                        param=None,
                        event_id=None,
                    )
                )
            )
            return
        self._utterances += 1
        self._waiting.append((self._utterances, audio))
        self._next()

    def expire(self, max_duration_s: float) -> None:
        """The session has lasted ``max_duration_s``, as long as a session may: it ends."""
        if self.closed:
            return
        self.closed = True
        self._emit(
            se.Error(
                error=se.ErrorDetail(
                    type="invalid_request_error",
                    code="session_expired",
                    message="Your session hit the maximum duration of "
                    f"{max_duration_s / 60:g} minutes.",
                    param=None,
                    event_id=None,
                )
            )
        )

    def _finish_if_done(self) -> None:
        if not self._closing or self._unanswered:
            return
        if self._speech is not None:
            self._cut()
        if self._busy is None and not self._waiting and not self.closed:
            self.closed = True
            self._emit(tr.SessionClosed())
            self._actions.append(Close())

    # ----------------------------------------------------------------- the cascade

    def _next(self) -> None:
        if self._busy is not None or not self._waiting:
            return
        utterance, audio = self._waiting.popleft()
        self._busy = utterance
        self._actions.append(Recognise(utterance, audio))

    def on_recognised(self, utterance: int, text: str) -> None:
        """The words of ``utterance``."""
        if utterance != self._busy:
            return
        words = text.strip()
        if not words:
            self._done()
            return
        if self.config.transcription is not None:
            self._emit(tr.InputTranscriptDelta(delta=(" " if self._heard_any else "") + words))
            self._heard_any = True
        self._translation = []
        self._actions.append(Translate(utterance, instructions_for(self.config.language), words))

    def on_translation_delta(self, utterance: int, text: str) -> None:
        """A piece of ``utterance``'s translation."""
        if utterance != self._busy or not text:
            return
        if not self._translation and self._said_any:
            text = " " + text.lstrip()
        self._translation.append(text)
        self._emit(tr.OutputTranscriptDelta(delta=text))

    def on_translated(self, utterance: int) -> None:
        """``utterance``'s translation is whole: it is spoken."""
        if utterance != self._busy:
            return
        said = "".join(self._translation).strip()
        if not said:
            self._done()
            return
        self._said_any = True
        self._actions.append(Speak(utterance, said))

    def on_speech(self, utterance: int, pcm: Pcm) -> None:
        """A chunk of the spoken translation, 24 kHz int16."""
        if utterance != self._busy or not len(pcm):
            return
        delta = base64.b64encode(pcm.astype("<i2").tobytes()).decode("ascii")
        self._emit(tr.OutputAudioDelta(delta=delta))

    def on_spoken(self, utterance: int) -> None:
        """``utterance`` is translated and spoken."""
        if utterance == self._busy:
            self._done()

    def on_failed(self, utterance: int, message: str) -> None:
        """An engine failed on ``utterance``: the client is told, and the next goes on."""
        if utterance != self._busy:
            return
        self._emit(
            se.Error(
                error=se.ErrorDetail(
                    type="server_error",
                    code="translation_failed",
                    message=message,
                    param=None,
                    event_id=None,
                )
            )
        )
        self._done()

    def _done(self) -> None:
        self._busy = None
        self._next()
        self._finish_if_done()
