"""Items from the client: ``conversation.item.create``, ``.truncate`` and ``.delete``, and
``response.create``'s ``input``, turned into conversation entries."""

from __future__ import annotations

import binascii
from typing import Any

import msgspec

from hark.audio.formats import decode_audio, format_rate
from hark.protocol import items as wire
from hark.protocol import server_events as se
from hark.protocol.errors import ProtocolError, from_validation_error
from hark.protocol.limits import MiB
from hark.protocol.session_config import AudioFormat
from hark.session.context import SessionContext, SessionPart
from hark.session.conversation import AudioSegment, Entry, Part, truncate_part
from hark.session.ids import IdGenerator
from hark.session.mcp_tools import McpTools
from hark.session.recognition import Recognition
from hark.session.response_lifecycle import ResponseLifecycle

# The most that items a client creates (``conversation.item.create``) may hold together, as
# their JSON: far more text than any model reads, and a bound on what a client can make a
# session keep (each event may carry 15 MiB, for an hour). Deleting items frees room.
MAX_CLIENT_ITEMS_BYTES = 64 * MiB


def entry_from_wire(
    item: wire.Item,
    param: str,
    ids: IdGenerator,
    input_format: AudioFormat,
    output_format: AudioFormat,
    takes_images: bool = True,
) -> tuple[Entry, list[Part]]:
    """Build an entry from a client item (``param``: where it is in the event, for errors);
    returns the entry and its audio parts that need recognition. Audio is in the session's
    formats. Raises ``ProtocolError`` for content the item cannot hold, images among it when
    the model reads none (``takes_images`` False)."""
    item_id = item.id or ids.new("item")
    if isinstance(item, wire.McpItem):
        return Entry(id=item_id, type="mcp", mcp=item), []
    if isinstance(item, wire.FunctionCallItem):
        entry = Entry(
            id=item_id,
            type="function_call",
            name=item.name,
            arguments=item.arguments,
            call_id=item.call_id or ids.new("call"),
        )
        return entry, []
    if isinstance(item, wire.FunctionCallOutputItem):
        entry = Entry(
            id=item_id, type="function_call_output", call_id=item.call_id, output=item.output
        )
        return entry, []
    parts: list[Part] = []
    recognise: list[Part] = []
    allowed = wire.ALLOWED_PARTS[item.role]
    for index, content in enumerate(item.content):
        where = f"{param}.content[{index}]"
        if not isinstance(content, allowed):
            raise ProtocolError(
                f"Content type '{content.__struct_config__.tag}' is not allowed "
                f"in a {item.role} message.",
                f"{where}.type",
            )
        if isinstance(content, wire.InputImage):
            _check_image(content, where, takes_images)
        parts.append(_part_from_wire(content, where, recognise, input_format, output_format))
    return Entry(id=item_id, type="message", role=item.role, parts=parts), recognise


def _check_image(image: wire.InputImage, where: str, takes_images: bool) -> None:
    # Refused here rather than failing the response: an image the model cannot read would
    # stay in the conversation and fail every response after it.
    if not takes_images:
        raise ProtocolError(
            "This server's language model takes no images (it reads text only): describe the "
            "image in text, or run hark with an OpenAI-compatible vision model (--llm-url).",
            f"{where}.type",
            "invalid_value",
        )
    if not (image.image_url or "").startswith("data:image/"):
        raise ProtocolError(
            "Invalid 'image_url': expected the image as a data URL, "
            "e.g. data:image/png;base64,iVBORw0KGgo...",
            f"{where}.image_url",
            "invalid_value",
        )


def _part_from_wire(
    content: wire.ContentPart,
    where: str,
    recognise: list[Part],
    input_format: AudioFormat,
    output_format: AudioFormat,
) -> Part:
    if isinstance(content, wire.InputText):
        return Part("input_text", text=content.text)
    if isinstance(content, wire.OutputText):
        return Part("output_text", text=content.text)
    if isinstance(content, wire.InputImage):
        return Part("input_image", image_url=content.image_url, detail=content.detail)
    is_input = isinstance(content, wire.InputAudio)
    fmt = input_format if is_input else output_format
    part = Part(
        "input_audio" if is_input else "output_audio",
        transcript=content.transcript,
        audio_format=fmt,
        rate=format_rate(fmt),
    )
    if content.audio:
        try:
            data = binascii.a2b_base64(content.audio, strict_mode=True)
        except (binascii.Error, ValueError):
            raise ProtocolError(
                "Invalid 'audio': expected base64-encoded audio.", f"{where}.audio"
            ) from None
        part.audio = decode_audio(fmt, data, f"{where}.audio")
    if is_input:
        part.heard = content.transcript
        if part.heard is None:
            if part.audio is None or not len(part.audio):
                part.heard = ""
            else:
                recognise.append(part)
    elif part.audio is not None:
        part.segments = [AudioSegment(0, len(part.audio), content.transcript or "")]
    return part


