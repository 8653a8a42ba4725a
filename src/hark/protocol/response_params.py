"""Per-response overrides of ``response.create``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from hark.protocol.errors import ProtocolError, from_validation_error
from hark.protocol.items import ResponseInputItem
from hark.protocol.prompts import PromptReference
from hark.protocol.session_config import (
    AudioFormat,
    ConfigStruct,
    FunctionToolDef,
    MaxOutputTokens,
    McpToolDef,
    Reasoning,
    ToolChoiceConfig,
    ToolDef,
    VoiceId,
    _check_mcp_tools,
    check_voice,
    with_prompt,
)


class ResponseAudioOutput(ConfigStruct):
    """Audio overrides for one response."""

    format: AudioFormat | None = None
    voice: str | VoiceId | None = None
    speed: Annotated[float, Meta(ge=0.25, le=1.5)] | None = None


class ResponseAudio(ConfigStruct):
    """Wrapper matching the GA shape ``audio.output``."""

    output: ResponseAudioOutput | None = None


class ResponseParams(ConfigStruct):
    """The ``response`` object of ``response.create``; unset fields follow the session."""

    conversation: str = "auto"
    input: list[ResponseInputItem] | None = None
    instructions: str | None = None
    # Function tools and MCP servers for this response only, instead of the session's.
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoiceConfig | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None
    max_output_tokens: MaxOutputTokens | None = None
    audio: ResponseAudio | None = None
    metadata: dict[str, str] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    # Its fields are applied when the response is created: instructions, voice, and its
    # tools (with the response's own) as the response's tools, MCP servers included.
    prompt: PromptReference | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None


def parse_response_params(data: dict[str, Any] | None) -> ResponseParams:
    """Validate ``response.create``'s ``response`` object; errors name ``response.…``.
    A ``prompt`` that cannot be resolved refuses the response."""
    if data and data.get("prompt") is not None:
        refused: list[ProtocolError] = []
        data = with_prompt(data, [], "response", refused)
        if refused:
            raise refused[0]
    try:
        params = msgspec.convert(data or {}, ResponseParams)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc, "response") from None
    if params.conversation not in ("auto", "none"):
        raise ProtocolError(
            f"Invalid value: '{params.conversation[:100]}'. "
            "Supported values are: 'auto' and 'none'.",
            param="response.conversation",
        )
    if params.output_modalities is not None and len(params.output_modalities) != 1:
        raise ProtocolError(
            "output_modalities must be exactly one of ['audio'] or ['text'].",
            param="response.output_modalities",
        )
    if params.metadata is not None and len(params.metadata) > 16:
        raise ProtocolError("metadata holds at most 16 keys.", param="response.metadata")
    if params.audio and params.audio.output and params.audio.output.voice is not None:
        check_voice(params.audio.output.voice, "response.audio.output.voice")
    if params.tools is not None:
        _check_tools(params.tools)
    return params


def _check_tools(tools: list[ToolDef]) -> None:
    """A response's tools as a session's are checked (unique names and labels, an MCP
    server reached by an http(s) ``server_url``). A server named by ``connector_id`` or
    ``tunnel_id`` refuses the response: hark has neither, and a response is one request, so
    nothing else of it is lost, unlike a session update, which sets such a server aside."""
    names = [t.name for t in tools if isinstance(t, FunctionToolDef)]
    if len(set(names)) != len(names):
        raise ProtocolError("Tool names must be unique.", param="response.tools")
    _check_mcp_tools(tools, "response.tools")
    for index, tool in enumerate(tools):
        if not isinstance(tool, McpToolDef):
            continue
        for name in ("connector_id", "tunnel_id"):
            if getattr(tool, name) is not None:
                raise ProtocolError(
                    f"'{name}' is not supported: hark has no connectors or tunnels; give the "
                    f"MCP server '{tool.server_label}' by its 'server_url'.",
                    param=f"response.tools[{index}].{name}",
                    code="unsupported_parameter",
                )
