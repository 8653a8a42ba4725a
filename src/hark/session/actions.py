"""Work the session core asks its driver to do.

Results come back to ``Session.handle`` as the types of ``results``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from hark.engines.asr import RecognitionRequest
from hark.engines.llm import GenerationRequest
from hark.tools.mcp_server import McpServer


class AnalyzeSpeech(NamedTuple):
    """Run the VAD on the chunks (``VadEngine.chunk_ms`` each) of input audio one append
    completed (int16 at the input rate, one chunk a row); answer each with
    ``VadScored(probability, epoch)`` (``VadMissed`` when there is none), in order.

    A new ``epoch`` means the VAD stream must start from fresh state. A named tuple rather
    than a frozen dataclass like the other actions: a session makes tens a second, and a
    tuple is built in a third of the time.
    """

    chunks: npt.NDArray[np.int16]
    epoch: int


@dataclass(frozen=True, slots=True)
class Transcribe:
    """Recognise audio (at ``AsrEngine.sample_rate``); answer with
    ``TranscriptionDelta``, ``TranscriptionDone`` or ``TranscriptionFailed``.

    ``request_id`` is the user item's id, or a key of the core's own for speculative work.
    With ``language`` ``None`` the language is detected first (``AsrEngine.detect_language``),
    held to ``languages`` when there are any, and the transcript is made in it.
    """

    request_id: str
    audio: npt.NDArray[np.float32]
    language: str | None
    prompt: str | None
    languages: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Recognise:
    """One step of incremental recognition: decode a window of a turn with word times
    (``AsrEngine.recognise``); answer with ``Recognised(request_id, transcript)``, or
    ``TranscriptionFailed(request_id, message)`` when the engine fails. ``text_first``:
    someone waits for the words and not their times (``AsrEngine.recognise_stages``), so
    ``RecognisedText(request_id, words)`` comes first where the engine knows them sooner."""

    request_id: str
    request: RecognitionRequest
    text_first: bool = False


@dataclass(frozen=True, slots=True)
class CancelRecognition:
    """Nobody will use the step ``request_id`` any more: drop it, or abandon it if it runs.
    Its result, should one still come, is ignored."""

    request_id: str


@dataclass(frozen=True, slots=True)
class ScoreTurn:
    """Judge how complete an utterance sounds; answer with ``TurnScored(key, p)``, or
    ``TurnScoreFailed(key)`` when the model fails."""

    key: str
    transcript: str
    context: str | None


@dataclass(frozen=True, slots=True)
class Generate:
    """Produce a response: LLM, and for audio output, TTS at ``output_rate``."""

    response_id: str
    request: GenerationRequest
    audio: bool
    voice: str
    speed: float
    output_rate: int


@dataclass(frozen=True, slots=True)
class Prefill:
    """The conversation changed: the LLM may read it now, before the next turn needs it."""

    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class Speculate:
    """Start the engines on a reply the user has not asked for yet, holding what they make.

    ``AdoptSpeculation`` turns the held work into a response; ``DiscardSpeculation``
    throws it away unseen. One runs at a time: the core discards one before the next.
    """

    key: str
    generate: Generate


@dataclass(frozen=True, slots=True)
class AdoptSpeculation:
    """The user said what was speculated on: the speculative reply ``key`` becomes the
    response ``response_id``, with what it has made so far and all it makes from now on."""

    key: str
    response_id: str


@dataclass(frozen=True, slots=True)
class DiscardSpeculation:
    """The user went on speaking: drop the speculative reply."""

    key: str


@dataclass(frozen=True, slots=True)
class CancelGeneration:
    """Stop a response's engine work at once; its later results are ignored anyway."""

    response_id: str


@dataclass(frozen=True, slots=True)
class PlayAudio:
    """Transports that play audio themselves (WebRTC, SIP): queue reply audio for playout.

    Report progress with ``PlayoutStarted`` / ``PlayoutStopped``.
    """

    response_id: str
    item_id: str
    pcm: npt.NDArray[np.int16]
    rate: int


@dataclass(frozen=True, slots=True)
class FinishAudio:
    """No more audio comes for this response: report ``PlayoutStopped`` once what is
    queued has played."""

    response_id: str


@dataclass(frozen=True, slots=True)
class ClearAudio:
    """Stop playing this response now and drop the rest; answer with ``PlayoutCleared``."""

    response_id: str


@dataclass(frozen=True, slots=True)
class HoldAudio:
    """Play none of this response for now, keeping its place: silence goes out until
    ``ResumeAudio`` (it goes on from where it stopped) or ``ClearAudio`` (what was played
    before the hold is what was heard)."""

    response_id: str


@dataclass(frozen=True, slots=True)
class ResumeAudio:
    """Play a held response again from where it was held."""

    response_id: str


@dataclass(frozen=True, slots=True)
class ListMcpTools:
    """List an MCP server's tools; answer with ``McpToolsListed(item_id, tools)``, or
    ``McpListFailed(item_id, error)`` when the server cannot be listed."""

    item_id: str
    server: McpServer


@dataclass(frozen=True, slots=True)
class CallMcpTool:
    """Call a tool on an MCP server with ``arguments`` (JSON text); answer with
    ``McpCallDone(response_id, item_id, output)`` or ``McpCallFailed(response_id, item_id,
    error)``. ``CancelGeneration(response_id)`` abandons it."""

    response_id: str
    item_id: str
    server: McpServer
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class CloseMcpServer:
    """The session no longer uses the MCP server ``label``: close its connection."""

    label: str


@dataclass(frozen=True, slots=True)
class Denoise:
    """Run ``denoise`` on ``pcm`` (input audio, int16 at the input rate) off the event loop;
    answer with ``Denoised(job_id, pcm)``, or ``DenoiseFailed(job_id, message)`` when
    it raises. The core holds the session's later client input until then, so at most one
    job per session runs, and its denoiser's stream stays in order."""

    job_id: str
    pcm: npt.NDArray[np.int16]
    denoise: Callable[[npt.NDArray[np.int16]], npt.NDArray[np.int16]]


@dataclass(frozen=True, slots=True)
class CountDroppedAudio:
    """Input audio was dropped (``samples`` of it, at the input rate, from one chunk): the
    input buffer was full. For the driver's metrics; nothing to answer."""

    samples: int


@dataclass(frozen=True, slots=True)
class Close:
    """End the session (after the events already queued are sent)."""

    reason: str


Action = (
    AnalyzeSpeech
    | Transcribe
    | Recognise
    | CancelRecognition
    | ScoreTurn
    | Generate
    | Prefill
    | Speculate
    | AdoptSpeculation
    | DiscardSpeculation
    | CancelGeneration
    | PlayAudio
    | FinishAudio
    | ClearAudio
    | HoldAudio
    | ResumeAudio
    | ListMcpTools
    | CallMcpTool
    | CloseMcpServer
    | Denoise
    | CountDroppedAudio
    | Close
)
