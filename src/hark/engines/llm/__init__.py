"""Language models: a chat conversation in, a stream of text deltas and tool calls out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the assistant made earlier in the conversation."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image the user showed: ``url`` is a data URL (``data:image/png;base64,…``)."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of the chat the LLM sees (OpenAI chat-completions roles). ``images`` come
    after ``content`` in a user message, for engines that take images (``ReadsImages``)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    images: tuple[ImagePart, ...] = ()


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """A function the model may call; ``parameters`` is a JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``mode`` is auto, none or required; ``function`` forces one function by name."""

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None


@dataclass(eq=False, slots=True)
class Urgency:
    """Whether anyone waits for a generation yet. Engines that share one model between
    sessions serve waited-for work first. A reply started while the end of the turn is still
    uncertain is ``speculative``; when the turn adopts it the mark is cleared, and the engine
    sees the change while it generates."""

    speculative: bool = False


@dataclass(frozen=True, slots=True)
class Truncation:
    """What to drop when the conversation outgrows the model's context (the session's
    ``truncation``; :mod:`hark.engines.llm.truncation` applies it). ``auto`` drops the oldest
    turns until the prompt fits; ``retention_ratio`` drops at once down to ``retention_ratio``
    of the tokens after the instructions (at most ``post_instructions_tokens`` when set), so
    that the kept beginning stays the same over the next turns; ``disabled`` fails instead."""

    mode: Literal["auto", "retention_ratio", "disabled"] = "auto"
    retention_ratio: float = 1.0
    post_instructions_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Everything an LLM needs for one response."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    max_tokens: int | None = None
    temperature: float | None = None
    truncation: Truncation = Truncation()
    # False: the model may call at most one tool per reply (the session drops any more).
    parallel_tool_calls: bool = True
    # For a reasoning model behind an OpenAI-compatible endpoint (``reasoning.effort``).
    reasoning_effort: str | None = None
    # Prefills only: the last message is the user's turn still being spoken (its words so
    # far), and the next generation's user message begins with them; read it left open.
    open_turn: bool = False
    # How the work is scheduled, not what is asked: requests for the same reply compare equal.
    urgency: Urgency = field(default_factory=Urgency, compare=False)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the assistant's reply text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """The model began a call of function ``name``; ``call_id`` names it."""

    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgumentsDelta:
    """A piece of the JSON arguments of call ``call_id``."""

    call_id: str
    delta: str


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """Call ``call_id`` is complete; ``arguments`` is its whole JSON text."""

    call_id: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The generation ended. ``reason`` is stop, length or tool_calls."""

    reason: Literal["stop", "length", "tool_calls"]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


LlmEvent = TextDelta | ToolCallStarted | ToolCallArgumentsDelta | ToolCallFinished | Finished


class LlmEngine(Protocol):
    """A streaming chat model."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[LlmEvent]:
        """Stream the reply. The last event is always ``Finished``; cancelling stops the work."""
        ...

    async def prefill(self, request: GenerationRequest) -> None:
        """Get ready for the next turn: ``request`` is the conversation so far, and the next
        generation will be it plus a new user message (with ``open_turn``, its last message
        is the beginning of that user message). Engines that keep a prompt cache read that
        shared beginning now, while the user is still speaking; others do nothing."""
        ...

    async def warmup(self) -> None:
        """Load the model (or check the endpoint) and run it once."""
        ...


@runtime_checkable
class ReadsImages(Protocol):
    """An LLM engine that says whether its model reads images."""

    takes_images: bool


def takes_images(llm: object) -> bool:
    """Whether ``llm`` may be sent images; engines that do not say take none."""
    return isinstance(llm, ReadsImages) and llm.takes_images


def shared_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many items ``a`` and ``b`` have in common from the start (tokens, characters)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
