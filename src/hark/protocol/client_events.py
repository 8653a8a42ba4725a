"""The client events (GA's eleven), and decoding them with errors in OpenAI's shape. The
beta dialect's events are translated to these at the transport (``hark.transports.beta``)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from hark.protocol.errors import ProtocolError, from_validation_error


class ClientEvent(Struct, forbid_unknown_fields=True, tag_field="type", kw_only=True):
    """Base of client events; ``event_id`` is echoed in errors."""

    event_id: str | None = None


class SessionUpdate(ClientEvent, tag="session.update"):
    """Partial update of the session; validated against SessionConfig by the session."""

    session: dict[str, Any]


class InputAudioBufferAppend(ClientEvent, tag="input_audio_buffer.append"):
    """Audio in the session's input format, base64 on the wire.

    The JSON decoder decodes the base64 itself (about five times faster than ``binascii``),
    and fails on invalid base64 with an error at ``audio``.
    """

    audio: bytes


class InputAudioBufferCommit(ClientEvent, tag="input_audio_buffer.commit"):
    """Turn the buffer into a user message."""


class InputAudioBufferClear(ClientEvent, tag="input_audio_buffer.clear"):
    """Drop the buffered audio."""


class ConversationItemCreate(ClientEvent, tag="conversation.item.create"):
    """Add an item; ``item`` is validated by the session so errors name ``item.…``."""

    item: dict[str, Any]
    previous_item_id: str | None = None


class ConversationItemRetrieve(ClientEvent, tag="conversation.item.retrieve"):
    """Ask for an item with its audio."""

    item_id: str


class ConversationItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    """Cut an assistant item's audio (and transcript) to what the user heard."""

    item_id: str
    content_index: Annotated[int, Meta(ge=0)]
    audio_end_ms: Annotated[int, Meta(ge=0)]


class ConversationItemDelete(ClientEvent, tag="conversation.item.delete"):
    """Remove an item."""

    item_id: str


class ResponseCreate(ClientEvent, tag="response.create"):
    """Start a response, with optional per-response overrides."""

    response: dict[str, Any] | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    """Cancel the response in progress (or the one named)."""

    response_id: str | None = None


class OutputAudioBufferClear(ClientEvent, tag="output_audio_buffer.clear"):
    """WebRTC/SIP: drop reply audio not yet played."""


AnyClientEvent = (
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemRetrieve
    | ConversationItemTruncate
    | ConversationItemDelete
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear
)

# Each event class's ``type``, looked up once rather than through ``__struct_config__``.
EVENT_TYPE: dict[type[ClientEvent], str] = {
    t: str(t.__struct_config__.tag) for t in AnyClientEvent.__args__
}
CLIENT_EVENT_TYPES: tuple[str, ...] = tuple(EVENT_TYPE.values())

_decoder = msgspec.json.Decoder(AnyClientEvent)


class DecodeError(ProtocolError):
    """A client event that could not be decoded; carries the client's event_id if readable."""

    def __init__(self, error: ProtocolError, event_id: str | None) -> None:
        super().__init__(error.message, error.param, error.code, error.type)
        self.event_id = event_id


def decode_client_event(data: str | bytes) -> AnyClientEvent:
    """Decode one client event. Raises DecodeError with OpenAI's code, message and param."""
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        first_error: msgspec.ValidationError = exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _unparsable(exc) from None
    # The fast path failed: look at the raw object to explain what is wrong. The typed
    # decoder stops at the first wrong value, so malformed JSON after it shows only here.
    try:
        raw = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _unparsable(exc) from None
    if not isinstance(raw, dict):
        raise DecodeError(
            ProtocolError("The event must be a JSON object.", code="invalid_event"), None
        )
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    if kind is None:
        error = ProtocolError("The 'type' field is missing.", code="invalid_event")
    elif not isinstance(kind, str):
        error = ProtocolError("The 'type' field must be a string.", "type", "invalid_type")
    elif kind not in CLIENT_EVENT_TYPES:
        error = ProtocolError(
            f"Invalid value: '{kind[:100]}'. Supported values are: "
            + ", ".join(f"'{t}'" for t in CLIENT_EVENT_TYPES)
            + ".",
            param="type",
            code="invalid_value",
        )
    elif kind == "input_audio_buffer.append" and str(first_error).endswith("`$.audio`"):
        error = _audio_error(str(first_error))
    else:
        error = from_validation_error(first_error, None)
    raise DecodeError(error, event_id)


def _unparsable(exc: Exception) -> DecodeError:
    """An event that is not JSON the server can read (also JSON nested deeper than the
    decoder recurses: msgspec raises ``RecursionError`` for it)."""
    reason = (
        "it is nested too deeply" if isinstance(exc, RecursionError) else "it is not valid JSON"
    )
    return DecodeError(
        ProtocolError(f"The server could not parse the event: {reason}.", code="invalid_json"),
        None,
    )


def _audio_error(message: str) -> ProtocolError:
    """An append's ``audio`` is decoded as bytes: word its errors for base64 text."""
    if message.startswith("Expected"):
        return ProtocolError(
            "Invalid type for 'audio': expected a string of base64-encoded audio.",
            "audio",
            "invalid_type",
        )
    return ProtocolError(
        "Invalid 'audio': expected base64-encoded audio.", "audio", "invalid_value"
    )
