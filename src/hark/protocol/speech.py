"""``POST /v1/audio/speech``: the request body (OpenAI's shape)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from hark.protocol.errors import decode_body

MAX_INPUT_CHARS = 4096


class VoiceId(Struct, forbid_unknown_fields=True):
    """A custom voice, by id."""

    id: str


class SpeechRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """What to say and how; ``instructions`` are accepted, and unused by voices that take
    none (hibari's, Piper's)."""

    model: str
    input: Annotated[str, Meta(min_length=1, max_length=MAX_INPUT_CHARS)]
    voice: str | VoiceId
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Annotated[float, Meta(ge=0.25, le=4.0)] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"

    @property
    def voice_name(self) -> str:
        """The voice as the TTS engine takes it."""
        return self.voice if isinstance(self.voice, str) else self.voice.id


_decode = msgspec.json.Decoder(SpeechRequest).decode


def parse_speech_request(raw: bytes) -> SpeechRequest:
    """The request of a JSON body; raises ProtocolError naming the offending parameter."""
    return decode_body(_decode, raw)
