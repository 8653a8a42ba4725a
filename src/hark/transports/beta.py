"""The beta dialect (``OpenAI-Beta: realtime=v1``), translated to GA and back at the edge.

Clients written for the preview speak the same protocol with other names: a flat session
(``modalities``, ``voice``, ``input_audio_format: "pcm16"``…), ``response.audio.delta`` for
``response.output_audio.delta``, ``conversation.item.created`` for ``conversation.item.added``,
assistant content ``text``/``audio`` for ``output_text``/``output_audio``. The core speaks GA
only; a ``DialectSession`` wraps it for one connection and translates each client text in and
each server text out. The older ``transcription_session.update`` is translated here on every
connection (GA clients for transcription still send it), so the core has no beta branch.

Translation works on the JSON text. Appends (base64 has no ``.``) and the audio and text
deltas (a rename of their leading ``type``) cost no parse; events that carry sessions, items
or responses are decoded, rewritten and encoded again.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from hark.protocol.errors import ProtocolError, from_validation_error
from hark.protocol.session_config import SessionConfig, parse_session_config
from hark.transports.websocket import RealtimeSession

BETA_HEADER = "OpenAI-Beta"
BETA_HEADER_VALUE = "realtime=v1"
# Browsers cannot set headers on a WebSocket: they offer this subprotocol instead.
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"

FlatFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]
_FORMATS: dict[str, dict[str, Any]] = {
    "pcm16": {"type": "audio/pcm", "rate": 24000},
    "g711_ulaw": {"type": "audio/pcmu"},
    "g711_alaw": {"type": "audio/pcma"},
}
_FORMAT_NAMES = {fmt["type"]: name for name, fmt in _FORMATS.items()}

# Where the GA session keeps each flat field.
_SESSION_PLACES: dict[str, tuple[str, ...]] = {
    "modalities": ("output_modalities",),
    "voice": ("audio", "output", "voice"),
    "speed": ("audio", "output", "speed"),
    "input_audio_format": ("audio", "input", "format"),
    "output_audio_format": ("audio", "output", "format"),
    "input_audio_transcription": ("audio", "input", "transcription"),
    "input_audio_noise_reduction": ("audio", "input", "noise_reduction"),
    "turn_detection": ("audio", "input", "turn_detection"),
    "max_response_output_tokens": ("max_output_tokens",),
}
# The same for ``response.create``'s ``response``.
_RESPONSE_PLACES: dict[str, tuple[str, ...]] = {
    "modalities": ("output_modalities",),
    "voice": ("audio", "output", "voice"),
    "output_audio_format": ("audio", "output", "format"),
    "max_response_output_tokens": ("max_output_tokens",),
}
# A GA parameter (longest first, so ``audio.output.format`` wins over ``audio``) and its beta
# name, for errors the core reports.
_PARAM_NAMES: list[tuple[str, str]] = sorted(
    [
        *((".".join(("session", *ga)), f"session.{flat}") for flat, ga in _SESSION_PLACES.items()),
        *((".".join(("response", *ga)), f"response.{f}") for f, ga in _RESPONSE_PLACES.items()),
    ],
    key=lambda pair: -len(pair[0]),
)

# GA names of server events with the beta name they had, renamed without a parse.
_RENAMED = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
_RENAMED_PREFIX = {f'{{"type":"{ga}"': f'{{"type":"{beta}"' for ga, beta in _RENAMED.items()}
# The server events the beta API had; GA-only ones (``conversation.item.done``, MCP, the idle
# timeout…) are dropped, hark's own (``hark.*``, asked for by name) kept.
_BETA_SERVER_EVENTS = frozenset(
    {
        "error",
        "session.created",
        "session.updated",
        "transcription_session.updated",
        "conversation.created",
        "conversation.item.created",
        "conversation.item.retrieved",
        "conversation.item.truncated",
        "conversation.item.deleted",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.failed",
        "input_audio_buffer.committed",
        "input_audio_buffer.cleared",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "output_audio_buffer.started",
        "output_audio_buffer.stopped",
        "output_audio_buffer.cleared",
        "response.created",
        "response.done",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "rate_limits.updated",
        *_RENAMED.values(),
    }
)
_ASSISTANT_CONTENT_IN = {"text": "output_text", "audio": "output_audio"}
_ASSISTANT_CONTENT_OUT = {ga: beta for beta, ga in _ASSISTANT_CONTENT_IN.items()}
# Substrings of the client events the beta dialect rewrites; base64 audio has none of them.
_REWRITTEN_IN = ("session.update", "response.create", "conversation.item.create")
_ALIAS = "transcription_session.update"
# Updates and rejected events waiting for their answer. The core answers each at once, so
# only a client writing to a session that has ended (and answers nothing) reaches this; then
# the oldest are forgotten.
MAX_WAITING = 256


class FlatSession(Struct, forbid_unknown_fields=True, kw_only=True):
    """The preview's flat realtime session (``session.update``, ``POST
    /v1/realtime/sessions``). Only the names are checked here: values are checked by the core
    in their GA places, and its errors named back in these terms."""

    model: Any = UNSET
    modalities: list[Literal["text", "audio"]] | UnsetType = UNSET
    instructions: Any = UNSET
    voice: Any = UNSET
    speed: Any = UNSET
    input_audio_format: FlatFormat | UnsetType = UNSET
    output_audio_format: FlatFormat | UnsetType = UNSET
    input_audio_transcription: dict[str, Any] | UnsetType | None = UNSET
    input_audio_noise_reduction: dict[str, Any] | UnsetType | None = UNSET
    turn_detection: dict[str, Any] | UnsetType | None = UNSET
    tools: Any = UNSET
    tool_choice: Any = UNSET
    temperature: Any = UNSET
    max_response_output_tokens: Any = UNSET
    tracing: Any = UNSET
    include: Any = UNSET


class FlatTranscriptionSession(Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``session`` of ``transcription_session.update`` (and of ``POST
    /v1/realtime/transcription_sessions``)."""

    input_audio_format: FlatFormat | UnsetType = UNSET
    input_audio_transcription: dict[str, Any] | UnsetType | None = UNSET
    input_audio_noise_reduction: dict[str, Any] | UnsetType | None = UNSET
    turn_detection: dict[str, Any] | UnsetType | None = UNSET
    include: list[Any] | UnsetType | None = UNSET
    # Accepted as the preview did: a transcription session never produces output.
    modalities: list[Literal["text", "audio"]] | UnsetType = UNSET