class ClientItems(SessionPart):
    """The conversation as the client edits it: ``conversation.item.create``, ``.truncate``
    and ``.delete``, and the items of ``response.create``'s ``input``.

    ``context`` holds the session's outbox, ids, conversation and configuration: items carry
    audio in its formats. Items with images are refused when the LLM does not read them
    (``takes_images``), a truncation of audio older than ``audio_retention_ms`` too, saying so.
    """

    def __init__(
        self,
        context: SessionContext,
        *,
        recognition: Recognition,
        responses: ResponseLifecycle,
        mcp: McpTools,
    ) -> None:
        super().__init__(context)
        self._recognition = recognition
        self._responses = responses
        self._mcp = mcp
        # The size of each item the client created that is still in the conversation.
        self._sizes: dict[str, int] = {}
        self._bytes = 0

    def create(self, raw: dict[str, Any], previous_item_id: str | None) -> None:
        """Add the item ``raw`` after ``previous_item_id``. Raises ``ProtocolError`` for an
        item that cannot be added."""
        try:
            item = msgspec.convert(raw, wire.Item)
        except msgspec.ValidationError as exc:
            raise from_validation_error(exc, "item") from None
        if isinstance(item, wire.McpApprovalResponseItem):
            self._mcp.check_response(item, "item")
        size = len(msgspec.json.encode(raw))
        if self._bytes + size > MAX_CLIENT_ITEMS_BYTES:
            raise ProtocolError(
                f"The conversation's items created by the client hold "
                f"{self._bytes} bytes; this one ({size} bytes) would pass the "
                f"{MAX_CLIENT_ITEMS_BYTES // MiB} MiB they may hold. Delete items to make room.",
                "item",
                "conversation_full",
            )
        entry, recognise = self._entry(item, "item")
        if entry.id in self._conversation:
            raise ProtocolError(
                f"Item with id {entry.id[:100]} already exists.", "item.id", "duplicate_item_id"
            )
        previous = self._conversation.insert(entry, previous_item_id)
        self._sizes[entry.id] = size
        self._bytes += size
        self._outbox.emit(se.ConversationItemAdded(previous_item_id=previous, item=entry.to_wire()))
        self._outbox.emit(se.ConversationItemDone(previous_item_id=previous, item=entry.to_wire()))
        for part in recognise:
            if self._recognition.recognise(entry, part):
                self._responses.resume_waiting()
        if isinstance(item, wire.McpApprovalResponseItem):
            self._responses.run_approved()
        self._responses.limit_audio()
        self._responses.prefill()

    def _entry(self, item: wire.Item, param: str) -> tuple[Entry, list[Part]]:
        audio = self._context.config.audio
        return entry_from_wire(
            item,
            param,
            self._ids,
            audio.input.format,
            audio.output.format,
            takes_images=self._context.takes_images,
        )

    def response_inputs(self, items: list[wire.ResponseInputItem]) -> list[Entry]:
        """The entries a response reads for its ``input``; their audio is sent to be heard."""
        entries: list[Entry] = []
        # Recognition starts once every item is read: an invalid one refuses the response.
        to_recognise: list[tuple[Entry, Part]] = []
        for index, item in enumerate(items):
            if isinstance(item, wire.ItemReference):
                entries.append(self._conversation.get(item.id, f"response.input[{index}].id"))
            else:
                entry, recognise = self._entry(item, f"response.input[{index}]")
                to_recognise += [(entry, part) for part in recognise]
                entries.append(entry)
        for entry, part in to_recognise:
            if self._recognition.recognise(entry, part):
                self._responses.resume_waiting()
        return entries

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        """Cut an assistant message's audio at ``audio_end_ms`` (what the user heard); a
        response still making it is cancelled."""
        entry = self._conversation.get(item_id)
        if entry.type != "message" or entry.role != "assistant":
            raise ProtocolError(
                "Only assistant messages with audio can be truncated.", "item_id", "invalid_value"
            )
        if content_index >= len(entry.parts) or entry.parts[content_index].type != "output_audio":
            raise ProtocolError(
                f"Content index {content_index} of item {item_id} is not audio.",
                "content_index",
                "invalid_value",
            )
        part = entry.parts[content_index]
        if part.audio_dropped:
            raise ProtocolError(
                f"The audio of item {item_id} is no longer kept: a session keeps only its last "
                f"{self._context.audio_retention_ms / 1000:g} seconds of audio, "
                "and this item is older.",
                "item_id",
                "invalid_value",
            )
        duration = part.duration_ms()
        if part.audio is None or audio_end_ms > duration:
            raise ProtocolError(
                f"Audio content of {duration}ms is already shorter than {audio_end_ms}ms.",
                "audio_end_ms",
                "invalid_value",
            )
        owner = self._responses.owner(entry)
        if owner is not None:
            self._responses.end_response(
                owner, "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
            )
        truncate_part(part, audio_end_ms)
        self._outbox.emit(
            se.ConversationItemTruncated(
                item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms
            )
        )
        self._responses.prefill()

    def delete(self, item_id: str) -> None:
        """Remove an item no response in progress is making."""
        entry = self._conversation.get(item_id)
        if self._responses.owner(entry) is not None:
            raise ProtocolError(
                "Cannot delete an item while its response is in progress.",
                "item_id",
                "invalid_value",
            )
        self._conversation.delete(item_id)
        self._bytes -= self._sizes.pop(item_id, 0)
        self._outbox.emit(se.ConversationItemDeleted(item_id=item_id))
        self._responses.prefill()
