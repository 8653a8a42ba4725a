"""ChatML prompts (``<|im_start|>role\\n...<|im_end|>\\n``), tools and tool results included.

The prompt is rendered by hand rather than through the GGUF's Jinja template so that a turn's
prompt is always the previous turn's prompt plus the new messages, token for token: that is
what lets llama.cpp reuse the KV cache of everything said before. The layout follows the
convention of ChatML models trained for tools (Qwen, Hermes): the tool list goes at the end of
the system message as JSON lines inside ``<tools>``, a call is
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` in the assistant turn, and tool
outputs go back in a user turn inside ``<tool_response>`` tags.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from hark.engines.llm import ChatMessage, FunctionTool

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# SmolLM2's own template adds this system message when a conversation has none.
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def is_chatml(template: str | None) -> bool:
    """Whether a GGUF ``tokenizer.chat_template`` is ChatML (the only layout rendered here)."""
    return template is not None and IM_START in template and IM_END in template


def tool_call_header(name: str) -> str:
    """The start of a call's JSON up to (not including) the space before its arguments."""
    return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments":'


def render_tool_call(name: str, arguments: str) -> str:
    """A ``<tool_call>`` block as the model writes it; ``arguments`` is kept byte for byte."""
    args = arguments.strip() or "{}"
    try:
        json.loads(args)
    except ValueError:
        # Keep the block valid JSON even when a caller hands back broken arguments.
        args = json.dumps(args, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{tool_call_header(name)} {args}}}\n{TOOL_CALL_CLOSE}"


def _tools_block(tools: Sequence[FunctionTool]) -> str:
    lines = []
    for tool in tools:
        function: dict[str, object] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        lines.append(json.dumps({"type": "function", "function": function}, ensure_ascii=False))
    return _TOOLS_PREAMBLE + "\n" + "\n".join(lines) + "\n" + _TOOLS_POSTAMBLE


def _turn(role: str, content: str) -> str:
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def render_chatml(
    messages: Sequence[ChatMessage],
    tools: Sequence[FunctionTool] = (),
    *,
    default_system: str = DEFAULT_SYSTEM_PROMPT,
    assistant_prefix: str = "",
) -> str:
    """The whole prompt, ending with an open assistant turn that starts with ``assistant_prefix``.

    ``tools`` (when given) are described at the end of the first system message, which is
    created from ``default_system`` if the conversation has none. Consecutive tool messages
    are grouped into one user turn, each output in its own ``<tool_response>`` block.
    """
    parts: list[str] = []
    rest = list(messages)
    system = default_system
    if rest and rest[0].role == "system":
        system = rest.pop(0).content
    if tools:
        system = f"{system}\n\n{_tools_block(tools)}" if system else _tools_block(tools)
    parts.append(_turn("system", system))

    responses: list[str] = []
    for message in rest:
        if message.role == "tool":
            responses.append(f"<tool_response>\n{message.content}\n</tool_response>")
            continue
        if responses:
            parts.append(_turn("user", "\n".join(responses)))
            responses = []
        if message.role == "assistant" and message.tool_calls:
            blocks = [render_tool_call(call.name, call.arguments) for call in message.tool_calls]
            content = "\n".join([message.content, *blocks] if message.content else blocks)
            parts.append(_turn("assistant", content))
        else:
            parts.append(_turn(message.role, message.content))
    if responses:
        parts.append(_turn("user", "\n".join(responses)))
    parts.append(f"{IM_START}assistant\n{assistant_prefix}")
    return "".join(parts)
