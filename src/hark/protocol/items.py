"""Conversation items (GA shapes) as they travel on the wire."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType


class _Part(Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="type", kw_only=True):
    """Base of content parts."""


class InputText(_Part, tag="input_text"):
    """Text the user (or system) wrote."""

    text: str


class InputAudio(_Part, tag="input_audio", omit_defaults=False):
    """Audio the user spoke; ``audio`` is base64 in the session's input format.

    As OpenAI sends it, ``transcript`` is always there (``null`` until it is known) and
    ``audio`` only when asked for (``conversation.item.retrieve``).
    """

    audio: str | UnsetType | None = UNSET
    transcript: str | None = None

    def __post_init__(self) -> None:
        if self.audio is None:
            self.audio = UNSET


class InputImage(_Part, tag="input_image"):
    """An image, as a data URL: sent to an LLM that reads images; refused by a text-only one."""

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


class McpTool(Struct, forbid_unknown_fields=True, kw_only=True):
    """A tool an MCP server offers.

    A tool without a description has ``""``, never ``null``: the JS agents SDK's schema of
    a listing requires a string, and reads an event that breaks it as an unknown one (the
    Python SDK's types allow either).
    """

    name: str
    input_schema: Any
    description: str | None = ""
    annotations: Any = None

    def __post_init__(self) -> None:
        if self.description is None:
            self.description = ""


class McpListToolsItem(_Item, tag="mcp_list_tools"):
    """The tools an MCP server listed."""

    server_label: str
    tools: list[McpTool]
    id: str | None = None


class McpCallError(Struct, kw_only=True):
    """Why an MCP call failed (protocol, tool execution or HTTP error)."""

    type: str
    message: str
    code: int | None = None


class _McpInvocation(_Item):
    # Positional, as the items' own fields are, so that each keeps OpenAI's order.
    server_label: str
    name: str
    arguments: str
    id: str | None = None


class McpCallItem(_McpInvocation, tag="mcp_call"):
    """A call of a tool on an MCP server, with its output or error."""

    approval_request_id: str | None = None
    output: str | None = None
    error: McpCallError | None = None


class McpApprovalRequestItem(_McpInvocation, tag="mcp_approval_request"):
    """A request for the user's approval of an MCP call."""


class McpApprovalResponseItem(_Item, tag="mcp_approval_response"):
    """The user's answer to an approval request."""

    approval_request_id: str
    approve: bool
    id: str | None = None
    reason: str | None = None


McpItem = McpListToolsItem | McpCallItem | McpApprovalRequestItem | McpApprovalResponseItem
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | McpItem


class ItemReference(Struct, forbid_unknown_fields=True, tag="item_reference", tag_field="type"):
    """A reference to an existing conversation item, in ``response.input``."""

    id: str


ResponseInputItem = Item | ItemReference

ALLOWED_PARTS: dict[str, tuple[type[_Part], ...]] = {
    "system": (InputText,),
    "user": (InputText, InputAudio, InputImage),
    "assistant": (OutputText, OutputAudio),
}
