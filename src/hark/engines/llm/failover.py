"""Several OpenAI-compatible LLM backends behind one engine, with health checks and failover.

Each backend is checked (``GET {base}/models``, a short timeout) at warm-up and then in the
background. A backend that fails (unreachable, HTTP 5xx, 408 or 429, a broken stream, a failed
check) is taken out for a back-off that doubles with each failure in a row, up to a cap; the
background check lets it back in once it answers again. A request goes to the healthy backend
with the fewest requests in flight (ties in turn), then to backends in an unknown state (not
checked yet, or out of their back-off but not re-checked), and fails when none is left.

A response whose backend fails before any text is sent again to the next backend. One that
fails while streaming text continues on the next backend from where it stopped, and the
listener never hears the same words twice (see :class:`RepeatFilter` and
:func:`continuation`). A response that had started a tool call fails instead: the client has
already seen the call's id and part of its arguments, and no chat-completions server can
resume a half-written call (an assistant message cannot be prefilled with partial
``tool_calls``), while a call made over again would carry another id and perhaps other
arguments.

A backend that accepts a request and then stalls (no first token, or no next one) counts as
failed once it has waited ``stall_s``, and the response moves on as above: the stage limits
of :mod:`hark.engines.stage_timeouts` measure the whole engine, so they would fail the
response instead. The server gives each backend the stage's limit divided among the
backends, so that every one of them can be tried within it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict, Unpack

from hark.engines import EngineMetrics
from hark.engines.llm import (
    ChatMessage,
    Finished,
    GenerationRequest,
    LlmEvent,
    TextDelta,
    shared_prefix,
)
from hark.engines.llm.openai_compatible import LlmError, OpenAICompatibleLlm
from hark.engines.stage_timeouts import StageTimeoutError, within

logger = logging.getLogger(__name__)

BackendState = Literal["healthy", "unknown", "unhealthy"]
BACKEND_STATES: tuple[BackendState, ...] = ("healthy", "unknown", "unhealthy")

HEALTH_INTERVAL_S = 5.0
HEALTH_TIMEOUT_S = 2.0
BACKOFF_S = 1.0
BACKOFF_MAX_S = 60.0
# A resumed stream whose start matches the emitted text for fewer characters than this before
# it parts from it is taken for a true continuation that happens to begin alike.
MIN_REPEAT_CHARS = 8
# HTTP statuses that say the backend, not the request, is at fault.
_BACKEND_STATUSES = frozenset({408, 429})

# How the next backend is asked to go on with a reply another backend left half-written: the
# conversation ends with the partial reply as an assistant message, plus the two fields that
# make vLLM and SGLang render it as the open last turn instead of closing it and opening a new
# one (vLLM rejects continue_final_message with add_generation_prompt left true). llama.cpp's
# own server (llama-server) continues a trailing assistant message by default ("assistant
# prefill") and ignores the fields; it refuses a prefill while a template's thinking mode is
# on, hence enable_thinking off, which templates without that switch ignore (as does vLLM).
# Servers that know none of this (llama-cpp-python's server, for one) close the partial
# message and answer again; a greedy or low-temperature model then starts over with the same
# words, which RepeatFilter drops. An instruction to "continue" instead would be followed by
# the large models that can already continue and ignored by the small ones that cannot.
CONTINUE_FIELDS: dict[str, Any] = {
    "continue_final_message": True,
    "add_generation_prompt": False,
    "chat_template_kwargs": {"enable_thinking": False},
}


class BackendObserver(Protocol):
    """Told what happens to each backend; ``backend`` is its URL without credentials."""

    def request(self, backend: str) -> None:
        """A generation request was sent to ``backend``."""
        ...

    def failure(self, backend: str) -> None:
        """A request to ``backend`` failed (before or during its stream)."""
        ...

    def failover(self, backend: str) -> None:
        """A response left ``backend`` after it failed, for another backend."""
        ...

    def state(self, backend: str, state: BackendState) -> None:
        """``backend`` is now in ``state``."""
        ...


def continuation(
    request: GenerationRequest, emitted: str
) -> tuple[GenerationRequest, dict[str, Any] | None]:
    """The request (and extra body fields) that resumes a reply after ``emitted``."""
    if not emitted:
        return request, None
    messages = (*request.messages, ChatMessage("assistant", emitted))
    return dataclasses.replace(request, messages=messages), dict(CONTINUE_FIELDS)


class RepeatFilter:
    """Drops the start of a resumed stream that repeats text the listener already has.

    A server that continues the partial reply streams new text at once; one that starts the
    reply over streams ``emitted`` again first. While the new text still matches the start of
    ``emitted`` it is held back; once it covers all of ``emitted`` only what follows is passed
    on; if it parts from ``emitted`` after at least ``MIN_REPEAT_CHARS`` the matching part is
    dropped (a sampled restart that took another turn: the join may read awkwardly, but
    nothing is said twice); before that, the held text was the continuation's own.
    """

    def __init__(self, emitted: str) -> None:
        self._emitted = emitted
        self._held = ""
        self._deciding = bool(emitted)

    def push(self, text: str) -> str:
        """The part of ``text`` to pass on (possibly with text held back before)."""
        if not self._deciding:
            return text
        self._held += text
        if self._emitted.startswith(self._held):
            return ""
        self._deciding = False
        held, self._held = self._held, ""
        if held.startswith(self._emitted):
            return held[len(self._emitted) :]
        common = shared_prefix(held, self._emitted)
        return held[common:] if common >= MIN_REPEAT_CHARS else held

    def flush(self) -> str:
        """The text still held when the stream stops streaming text: a repeat is dropped."""
        if not self._deciding:
            return ""
        self._deciding = False
        held, self._held = self._held, ""
        return "" if len(held) >= MIN_REPEAT_CHARS else held


@dataclass(eq=False, slots=True)
class _Backend:
    engine: OpenAICompatibleLlm
    index: int
    label: str
    state: BackendState = "unknown"
    in_flight: int = 0
    # Failures since the last success; each doubles the back-off.
    failures_in_row: int = 0
    # Event-loop time before which the backend gets no requests (while unhealthy).
    retry_at: float = 0.0
    next_check_at: float = 0.0


class FailoverOptions(TypedDict, total=False):
    """The constructor's options after ``backends``, which ``FailoverLlm.for_urls`` passes on."""

    health_interval_s: float
    health_timeout_s: float
    backoff_s: float
    backoff_max_s: float
    stall_s: tuple[float, float] | None


