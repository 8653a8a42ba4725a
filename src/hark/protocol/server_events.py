"""Server events (GA names). The beta dialect is a translation at the edge, not here."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from hark.protocol.items import Item


class ServerEvent(Struct, kw_only=True, tag_field="type", omit_defaults=False):
    """Base of server events; the session stamps ``event_id`` when it emits one."""

    event_id: str = ""


class ErrorDetail(Struct, omit_defaults=False):
    """OpenAI's error object."""

    type: str
    code: str | None
    message: str
    param: str | None
    event_id: str | None


class Error(ServerEvent, tag="error"):
    """A client mistake or a server problem; the connection stays open."""

    error: ErrorDetail


# The bases below hold fields that several events share. Their fields are positional, as
# each event's own are, so that every event keeps its fields in the order OpenAI sends them.


class _SessionEvent(ServerEvent):
    session: dict[str, Any]


class SessionCreated(_SessionEvent, tag="session.created"):
    """The first event of every session."""


class SessionUpdated(_SessionEvent, tag="session.updated"):
    """The whole effective configuration after an update."""


class _ConversationItem(ServerEvent):
    previous_item_id: str | None
    item: Item


class ConversationItemAdded(_ConversationItem, tag="conversation.item.added"):
    """An item entered the conversation (it may still be in progress)."""


class ConversationItemDone(_ConversationItem, tag="conversation.item.done"):
    """An item is complete."""


class ConversationItemRetrieved(ServerEvent, tag="conversation.item.retrieved"):
    """An item with its audio, on request."""

    item: Item


class _ItemEvent(ServerEvent):
    item_id: str


class _ItemContentEvent(_ItemEvent):
    content_index: int


class ConversationItemTruncated(_ItemContentEvent, tag="conversation.item.truncated"):
    """An assistant item was cut to what the user heard."""

    audio_end_ms: int


class ConversationItemDeleted(_ItemEvent, tag="conversation.item.deleted"):
    """An item was removed."""


class LogProb(Struct, omit_defaults=False):
    """One token's log probability in a transcript (``include`` asks for them)."""

    token: str
    logprob: float
    bytes: list[int]


class InputTranscriptionDelta(
    _ItemContentEvent, tag="conversation.item.input_audio_transcription.delta", omit_defaults=True
):
    """A piece of the transcript of the user's audio; ``logprobs`` only when asked for."""

    delta: str
    logprobs: list[LogProb] | None = None


class InputTranscriptionCompleted(
    _ItemContentEvent,
    tag="conversation.item.input_audio_transcription.completed",
    omit_defaults=True,
):
    """The whole transcript of the user's audio; ``logprobs`` only when asked for."""

    transcript: str
    usage: dict[str, Any]
    logprobs: list[LogProb] | None = None
    # The language heard (or the one the session fixed): ``{"code": ISO-639-1}``.
    languages: list[dict[str, str]] | None = None


class InputTranscriptionFailed(
    _ItemContentEvent, tag="conversation.item.input_audio_transcription.failed"
):
    """Transcription of the user's audio failed.

    The error's fields that are null (``param``, mostly) are left out: the JS agents SDK's
    schema of this event takes each as an optional string, and reads the event as an
    unknown one when one is null.
    """

    error: dict[str, Any]

    def __post_init__(self) -> None:
        self.error = {name: value for name, value in self.error.items() if value is not None}


class SpeechStarted(ServerEvent, tag="input_audio_buffer.speech_started"):
    """The VAD heard speech begin (``audio_start_ms`` includes the prefix padding)."""

    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent, tag="input_audio_buffer.speech_stopped"):
    """The turn ended (``audio_end_ms`` includes the silence window)."""

    audio_end_ms: int
    item_id: str


class InputAudioBufferCommitted(ServerEvent, tag="input_audio_buffer.committed"):
    """The buffer became a user message item."""

    previous_item_id: str | None
    item_id: str


class InputAudioBufferCleared(ServerEvent, tag="input_audio_buffer.cleared"):
    """The buffer was emptied on request."""


class InputAudioBufferTimeoutTriggered(ServerEvent, tag="input_audio_buffer.timeout_triggered"):
    """The user stayed silent for ``idle_timeout_ms``; a response follows."""

    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class HarkBackchannel(ServerEvent, tag="hark.backchannel"):
    """hark's own (``"include": ["hark.backchannels"]``): speech while the reply played was a
    backchannel, let pass (no turn, the reply goes on): where it was, and what was heard."""

    audio_start_ms: int
    audio_end_ms: int
    transcript: str


class InputAudioBufferDtmfEventReceived(ServerEvent, tag="input_audio_buffer.dtmf_event_received"):
    """SIP: a keypad press (``0``-``9``, ``*``, ``#``, ``A``-``D``) the phone sent, and when
    the server received it (UNIX seconds)."""

    event: str
    received_at: int


class _ResponseIdEvent(ServerEvent):
    response_id: str


class OutputAudioBufferStarted(_ResponseIdEvent, tag="output_audio_buffer.started"):
    """WebRTC/SIP: reply audio began playing."""


class OutputAudioBufferStopped(_ResponseIdEvent, tag="output_audio_buffer.stopped"):
    """WebRTC/SIP: reply audio finished playing."""


