"""What the engines and the transport report back to the session core: one type per result.

The core asks for work with actions (``actions``); what comes of that work is handed back as
one of these with ``Session.handle(result, now=)``, which routes it to the part of the
session that owns it. Each is named after what happened; ``response_id``, ``request_id``,
``item_id``, ``job_id``, ``key`` and ``epoch`` are those of the action that asked.

They are frozen msgspec structs, not frozen dataclasses: one is made for every VAD chunk and
every engine delta, and on Python 3.11 a frozen dataclass takes about six times as long to
make (each field is set through ``object.__setattr__``). None holds a reference back to
anything that holds it, so the garbage collector need not track them (``gc=False``).
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from hark.engines.asr import TimedTranscript
from hark.engines.llm import Finished
from hark.protocol import items as wire


class VadScored(msgspec.Struct, frozen=True, gc=False):
    """The VAD's speech probability for the oldest chunk of ``epoch`` not yet answered."""

    probability: float
    epoch: int


class VadMissed(msgspec.Struct, frozen=True, gc=False):
    """No VAD answer for the oldest chunk of ``epoch`` not yet answered: dropped (``error``
    None) or the VAD failed (why: ``error``)."""

    epoch: int
    error: str | None = None


class TurnScored(msgspec.Struct, frozen=True, gc=False):
    """How complete the utterance of the pause ``key`` sounds (``ScoreTurn``)."""

    key: str
    probability: float


class TurnScoreFailed(msgspec.Struct, frozen=True, gc=False):
    """The end-of-turn model failed on the pause ``key``."""

    key: str


class TranscriptionDelta(msgspec.Struct, frozen=True, gc=False):
    """A piece of a transcript (``Transcribe``)."""

    request_id: str
    delta: str


class TranscriptionDone(msgspec.Struct, frozen=True, gc=False):
    """A whole transcript of ``audio_seconds`` of audio, and the language the engine heard it
    in (when it said)."""

    request_id: str
    transcript: str
    audio_seconds: float
    language: str | None = None


class TranscriptionFailed(msgspec.Struct, frozen=True, gc=False):
    """Recognition (``Transcribe`` or ``Recognise``) failed: no words for that audio."""

    request_id: str
    message: str


class RecognisedText(msgspec.Struct, frozen=True, gc=False):
    """A step asked for ``text_first`` heard ``words`` (``TranscriptText.words``); their
    times come after, as ``Recognised``, or the step fails."""

    request_id: str
    words: tuple[str, ...]


class Recognised(msgspec.Struct, frozen=True, gc=False):
    """A step of incremental recognition (``Recognise``) heard ``transcript``."""

    request_id: str
    transcript: TimedTranscript


class Denoised(msgspec.Struct, frozen=True, gc=False):
    """The append ``Denoise(job_id)`` took, denoised."""

    job_id: str
    pcm: npt.NDArray[np.int16]


class DenoiseFailed(msgspec.Struct, frozen=True, gc=False):
    """``Denoise(job_id)`` raised (``message``)."""

    job_id: str
    message: str


class TextGenerated(msgspec.Struct, frozen=True, gc=False):
    """LLM text for a text-only response."""

    response_id: str
    delta: str


class AudioGenerated(msgspec.Struct, frozen=True, gc=False):
    """Reply audio at the output rate; ``transcript`` is the text this audio starts to speak."""

    response_id: str
    pcm: npt.NDArray[np.int16]
    transcript: str


class ToolCallStarted(msgspec.Struct, frozen=True, gc=False):
    """The LLM began a function call."""

    response_id: str
    call_id: str
    name: str


class ToolCallDelta(msgspec.Struct, frozen=True, gc=False):
    """A piece of a function call's arguments."""

    response_id: str
    call_id: str
    delta: str


class ToolCallFinished(msgspec.Struct, frozen=True, gc=False):
    """A function call is complete."""

    response_id: str
    call_id: str
    arguments: str


class GenerationFinished(msgspec.Struct, frozen=True, gc=False):
    """The engines are done with a response."""

    response_id: str
    finished: Finished


class GenerationFailed(msgspec.Struct, frozen=True, gc=False):
    """An engine failed: the response fails with ``code`` (the error's ``type`` being
    ``error_type``), the session goes on."""

    response_id: str
    message: str
    code: str = "engine_error"
    error_type: str = "server_error"


class McpToolsListed(msgspec.Struct, frozen=True, gc=False):
    """An MCP server listed its tools (``ListMcpTools``)."""

    item_id: str
    tools: list[wire.McpTool]


class McpListFailed(msgspec.Struct, frozen=True, gc=False):
    """An MCP server could not be listed (why: ``error``): it offers no tools."""

    item_id: str
    error: wire.McpCallError | None = None


class McpCallDone(msgspec.Struct, frozen=True, gc=False):
    """An MCP call (``CallMcpTool``) returned ``output``."""

    response_id: str
    item_id: str
    output: str


class McpCallFailed(msgspec.Struct, frozen=True, gc=False):
    """An MCP call failed; the next response reads the error."""

    response_id: str
    item_id: str
    error: wire.McpCallError


class PlayoutStarted(msgspec.Struct, frozen=True, gc=False):
    """The transport began playing a response's audio (WebRTC, SIP)."""

    response_id: str


class PlayoutStopped(msgspec.Struct, frozen=True, gc=False):
    """The transport played a response's audio to the end."""

    response_id: str


class PlayoutCleared(msgspec.Struct, frozen=True, gc=False):
    """Playout stopped early (barge-in or a clear) after ``played_ms`` of the response."""

    response_id: str
    played_ms: int


Result = (
    VadScored
    | VadMissed
    | TurnScored
    | TurnScoreFailed
    | TranscriptionDelta
    | TranscriptionDone
    | TranscriptionFailed
    | RecognisedText
    | Recognised
    | Denoised
    | DenoiseFailed
    | TextGenerated
    | AudioGenerated
    | ToolCallStarted
    | ToolCallDelta
    | ToolCallFinished
    | GenerationFinished
    | GenerationFailed
    | McpToolsListed
    | McpListFailed
    | McpCallDone
    | McpCallFailed
    | PlayoutStarted
    | PlayoutStopped
    | PlayoutCleared
)