_TRANSCRIPTION_FIELDS = tuple(FlatTranscriptionSession.__struct_fields__)


def is_beta(headers: Mapping[str, str]) -> bool:
    """Whether a WebSocket upgrade asks for the beta dialect: ``OpenAI-Beta: realtime=v1``, or
    (from a browser) the ``openai-beta.realtime-v1`` subprotocol."""
    values = headers.get(BETA_HEADER, "").lower().split(",")
    if any(value.strip() == BETA_HEADER_VALUE for value in values):
        return True
    offered = headers.get("Sec-WebSocket-Protocol", "").split(",")
    return any(protocol.strip() == BETA_SUBPROTOCOL for protocol in offered)


# ------------------------------------------------------------------ sessions, both ways


def ga_session_update(session: object, *, transcription: bool = False) -> dict[str, Any]:
    """A flat (beta) session as a GA ``session`` object; ``transcription``: the flat session of
    ``transcription_session.update``, as a GA transcription session. Raises ProtocolError
    naming the flat parameter when a name or format is not the preview's."""
    shape = FlatTranscriptionSession if transcription else FlatSession
    try:
        flat = msgspec.convert(session, shape)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc, "session") from None
    update: dict[str, Any] = {"type": "transcription"} if transcription else {}
    for name in flat.__struct_fields__:
        value = getattr(flat, name)
        if value is UNSET or (transcription and name == "modalities"):
            continue
        if name in ("input_audio_format", "output_audio_format"):
            value = _FORMATS[value]
        elif name == "modalities":
            # Beta's ["audio", "text"] is GA's ["audio"]: the transcript comes with the audio.
            value = ["audio"] if "audio" in value else ["text"]
        elif name == "turn_detection" and value is not None and "type" not in value:
            # The preview's turn_detection was untagged: server VAD unless it said otherwise.
            value = {**value, "type": "server_vad"}
        _put(update, _SESSION_PLACES.get(name, (name,)), value)
    return update