class FailoverLlm:
    """An ``LlmEngine`` over several ``OpenAICompatibleLlm`` backends (see the module).

    ``health_interval_s``: how often a backend in service is checked; ``health_timeout_s``:
    how long a check may take; a failed backend stays out ``backoff_s``, doubling with each
    failure in a row up to ``backoff_max_s``. Build the backends with ``connect_attempts=1``
    so that a dead one hands over at once (:meth:`for_urls` does). ``stall_s``: how long a
    backend may take to its first output and between two outputs (seconds) before it counts
    as failed; ``None``: as long as it likes. Call :meth:`aclose` when done.
    """

    # Its backends send images as they do (``OpenAICompatibleLlm.takes_images``).
    takes_images = True

    def __init__(
        self,
        backends: Sequence[OpenAICompatibleLlm],
        *,
        health_interval_s: float = HEALTH_INTERVAL_S,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        backoff_s: float = BACKOFF_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        stall_s: tuple[float, float] | None = None,
    ) -> None:
        if not backends:
            raise ValueError("FailoverLlm needs at least one backend")
        self._backends = [
            _Backend(engine, index, engine.safe_base_url) for index, engine in enumerate(backends)
        ]
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.stall_s = stall_s
        self._observer: BackendObserver | None = None
        self._next = 0
        self._wake = asyncio.Event()
        self._health_task: asyncio.Task[None] | None = None

    @classmethod
    def for_urls(
        cls,
        urls: Sequence[str],
        model: str,
        api_key: str | None = None,
        *,
        context_tokens: int | None = None,
        **options: Unpack[FailoverOptions],
    ) -> FailoverLlm:
        """One backend per URL, all serving ``model`` with ``api_key`` (and a context of
        ``context_tokens``, when known); ``options`` as for the constructor."""
        backends = [
            OpenAICompatibleLlm(
                url, model, api_key=api_key, connect_attempts=1, context_tokens=context_tokens
            )
            for url in urls
        ]
        return cls(backends, **options)

    def __repr__(self) -> str:
        return f"FailoverLlm({[b.label for b in self._backends]!r})"

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends' URLs, without credentials, in the order given."""
        return tuple(b.label for b in self._backends)

    def observe(self, metrics: EngineMetrics) -> None:
        """Report every backend's requests, failures, failovers and state to ``metrics``'s LLM
        backend observer, from now on; it is told every backend's state at once."""
        observer = metrics.llm_backend_observer()
        self._observer = observer
        for backend in self._backends:
            observer.state(backend.label, backend.state)

    def state(self, backend: str) -> BackendState:
        """The state of the backend whose URL (without credentials) is ``backend``."""
        for b in self._backends:
            if b.label == backend:
                return b.state
        raise KeyError(backend)

    async def warmup(self) -> None:
        """Check every backend and start the background checks. Raises ``LlmError`` when no
        backend answers (the others are retried later)."""
        await asyncio.gather(*(self._check(b) for b in self._backends))
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._health_loop(), name="llm-health")
        if not any(b.state == "healthy" for b in self._backends):
            raise LlmError(f"none of the LLM backends answers: {', '.join(self.backends)}")

    async def aclose(self) -> None:
        """Stop the background checks and close every backend's connections."""
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None
        for backend in self._backends:
            await backend.engine.aclose()

    async def prefill(self, request: GenerationRequest) -> None:
        """Nothing to do: the servers cache shared prompt prefixes themselves."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[LlmEvent, None]:
        """Stream the reply from one backend after another until one finishes it.

        Raises ``LlmError`` when every backend that may be tried has failed or refused the
        request, or when a backend failed while a tool call was being streamed.
        """
        tried: set[_Backend] = set()
        emitted = ""
        tool_call_seen = False
        failed: _Backend | None = None
        errors: list[str] = []
        while True:
            backend = self._pick(tried)
            if backend is None:
                raise LlmError(
                    f"no LLM backend could serve the response ({len(tried)} of "
                    f"{len(self._backends)} tried): " + "; ".join(errors or ["none available"])
                )
            if failed is not None:
                self._notify("failover", failed)
                logger.warning(
                    "LLM response moves from %s to %s after %d characters",
                    failed.label,
                    backend.label,
                    len(emitted),
                )
            tried.add(backend)
            attempt, extra_body = continuation(request, emitted)
            repeats = RepeatFilter(emitted)
            backend.in_flight += 1
            self._notify("request", backend)
            try:
                async with contextlib.aclosing(self._stream(backend, attempt, extra_body)) as it:
                    async for event in it:
                        if isinstance(event, TextDelta):
                            text = repeats.push(event.text)
                        else:
                            text = repeats.flush()
                        if text:
                            emitted += text
                            yield TextDelta(text)
                        if isinstance(event, Finished):
                            self._succeeded(backend)
                            yield event
                            return
                        if not isinstance(event, TextDelta):
                            tool_call_seen = True
                            yield event
                    raise LlmError("the LLM stream ended without a finish")
            except (LlmError, StageTimeoutError) as exc:
                if isinstance(exc, StageTimeoutError):
                    exc = LlmError(f"the LLM backend {backend.label} stalled: {exc}")
                self._failed(backend, exc)
                if tool_call_seen:
                    raise LlmError(
                        f"the LLM backend {backend.label} failed during a tool call, which "
                        f"cannot be resumed on another backend: {exc}"
                    ) from None
                errors.append(str(exc))
                failed = backend
            finally:
                backend.in_flight -= 1

    def _stream(
        self, backend: _Backend, request: GenerationRequest, extra_body: dict[str, Any] | None
    ) -> AsyncGenerator[LlmEvent, None]:
        """``backend``'s events for ``request``, failing with ``StageTimeoutError`` when it
        stalls past ``stall_s``."""
        events = backend.engine.generate(request, extra_body)
        if self.stall_s is None:
            return events
        first_s, gap_s = self.stall_s
        return within(
            events,
            first_s=first_s,
            gap_s=gap_s,
            stage="LLM backend first token",
            gap_stage="LLM backend next token",
        )

    def _pick(self, tried: set[_Backend]) -> _Backend | None:
        """The healthy backend with the fewest requests in flight (ties in turn), else the
        least busy one in an unknown state; ``None`` when none is left."""
        now = asyncio.get_running_loop().time()
        n = len(self._backends)
        candidates = [b for b in self._backends if b not in tried]

        def rank(b: _Backend) -> tuple[int, int, int]:
            in_service = b.state == "healthy"
            return (0 if in_service else 1, b.in_flight, (b.index - self._next) % n)

        usable = [b for b in candidates if b.state != "unhealthy" or b.retry_at <= now]
        if not usable:
            return None
        chosen = min(usable, key=rank)
        self._next = (chosen.index + 1) % n
        return chosen

    def _succeeded(self, backend: _Backend) -> None:
        backend.failures_in_row = 0
        if backend.state != "healthy":
            self._set_state(backend, "healthy")
            backend.next_check_at = self._now() + self.health_interval_s

    def _failed(self, backend: _Backend, error: LlmError) -> None:
        self._notify("failure", backend)
        if (
            error.status is not None
            and error.status < 500
            and error.status not in (_BACKEND_STATUSES)
        ):
            # The request was refused, not the backend broken: it stays in service.
            return
        self._take_out(backend, str(error))

    def _take_out(self, backend: _Backend, reason: str) -> None:
        backend.failures_in_row += 1
        backoff = min(self.backoff_s * 2 ** (backend.failures_in_row - 1), self.backoff_max_s)
        backend.retry_at = backend.next_check_at = self._now() + backoff
        if backend.state != "unhealthy":
            logger.warning("LLM backend %s is out for %.1f s: %s", backend.label, backoff, reason)
        self._set_state(backend, "unhealthy")
        self._wake.set()

    async def _check(self, backend: _Backend) -> None:
        try:
            await backend.engine.check(self.health_timeout_s)
        except LlmError as exc:
            self._take_out(backend, str(exc))
            return
        if backend.state != "healthy":
            logger.info("LLM backend %s is in service", backend.label)
            self._set_state(backend, "healthy")
        backend.next_check_at = self._now() + self.health_interval_s

    async def _health_loop(self) -> None:
        while True:
            now = self._now()
            due = [b for b in self._backends if b.next_check_at <= now]
            for backend in [b for b in due if b.state == "healthy" and b.in_flight]:
                # A backend streaming a reply shows it is alive; and a probe could cut the
                # reply short: llama-cpp-python's server ends a stream (with [DONE] but no
                # finish reason) whenever another request, GET /models too, comes in.
                backend.next_check_at = now + self.health_interval_s
                due.remove(backend)
            if due:
                await asyncio.gather(*(self._check(b) for b in due))
                continue
            self._wake.clear()
            wait = min(b.next_check_at for b in self._backends) - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _set_state(self, backend: _Backend, state: BackendState) -> None:
        backend.state = state
        if self._observer is not None:
            self._observer.state(backend.label, state)

    def _notify(self, what: Literal["request", "failure", "failover"], backend: _Backend) -> None:
        if self._observer is not None:
            getattr(self._observer, what)(backend.label)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()
