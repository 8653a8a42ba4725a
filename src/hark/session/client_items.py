"""Items from the client: ``conversation.item.create`` and ``response.create``'s ``input``
turned into conversation entries."""

from __future__ import annotations

import binascii

from hark.audio.formats import decode_audio, format_rate
from hark.protocol import items as wire
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import AudioFormat
from hark.session.conversation import AudioSegment, Entry, Part
from hark.session.ids import IdGenerator


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
