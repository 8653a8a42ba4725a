"""The Realtime translation protocol (``/v1/realtime/translations``), as the official SDK's
``RealtimeTranslation*`` types have it.

A translation session has no conversation and no responses: the client appends 24 kHz PCM16
audio (``session.input_audio_buffer.append``) and the server streams back the translation
(``session.output_transcript.delta``, ``session.output_audio.delta``) and, when asked, the
words heard (``session.input_transcript.delta``). ``session.update`` changes the output
language, the source transcription and noise reduction; ``session.close`` flushes what was
said and ends the session with ``session.closed``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from hark.protocol.server_events import ServerEvent
from hark.protocol.session_config import NoiseReduction

# Translation input is 24 kHz PCM16 mono, and so is the translated audio.
RATE = 24000


class TranslationTranscription(Struct, forbid_unknown_fields=True):
    """Source-language transcription: ``session.input_transcript.delta`` events."""

    model: str


class TranslationInput(Struct, forbid_unknown_fields=True, omit_defaults=True):
    noise_reduction: NoiseReduction | msgspec.UnsetType | None = msgspec.UNSET
    transcription: TranslationTranscription | msgspec.UnsetType | None = msgspec.UNSET


class TranslationOutput(Struct, forbid_unknown_fields=True, omit_defaults=True):
    language: str | msgspec.UnsetType | None = msgspec.UNSET


class TranslationAudio(Struct, forbid_unknown_fields=True, omit_defaults=True):
    input: TranslationInput | msgspec.UnsetType = msgspec.UNSET
    output: TranslationOutput | msgspec.UnsetType = msgspec.UNSET


class TranslationUpdate(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What ``session.update`` may change; ``type`` and ``model`` are set at creation."""

    audio: TranslationAudio | msgspec.UnsetType = msgspec.UNSET
    type: str | msgspec.UnsetType = msgspec.UNSET
    model: str | msgspec.UnsetType = msgspec.UNSET


class TranslationConfig(Struct, kw_only=True):
    """A translation session's effective configuration."""

    id: str
    model: str
    expires_at: int
    language: str | None = None
    transcription: TranslationTranscription | None = None
    noise_reduction: NoiseReduction | None = None

    def updated(self, update: TranslationUpdate) -> TranslationConfig:
        """This configuration with ``update``'s fields applied (absent ones kept)."""
        changed = msgspec.structs.replace(self)
        audio = update.audio
        if isinstance(audio, TranslationAudio):
            if isinstance(audio.output, TranslationOutput) and not isinstance(
                audio.output.language, msgspec.UnsetType
            ):
                changed.language = audio.output.language
            if isinstance(audio.input, TranslationInput):
                if not isinstance(audio.input.transcription, msgspec.UnsetType):
                    changed.transcription = audio.input.transcription
                if not isinstance(audio.input.noise_reduction, msgspec.UnsetType):
                    changed.noise_reduction = audio.input.noise_reduction
        return changed

    def to_wire(self) -> dict[str, Any]:
        """The session object of ``session.created`` and ``session.updated``."""
        return {
            "id": self.id,
            "type": "translation",
            "model": self.model,
            "expires_at": self.expires_at,
            "audio": {
                "input": {
                    "noise_reduction": msgspec.to_builtins(self.noise_reduction),
                    "transcription": msgspec.to_builtins(self.transcription),
                },
                "output": {"language": self.language},
            },
        }


class SessionClosed(ServerEvent, tag="session.closed"):
    """The session flushed what it was given and ends."""


class InputTranscriptDelta(ServerEvent, tag="session.input_transcript.delta"):
    """Words heard in the source language (append-only; spaces are in the deltas)."""

    delta: str


class OutputTranscriptDelta(ServerEvent, tag="session.output_transcript.delta"):
    """Words of the translation (append-only; spaces are in the deltas)."""

    delta: str


class OutputAudioDelta(ServerEvent, tag="session.output_audio.delta"):
    """Translated speech: base64 PCM16 mono at ``sample_rate``."""

    delta: str
    sample_rate: int = RATE
    channels: int = 1
    format: str = "pcm16"
