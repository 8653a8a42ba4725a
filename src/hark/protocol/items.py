"""Conversation items (GA shapes) as they travel on the wire."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct


class _Part(Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="type", kw_only=True):
    """Base of content parts."""


class InputText(_Part, tag="input_text"):
    """Text the user (or system) wrote."""

    text: str


class InputAudio(_Part, tag="input_audio"):
    """Audio the user spoke; ``audio`` is base64 in the session's input format."""

    audio: str | None = None
    transcript: str | None = None


class InputImage(_Part, tag="input_image"):
    """An image reference; accepted and described to the model by its presence only."""

    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class OutputText(_Part, tag="output_text"):
    """Text the assistant wrote."""

    text: str = ""


class OutputAudio(_Part, tag="output_audio"):
    """Audio the assistant spoke, with its transcript."""

    audio: str | None = None
    transcript: str | None = None


ContentPart = InputText | InputAudio | InputImage | OutputText | OutputAudio
ItemStatus = Literal["completed", "incomplete", "in_progress"]


class _Item(
    Struct, forbid_unknown_fields=True, omit_defaults=False, tag_field="type", kw_only=True
):
    """Base of items."""


class MessageItem(_Item, tag="message"):
    """A system, user or assistant message."""

    role: Literal["system", "user", "assistant"]
    content: list[ContentPart]
    id: str | None = None
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus | None = None


class FunctionCallItem(_Item, tag="function_call"):
    """A call of a function tool by the assistant."""

    name: str
    arguments: str = ""
    call_id: str | None = None
    id: str | None = None
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus | None = None


class FunctionCallOutputItem(_Item, tag="function_call_output"):
    """The application's result of a function call."""

    call_id: str
    output: str
    id: str | None = None
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus | None = None


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem


class ItemReference(Struct, forbid_unknown_fields=True, tag="item_reference", tag_field="type"):
    """A reference to an existing conversation item, in ``response.input``."""

    id: str


ResponseInputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ItemReference

ALLOWED_PARTS: dict[str, tuple[type[_Part], ...]] = {
    "system": (InputText,),
    "user": (InputText, InputAudio, InputImage),
    "assistant": (OutputText, OutputAudio),
}