class OutputAudioBufferCleared(_ResponseIdEvent, tag="output_audio_buffer.cleared"):
    """WebRTC/SIP: unplayed reply audio was dropped."""


class Usage(Struct, omit_defaults=False):
    """Token usage of a response."""

    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: dict[str, Any]
    output_token_details: dict[str, Any]


class ResponseAudioConfig(Struct):
    """The audio settings a response was made with."""

    output: dict[str, Any]


class Response(Struct, kw_only=True, omit_defaults=False):
    """The response object of ``response.created`` / ``response.done``."""

    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
    status_details: dict[str, Any] | None = None
    output: list[Item]
    conversation_id: str | None
    output_modalities: list[str]
    max_output_tokens: int | Literal["inf"]
    audio: ResponseAudioConfig | None = None
    usage: Usage | None = None
    metadata: dict[str, Any] | None = None


class _ResponseEvent(ServerEvent):
    response: Response


class ResponseCreated(_ResponseEvent, tag="response.created"):
    """A response began."""


class ResponseDone(_ResponseEvent, tag="response.done"):
    """A response ended (completed, cancelled, failed or incomplete)."""


class _OutputItem(_ResponseIdEvent):
    output_index: int
    item: Item


class OutputItemAdded(_OutputItem, tag="response.output_item.added"):
    """A response produced a new item."""


class OutputItemDone(_OutputItem, tag="response.output_item.done"):
    """A response item is complete."""


class _Part(ServerEvent, kw_only=True):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ContentPartAdded(_Part, tag="response.content_part.added"):
    """A content part began; ``part`` has ``type`` audio or text."""

    part: dict[str, Any]


class ContentPartDone(_Part, tag="response.content_part.done"):
    """A content part is complete."""

    part: dict[str, Any]


class OutputAudioDelta(_Part, tag="response.output_audio.delta"):
    """Base64 audio in the session's output format."""

    delta: str


class OutputAudioDone(_Part, tag="response.output_audio.done"):
    """No more audio for this part."""


class OutputAudioTranscriptDelta(_Part, tag="response.output_audio_transcript.delta"):
    """Words of the reply, sent with their audio."""

    delta: str


class OutputAudioTranscriptDone(_Part, tag="response.output_audio_transcript.done"):
    """The reply's whole transcript."""

    transcript: str


class OutputTextDelta(_Part, tag="response.output_text.delta"):
    """A piece of a text reply."""

    delta: str


class OutputTextDone(_Part, tag="response.output_text.done"):
    """The whole text reply."""

    text: str


class _OutputItemEvent(_ResponseIdEvent):
    item_id: str
    output_index: int


class _FunctionCallArguments(_OutputItemEvent):
    call_id: str


class FunctionCallArgumentsDelta(
    _FunctionCallArguments, tag="response.function_call_arguments.delta"
):
    """A piece of a function call's JSON arguments."""

    delta: str


class FunctionCallArgumentsDone(
    _FunctionCallArguments, tag="response.function_call_arguments.done"
):
    """A function call's whole arguments."""

    name: str
    arguments: str


class McpListToolsInProgress(_ItemEvent, tag="mcp_list_tools.in_progress"):
    """hark began listing an MCP server's tools into the ``mcp_list_tools`` item."""


class McpListToolsCompleted(_ItemEvent, tag="mcp_list_tools.completed"):
    """The MCP server's tools are listed (``conversation.item.done`` carries them)."""


class McpListToolsFailed(_ItemEvent, tag="mcp_list_tools.failed"):
    """The MCP server could not be listed: its tools are not offered to the model."""


class ResponseMcpCallArgumentsDelta(_OutputItemEvent, tag="response.mcp_call_arguments.delta"):
    """A piece of an MCP call's JSON arguments.

    ``obfuscation`` is OpenAI's padding against guessing a delta from its size; hark sends
    an empty one, since the JS agents SDK's schema of this event requires the field.
    """

    delta: str
    obfuscation: str = ""


class ResponseMcpCallArgumentsDone(_OutputItemEvent, tag="response.mcp_call_arguments.done"):
    """An MCP call's whole arguments."""

    arguments: str


class _McpCallEvent(_ItemEvent):
    output_index: int


class ResponseMcpCallInProgress(_McpCallEvent, tag="response.mcp_call.in_progress"):
    """hark is calling the MCP server."""


class ResponseMcpCallCompleted(_McpCallEvent, tag="response.mcp_call.completed"):
    """The MCP call returned (its ``output`` is on the item)."""


class ResponseMcpCallFailed(_McpCallEvent, tag="response.mcp_call.failed"):
    """The MCP call failed (its ``error`` is on the item)."""


class RateLimit(Struct, omit_defaults=False):
    """One limit's state."""

    name: Literal["requests", "tokens"]
    limit: int
    remaining: int
    reset_seconds: float


class RateLimitsUpdated(ServerEvent, tag="rate_limits.updated"):
    """Sent when a response starts."""

    rate_limits: list[RateLimit]


_encoder = msgspec.json.Encoder()


def encode_event(event: ServerEvent) -> bytes:
    """Serialise a server event as JSON."""
    return _encoder.encode(event)
