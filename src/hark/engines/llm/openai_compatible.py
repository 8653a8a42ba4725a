"""Any OpenAI-compatible streaming chat-completions endpoint (vLLM, SGLang, llama.cpp, Ollama).

Requests go to ``{base_url}/chat/completions`` with ``stream: true`` and the usage chunk
requested; the server-sent events are mapped onto :mod:`hark.engines.llm` events. The API key
travels only in the ``Authorization`` header: it is never logged and is scrubbed from error
messages, in case a server echoes it back.

Conversations longer than the backend's context are truncated here, as the request's
``truncation`` says (:mod:`hark.engines.llm.truncation`), with an estimate of the tokens: the
backend's tokenizer is not at hand. The context size is ``context_tokens`` when given
(``--llm-context-tokens``), else the ``max_model_len`` that vLLM lists in ``GET /models``,
else the one a backend states when it refuses a prompt as too long. A refused prompt is
truncated harder and sent once more.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from yarl import URL

from hark.engines.llm import (
    ChatMessage,
    Finished,
    FunctionTool,
    GenerationRequest,
    ImagePart,
    LlmEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoice,
)
from hark.engines.llm.reply_length import SentenceCap, hard_ceiling
from hark.engines.llm.truncation import ContextOverflow, fit
from hark.engines.openai_http import (
    OpenAIEndpoint,
    endpoint_url,
    error_message,
    safe_url,
    sse_objects,
)

logger = logging.getLogger(__name__)

CONNECT_ATTEMPTS = 3
RETRY_BACKOFF_S = 0.25
_FINISH_REASONS: dict[str, Literal["stop", "length", "tool_calls"]] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


# What the prompt of a reply with no limit sent leaves free, at most (and at most a quarter of
# the context): the backend's default limit may be all that is left.
REPLY_RESERVE = 512
# An image's tokens, roughly, in the vision models vLLM serves (a few hundred to a thousand).
IMAGE_TOKENS = 800
# vLLM, llama-cpp-python and OpenAI say "maximum context length is N tokens ... (M in the
# messages"; llama.cpp's llama-server "request (M tokens) exceeds the available context size
# (N tokens)"; SGLang and others "context length" or "context window" in their own words.
_CONTEXT_ERROR = re.compile(r"context[ _](?:length|window|size)|maximum context", re.I)
_CONTEXT_SIZE = re.compile(r"maximum context length is (\d+)|context size \((\d+) tokens\)")
_REQUESTED = re.compile(r"(\d+) in the messages|request \((\d+) tokens\)")


class LlmError(Exception):
    """The endpoint failed: unreachable, an HTTP error (``status``), or a broken stream."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def context_exceeded(self) -> bool:
        """Whether the backend refused the prompt as longer than its context."""
        return self.status in (None, 400, 413) and bool(_CONTEXT_ERROR.search(str(self)))


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` without the backend's tokenizer: a token a digit (many tokenizers
    split numbers so) and one per three other bytes, more than common tokenizers take for
    English (about four)."""
    digits = sum(c.isdigit() for c in text)
    return digits + math.ceil((len(text.encode()) - digits) / 3)


class EstimatedTokens:
    """A ``TokenCounter`` by :func:`estimate_tokens`, each message's role markers and
    ``IMAGE_TOKENS`` an image, times ``scale`` (learnt from a backend's refusal that said how
    many tokens a prompt really took)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def message(self, message: ChatMessage) -> int:
        calls = "".join(c.name + c.arguments for c in message.tool_calls)
        tokens = estimate_tokens(message.content + calls) + 5 + 8 * len(message.tool_calls)
        return math.ceil(self.scale * (tokens + IMAGE_TOKENS * len(message.images)))

    def prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]) -> int:
        schema = estimate_tokens("".join(json.dumps(tool_to_openai(t)) for t in tools))
        return sum(self.message(m) for m in messages) + math.ceil(self.scale * schema) + 3


@dataclass(slots=True)
class _PendingCall:
    """A tool call being streamed, keyed by its ``index`` in the chunks."""

    call_id: str | None = None
    name: str | None = None
    arguments: str = ""
    started: bool = False
    finished: bool = False


def message_to_openai(message: ChatMessage) -> dict[str, Any]:
    """A chat message in the chat-completions wire format."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.images:
        # Chat-completions' content parts, which vision models (vLLM, Ollama, OpenAI) take.
        text = [{"type": "text", "text": message.content}] if message.content else []
        out["content"] = text + [
            {"type": "image_url", "image_url": _image_url(image)} for image in message.images
        ]
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    return out


def _image_url(image: ImagePart) -> dict[str, str]:
    url = {"url": image.url}
    if image.detail is not None:
        url["detail"] = image.detail
    return url


def tool_to_openai(tool: FunctionTool) -> dict[str, Any]:
    """A function tool in the chat-completions wire format."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def tool_choice_to_openai(choice: ToolChoice) -> str | dict[str, Any]:
    """``auto``/``none``/``required``, or the object that forces one function."""
    if choice.mode == "function":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


class OpenAICompatibleLlm(OpenAIEndpoint):
    """A remote chat model behind an OpenAI-compatible API; implements ``LlmEngine``.

    ``base_url`` includes the version prefix (``http://host:8000/v1``). ``temperature`` and
    ``max_tokens_default`` are sent when a request leaves them unset (``None``: the server's
    default). ``timeout_s`` bounds connecting and each wait for the next bytes of a stream.
    ``connect_attempts`` is how often a request tries to connect before it fails (one where
    another backend can take over, see :mod:`hark.engines.llm.failover`). ``context_tokens``
    is the backend's context size (None: learnt from the backend, see the module doc).
    A request with no ``max_tokens`` of its own ends at a sentence past
    ``max_tokens_default`` (see :mod:`hark.engines.llm.reply_length`) and is complete.
    Call :meth:`aclose` when done.

    Images in user messages are sent as ``image_url`` content parts: whether the model reads
    them is the backend's to say, and a text-only backend's refusal fails that response with
    the backend's message.
    """

    takes_images = True

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens_default: int | None = None,
        timeout_s: float = 60.0,
        connect_attempts: int = CONNECT_ATTEMPTS,
        context_tokens: int | None = None,
    ) -> None:
        super().__init__(
            "LLM",
            base_url,
            model=model,
            api_key=api_key,
            timeout_s=timeout_s,
            accept="application/json, text/event-stream",
        )
        self.temperature = temperature
        self.max_tokens_default = max_tokens_default
        self.connect_attempts = connect_attempts
        self.context_tokens = context_tokens
        self._models_read = context_tokens is not None
        self._counter = EstimatedTokens()

    async def prefill(self, request: GenerationRequest) -> None:
        """Nothing to do here: servers such as vLLM and SGLang cache shared prompt prefixes
        themselves when the next request arrives."""

    async def warmup(self) -> None:
        """Check that the endpoint answers (``GET /models``; a 404 is fine)."""
        await self.check()

    async def check(self, timeout_s: float | None = None) -> None:
        """Raise ``LlmError`` unless ``GET /models`` answers (a 404 is fine) within
        ``timeout_s`` (``None``: the engine's own timeouts)."""
        url = endpoint_url(self.base_url, "/models")
        http = self._endpoint.session()
        timeout = http.timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with http.get(url, headers=self._endpoint.headers(), timeout=timeout) as response:
                if response.status >= 400 and response.status != 404:
                    raise await self._http_error(response)
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise LlmError(self._endpoint.unreachable(url, exc)) from None
        if not self._models_read and response.status < 400:
            self._models_read = True
            self.context_tokens = _max_model_len(body, self.model)

    def payload(
        self, request: GenerationRequest, extra_body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The JSON body of the chat-completions request for ``request``, with the fields of
        ``extra_body`` (server-specific extensions) added."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [message_to_openai(m) for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        temperature = self.temperature if request.temperature is None else request.temperature
        if temperature is not None:
            body["temperature"] = temperature
        max_tokens = self._reply_limit(request)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if request.tools:
            body["tools"] = [tool_to_openai(t) for t in request.tools]
            body["tool_choice"] = tool_choice_to_openai(request.tool_choice)
            if not request.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        if request.reasoning_effort is not None:
            body["reasoning_effort"] = request.reasoning_effort
        return body | (extra_body or {})

    def reply_reserve(self, request: GenerationRequest, context: int) -> int:
        """The context a reply to ``request`` keeps free: the limit sent with it (at most half
        the context), or ``REPLY_RESERVE`` (at most a quarter) when the backend's applies."""
        limit = self._reply_limit(request)
        if limit is None:
            return min(REPLY_RESERVE, context // 4)
        return min(limit, context // 2)

    def _reply_limit(self, request: GenerationRequest) -> int | None:
        """The ``max_tokens`` sent with ``request``: the client's, else the hard ceiling of
        ``max_tokens_default`` (None: the backend's default applies)."""
        if request.max_tokens is None and self.max_tokens_default is not None:
            return hard_ceiling(self.max_tokens_default)
        return request.max_tokens

    def truncated(
        self, request: GenerationRequest, harder_than: int | None = None
    ) -> GenerationRequest:
        """``request`` with the messages that fit the backend's context (all of them while
        its size is unknown). ``harder_than``: the estimated size of a prompt the backend
        refused; the new one is a third smaller."""
        context = self.context_tokens
        if context is None and harder_than is None:
            return request
        budget = math.inf if context is None else context - self.reply_reserve(request, context)
        if harder_than is not None:
            budget = min(budget, harder_than * 2 // 3)
        messages = fit(
            request.messages, request.tools, self._counter, int(budget), request.truncation
        )
        return dataclasses.replace(request, messages=messages)

    async def generate(
        self, request: GenerationRequest, extra_body: dict[str, Any] | None = None
    ) -> AsyncGenerator[LlmEvent, None]:
        """Stream the reply; ``Finished`` comes last. Cancelling closes the connection.
        ``extra_body``: fields added to the request body (see :meth:`payload`).

        Raises ``ContextOverflow`` when the conversation cannot be made to fit the backend's
        context (truncation ``disabled``, or the instructions too long)."""
        if not self._models_read:
            # Once, for vLLM's max_model_len; an endpoint that does not answer fails below.
            try:
                await self.check()
            except LlmError:
                self._models_read = True
        sent = self.truncated(request)
        try:
            async for event in self._attempt(sent, extra_body):
                yield event
            return
        except LlmError as exc:
            if not exc.context_exceeded:
                raise
            logger.info("LLM endpoint %s: the prompt exceeds its context, truncating", self)
            refused = self._counter.prompt(sent.messages, sent.tools)
            harder_than = self._learn(str(exc), refused)
        try:
            retry = self.truncated(request, harder_than=harder_than)
        except ContextOverflow as overflow:
            raise ContextOverflow(f"{overflow} (the LLM endpoint refused the prompt)") from None
        async for event in self._attempt(retry, extra_body):
            yield event

    def _learn(self, refusal: str, estimated: int) -> int | None:
        """What a refusal says: the context size, and how many tokens the prompt (estimated at
        ``estimated``) really took, which corrects the estimate. Returns the estimate of the
        refused prompt when it said neither, so that the next is cut by a third."""
        stated = _CONTEXT_SIZE.search(refusal)
        if stated and self.context_tokens is None:
            self.context_tokens = int(stated.group(1) or stated.group(2))
        requested = _REQUESTED.search(refusal)
        if requested:
            real = int(requested.group(1) or requested.group(2))
            self._counter.scale = max(self._counter.scale, self._counter.scale * real / estimated)
        return None if stated and requested else estimated

    async def _attempt(
        self, request: GenerationRequest, extra_body: dict[str, Any] | None
    ) -> AsyncGenerator[LlmEvent, None]:
        """One request: its events, or ``LlmError`` (before any event for a refused prompt)."""
        url = endpoint_url(self.base_url, "/chat/completions")
        body = self.payload(request, extra_body)
        response = await self._post(url, body)
        # No limit of the client's: the reply is complete however it stops, at a sentence past
        # hark's default when there is one (else at the backend's own limit, its context).
        complete = request.max_tokens is None
        cap = SentenceCap(self.max_tokens_default) if complete and self.max_tokens_default else None
        finished = False
        try:
            if response.status >= 400:
                raise await self._http_error(response)
            try:
                async for event in self._events(response, complete, cap):
                    yield event
                finished = True
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise LlmError(f"the LLM stream broke: {self._endpoint.scrub(repr(exc))}") from None
        finally:
            # A reply left before the server finished it (the cap ended it, or its reader went
            # away) closes the connection, which tells the server to stop generating.
            if finished and response.content.at_eof():
                response.release()
            else:
                response.close()

    async def _post(self, url: URL, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """POST, retrying connection failures (nothing has been generated yet then)."""
        attempt = 1
        while True:
            try:
                return await self._endpoint.session().post(
                    url, json=body, headers=self._endpoint.headers()
                )
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                if attempt >= self.connect_attempts:
                    raise LlmError(
                        self._endpoint.unreachable(url, exc, after=f" after {attempt} attempts")
                    ) from None
                logger.warning("LLM endpoint %s: %s, retrying", safe_url(url), type(exc).__name__)
                await asyncio.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))
                attempt += 1

    async def _http_error(self, response: aiohttp.ClientResponse) -> LlmError:
        return LlmError(await self._endpoint.http_error(response), status=response.status)

    async def _events(
        self, response: aiohttp.ClientResponse, complete: bool, cap: SentenceCap | None
    ) -> AsyncIterator[LlmEvent]:
        calls: dict[int, _PendingCall] = {}
        reason: str | None = None
        usage: dict[str, Any] = {}
        chunks = 0
        async for chunk in sse_objects(response.content, LlmError, "stream chunk"):
            if "error" in chunk:
                message = error_message(chunk) or "unknown error"
                raise LlmError(f"LLM endpoint reported an error: {self._endpoint.scrub(message)}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                if content := delta.get("content"):
                    chunks += 1
                    text, capped = cap.feed(content) if cap else (content, False)
                    if text:
                        yield TextDelta(text)
                    if capped:
                        # Ended here, before the server's usage chunk: the tokens streamed
                        # (a chunk each, as vLLM and llama.cpp send them) are what is known.
                        yield Finished("stop", completion_tokens=chunks)
                        return
                for piece in delta.get("tool_calls") or []:
                    for event in _tool_call_piece(calls, piece):
                        yield event
                if choice.get("finish_reason"):
                    reason = choice["finish_reason"]
        if reason is None:
            if not chunks and not calls:
                # Not recognised as a refusal (and so not retried): it says nothing for sure.
                raise LlmError(
                    "the LLM stream ended empty, without a finish reason (llama-cpp-python's "
                    "server answers so a prompt past its context: give its size with "
                    "--llm-context-tokens)"
                )
            raise LlmError("the LLM stream ended without a finish reason")
        mapped = _FINISH_REASONS.get(reason, "stop")
        if complete and not calls:
            # No limit was the client's: however the text stopped, the reply is complete.
            if cap is not None and (rest := cap.cut() if mapped == "length" else cap.finish()):
                yield TextDelta(rest)
            mapped = "stop"
        for call in calls.values():
            if call.started and not call.finished:
                if mapped == "length" and not _is_json(call.arguments):
                    continue
                call.finished = True
                yield ToolCallFinished(call.call_id or "", call.arguments)
        if any(c.finished for c in calls.values()) and mapped == "stop":
            mapped = "tool_calls"
        details = usage.get("prompt_tokens_details") or {}
        yield Finished(
            mapped,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )


def _tool_call_piece(calls: dict[int, _PendingCall], piece: dict[str, Any]) -> list[LlmEvent]:
    """Events for one ``delta.tool_calls`` entry; a new index finishes the calls before it."""
    index = int(piece.get("index", len(calls)))
    events: list[LlmEvent] = []
    call = calls.get(index)
    if call is None:
        for earlier in calls.values():
            if earlier.started and not earlier.finished:
                earlier.finished = True
                events.append(ToolCallFinished(earlier.call_id or "", earlier.arguments))
        call = calls[index] = _PendingCall()
    function = piece.get("function") or {}
    arguments = function.get("arguments") or ""
    call.arguments += arguments
    if call.started:
        if arguments:
            events.append(ToolCallArgumentsDelta(call.call_id or "", arguments))
        return events
    call.call_id = call.call_id or piece.get("id") or None
    call.name = call.name or function.get("name") or None
    if call.name:
        # Servers that omit ids still need one for the call's output to refer to.
        call.call_id = call.call_id or "call_" + secrets.token_hex(12)
        call.started = True
        events.append(ToolCallStarted(call.call_id, call.name))
        if call.arguments:
            events.append(ToolCallArgumentsDelta(call.call_id, call.arguments))
    return events


def _max_model_len(body: bytes, model: str) -> int | None:
    """The context size vLLM lists for ``model`` (or the only model) in ``GET /models``."""
    try:
        listed = json.loads(body).get("data") or []
    except (ValueError, AttributeError):
        return None
    cards = [c for c in listed if isinstance(c, dict)]
    card = next((c for c in cards if c.get("id") == model), cards[0] if len(cards) == 1 else None)
    size = card.get("max_model_len") if card else None
    return size if isinstance(size, int) and size > 0 else None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
