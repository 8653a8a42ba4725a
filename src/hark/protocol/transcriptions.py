"""``POST /v1/audio/transcriptions``: the form's fields and the answers (OpenAI's shapes)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field

from hark.protocol.errors import from_validation_error

ResponseFormat = Literal["json", "text", "verbose_json", "srt", "vtt"]


class TranscriptionRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """The form fields besides ``file`` (list fields are sent as ``name[]``)."""

    model: str
    language: str | None = None
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    timestamp_granularities: list[Literal["segment", "word"]] = field(default_factory=list)
    include: list[Literal["logprobs"]] = field(default_factory=list)
    stream: bool = False
    chunking_strategy: Literal["auto"] | None = None


class DurationUsage(Struct, kw_only=True):
    """What a transcription cost: seconds of audio."""

    seconds: float
    type: Literal["duration"] = "duration"


class Transcription(Struct, kw_only=True):
    """The ``json`` answer."""

    text: str
    usage: DurationUsage


class Segment(Struct, kw_only=True, omit_defaults=True):
    """A stretch of the audio and its text, times in seconds; ``seek`` is the start of its
    decoding window in 10 ms frames. The decoder's details are left out where the engine
    does not know them."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int] | None = None
    temperature: float | None = None
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None


class Word(Struct, kw_only=True):
    """A word and its times in seconds."""

    word: str
    start: float
    end: float


class TranscriptionVerbose(Struct, kw_only=True):
    """The ``verbose_json`` answer: ``segments`` unless only word timestamps were asked
    for, ``words`` when they were; ``language`` as the engine heard it."""

    task: Literal["transcribe"] = "transcribe"
    language: str
    duration: float
    text: str
    segments: list[Segment] | UnsetType = UNSET
    words: list[Word] | UnsetType = UNSET
    usage: DurationUsage


class TextDelta(Struct, tag="transcript.text.delta", tag_field="type", kw_only=True):
    """A streamed piece of the transcript."""

    delta: str


class TextDone(Struct, tag="transcript.text.done", tag_field="type", kw_only=True):
    """The end of a streamed transcript: all of it."""

    text: str


def parse_transcription_form(fields: dict[str, str | list[str]]) -> TranscriptionRequest:
    """The request of the form's text fields; raises ProtocolError naming the offending one."""
    try:
        # Not strict: form fields are text ("true", "0.2").
        return msgspec.convert(fields, TranscriptionRequest, strict=False)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc, None) from None