def parse_flat_session(session: object, *, transcription: bool = False) -> SessionConfig:
    """A flat session (the body of ``POST /v1/realtime/sessions`` or ``…/transcription_sessions``)
    as a GA config over the defaults; errors name the flat parameters."""
    update = ga_session_update(session, transcription=transcription)
    try:
        return parse_session_config(update)
    except ProtocolError as exc:
        raise beta_error(exc) from None


def flat_session(ga: Mapping[str, Any]) -> dict[str, Any]:
    """A GA session object (``session.created``'s) in the preview's flat shape: realtime, or
    transcription for a transcription session."""
    audio = ga.get("audio") or {}
    audio_in = audio.get("input") or {}
    head = {key: ga[key] for key in ("id", "object", "expires_at") if key in ga}
    flat_in = {
        "input_audio_format": _FORMAT_NAMES.get((audio_in.get("format") or {}).get("type")),
        "input_audio_transcription": _only(
            audio_in.get("transcription"), ("model", "language", "prompt")
        ),
        "input_audio_noise_reduction": _only(audio_in.get("noise_reduction"), ("type",)),
        "turn_detection": audio_in.get("turn_detection"),
    }
    if ga.get("type") == "transcription":
        return {**head, "modalities": ["text"], **flat_in, "include": ga.get("include")}
    audio_out = audio.get("output") or {}
    return {
        **head,
        "model": ga.get("model"),
        "modalities": _modalities(ga.get("output_modalities")),
        "instructions": ga.get("instructions"),
        "voice": audio_out.get("voice"),
        "speed": audio_out.get("speed"),
        "output_audio_format": _FORMAT_NAMES.get((audio_out.get("format") or {}).get("type")),
        **flat_in,
        "tools": ga.get("tools"),
        "tool_choice": ga.get("tool_choice"),
        "temperature": ga.get("temperature"),
        "max_response_output_tokens": ga.get("max_output_tokens"),
        "tracing": ga.get("tracing"),
    }


def beta_error(error: ProtocolError) -> ProtocolError:
    """``error`` with the GA parameter it names (and its message) in beta terms, where the two
    differ."""
    param = error.param or ""
    for ga, beta in _PARAM_NAMES:
        if param == ga or param.startswith((f"{ga}.", f"{ga}[")):
            renamed = beta + param[len(ga) :]
            return ProtocolError(
                error.message.replace(param, renamed), renamed, error.code, error.type
            )
    return error


def _put(target: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


def _only(settings: Mapping[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The settings the beta had, of a GA object (which has more)."""
    return None if settings is None else {key: settings.get(key) for key in keys}


def _modalities(output: object) -> list[str]:
    return ["text"] if output == ["text"] else ["audio", "text"]


# ------------------------------------------------------------------ items and responses


def _item_in(item: object) -> object:
    """A client's beta item with the GA content types of an assistant message."""
    if not isinstance(item, dict) or item.get("role") != "assistant":
        return item
    content = item.get("content")
    if not isinstance(content, list):
        return item
    parts = [
        {**part, "type": _ASSISTANT_CONTENT_IN[part["type"]]}
        if isinstance(part, dict) and part.get("type") in _ASSISTANT_CONTENT_IN
        else part
        for part in content
    ]
    return {**item, "content": parts}


def _part_out(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") in _ASSISTANT_CONTENT_OUT:
        return {**part, "type": _ASSISTANT_CONTENT_OUT[part["type"]]}
    return part


def _item_out(item: Any) -> Any:
    if isinstance(item, dict) and isinstance(item.get("content"), list):
        return {**item, "content": [_part_out(part) for part in item["content"]]}
    return item


def _response_in(response: object) -> object:
    if not isinstance(response, dict):
        return response
    out: dict[str, Any] = {}
    for name, value in response.items():
        if name == "modalities" and isinstance(value, list):
            value = ["audio"] if "audio" in value else ["text"]
        elif name == "output_audio_format" and value in _FORMATS:
            value = _FORMATS[value]
        elif name == "input" and isinstance(value, list):
            value = [_item_in(item) for item in value]
        _put(out, _RESPONSE_PLACES.get(name, (name,)), value)
    return out


def _response_out(response: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in response.items() if k not in ("output_modalities", "audio")}
    audio_out = (response.get("audio") or {}).get("output") or {}
    out["modalities"] = _modalities(response.get("output_modalities"))
    out["voice"] = audio_out.get("voice")
    out["output_audio_format"] = _FORMAT_NAMES.get((audio_out.get("format") or {}).get("type"))
    out["output"] = [_item_out(item) for item in response.get("output") or []]
    return out


# ------------------------------------------------------------------ one connection


@dataclass(frozen=True)
class _Update:
    """A session update on its way through the core: the ``event_id`` it carries there, the
    client's own, and whether it came as ``transcription_session.update``."""

    sent_id: str
    client_id: str | None
    alias: bool


_encode = msgspec.json.Encoder().encode
_ids = itertools.count(1)


class Dialect:
    """The translation for one connection, client texts in and server texts out.

    GA connections (``beta=False``) only translate ``transcription_session.update`` and its
    answer. Which ``session.updated`` answers which update follows from order: the core
    answers each ``session.update`` at once, with ``session.updated`` or an ``error`` echoing
    its ``event_id``; while an alias is on its way, every update is followed (with an
    ``event_id`` of hark's own where the client gave none). An event this module rejects
    reaches the core as one it will refuse, so that the error takes its place in order, and
    the core's error is replaced by this module's.
    """

    def __init__(self, *, beta: bool) -> None:
        self.beta = beta
        self._updates: deque[_Update] = deque(maxlen=MAX_WAITING)
        self._rejected: dict[str, tuple[ProtocolError, str | None]] = {}

    # -------------------------------------------------------------- client → core

    def incoming(self, text: str) -> str:
        """A client text as the core should see it."""
        if _ALIAS not in text and not (
            (self.beta or self._updates) and any(s in text for s in _REWRITTEN_IN)
        ):
            return text
        try:
            event = msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError):
            # The core explains what is wrong with it.
            return text
        if not isinstance(event, dict):
            return text
        kind = event.get("type")
        client_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        try:
            if kind == _ALIAS:
                session = ga_session_update(event.get("session"), transcription=True)
                return self._update(event, session, client_id, alias=True)
            if kind == "session.update":
                if self.beta:
                    session = ga_session_update(event.get("session"))
                    return self._update(event, session, client_id, alias=False)
                if self._updates:
                    return self._update(event, event.get("session"), client_id, alias=False)
            elif self.beta and kind == "response.create" and "response" in event:
                return _encode({**event, "response": _response_in(event["response"])}).decode()
            elif self.beta and kind == "conversation.item.create" and "item" in event:
                return _encode({**event, "item": _item_in(event["item"])}).decode()
        except ProtocolError as exc:
            marker = f"hark_rejected_{next(_ids)}"
            self._rejected[marker] = (exc, client_id)
            if len(self._rejected) > MAX_WAITING:
                del self._rejected[next(iter(self._rejected))]
            # A type the core refuses: its error comes back in order with this event_id.
            return _encode({"type": "hark.rejected", "event_id": marker}).decode()
        return text

    def _update(
        self, event: dict[str, Any], session: object, client_id: str | None, *, alias: bool
    ) -> str:
        sent_id = client_id if client_id is not None else f"hark_update_{next(_ids)}"
        self._updates.append(_Update(sent_id, client_id, alias))
        return _encode(
            {**event, "type": "session.update", "event_id": sent_id, "session": session}
        ).decode()

    # -------------------------------------------------------------- core → client

    def outgoing(self, text: str) -> list[str]:
        """A server text as the client should see it: none (dropped), one, or more."""
        if not self.beta:
            if not self._updates and not self._rejected:
                return [text]
            if not text.startswith(('{"type":"session.updated"', '{"type":"error"')):
                return [text]
        else:
            for ga, beta in _RENAMED_PREFIX.items():
                if text.startswith(ga):
                    return [beta + text[len(ga) :]]
        event = msgspec.json.decode(text)
        out = self._event_out(event)
        if out is None:
            return []
        if self.beta and out.get("type") == "session.created":
            if event["session"].get("type") == "transcription":
                # The preview announced a transcription session as such, with no conversation.
                return [_encode({**out, "type": "transcription_session.created"}).decode()]
            conversation = {"id": f"conv_{out['event_id']}", "object": "realtime.conversation"}
            created = {
                "type": "conversation.created",
                "event_id": f"{out['event_id']}_conversation",
                "conversation": conversation,
            }
            return [_encode(out).decode(), _encode(created).decode()]
        return [_encode(out).decode()]

    def _event_out(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("type")
        if kind == "error":
            return self._error_out(event)
        if kind == "session.updated":
            answered = self._updates.popleft() if self._updates else None
            if answered is not None and answered.alias:
                session = flat_session(event["session"])
                return {**event, "type": "transcription_session.updated", "session": session}
        if not self.beta:
            return event
        if kind in ("session.created", "session.updated"):
            return {**event, "session": flat_session(event["session"])}
        if kind == "conversation.item.added":
            return {**event, "type": "conversation.item.created", "item": _item_out(event["item"])}
        if kind in ("response.output_item.added", "response.output_item.done"):
            return {**event, "item": _item_out(event["item"])}
        if kind == "conversation.item.retrieved":
            return {**event, "item": _item_out(event["item"])}
        if kind in ("response.content_part.added", "response.content_part.done"):
            return {**event, "part": _part_out(event["part"])}
        if kind in ("response.created", "response.done"):
            return {**event, "response": _response_out(event["response"])}
        if kind in _BETA_SERVER_EVENTS or str(kind).startswith("hark."):
            return event
        return None

    def _error_out(self, event: dict[str, Any]) -> dict[str, Any]:
        detail = event["error"]
        sent_id = detail.get("event_id")
        rejected = self._rejected.pop(sent_id, None) if sent_id is not None else None
        if rejected is not None:
            error, client_id = rejected
        else:
            error = ProtocolError(
                detail["message"], detail["param"], detail["code"], detail["type"]
            )
            client_id = sent_id
            head = self._updates[0] if self._updates else None
            if head is not None and sent_id == head.sent_id:
                self._updates.popleft()
                client_id = head.client_id
                if not head.alias and not self.beta:
                    return {**event, "error": {**detail, "event_id": client_id}}
            elif not self.beta:
                return event
        renamed = beta_error(error)
        return {
            **event,
            "error": {
                "type": renamed.type,
                "code": renamed.code,
                "message": renamed.message,
                "param": renamed.param,
                "event_id": client_id,
            },
        }


class DialectSession:
    """A session (``RealtimeSession``) as a client of one dialect sees it."""

    def __init__(self, session: RealtimeSession, dialect: Dialect) -> None:
        self.session = session
        self.dialect = dialect
        # A server text ``send`` refused (it now waits in the session's queue) and what of
        # its translation is still to be written: translating it again would repeat the
        # dialect's bookkeeping.
        self._refused: tuple[str, list[str]] | None = None

    async def start(self) -> None:
        """Begin the session."""
        await self.session.start()

    def catch_up(self) -> None:
        """Hand out the engine results that are ready (see the session's)."""
        self.session.catch_up()

    def receive_text(self, text: str) -> None:
        """One client text frame, translated; never raises."""
        self.session.receive_text(self.dialect.incoming(text))

    def receive_bytes(self, data: bytes) -> None:
        """One client binary frame (not part of either dialect: the core answers)."""
        self.session.receive_bytes(data)

    async def outgoing(self) -> AsyncIterator[str]:
        """The session's server events, translated; ends when the session is over."""
        async for text in self.session.outgoing():
            for out in self._translate(text):
                yield out

    def send_with(
        self,
        send: Callable[[str], bool] | None,
        stalled: Callable[[str], None] | None = None,
    ) -> None:
        """Offer translated events to ``send`` as they are made, and tell ``stalled`` when the
        backlog passed its bound (see the session's)."""
        if send is None:
            self.session.send_with(None, stalled)
            return

        def translated(text: str) -> bool:
            outs = self.dialect.outgoing(text)
            for i, out in enumerate(outs):
                if not send(out):
                    self._refused = (text, outs[i:])
                    return False
            return True

        self.session.send_with(translated, stalled)

    async def close(self) -> None:
        """End the session; idempotent."""
        await self.session.close()

    def _translate(self, text: str) -> list[str]:
        refused = self._refused
        if refused is not None and refused[0] is text:
            self._refused = None
            return refused[1]
        return self.dialect.outgoing(text)


def in_dialect(session: RealtimeSession, headers: Mapping[str, str]) -> DialectSession:
    """``session`` for the client of a WebSocket upgrade with ``headers``."""
    return DialectSession(session, Dialect(beta=is_beta(headers)))
