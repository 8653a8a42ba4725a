"""Generation: a response's engine work, LLM text → clauses → TTS, overlapped so speech
starts early, and where its results go (one sink protocol).

Each stage has a time limit (:class:`hark.engines.stage_timeouts.StageTimeouts`): an engine
that stalls fails the response with a ``StageTimeoutError`` naming the stage. A response's
results go into the session core as they come (``CoreSink``); a speculative reply's are held
unseen (``HeldSink``) until the response that needs it adopts it, or it is thrown away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from hark.audio.resample import StreamResampler
from hark.driver.engine_work import CoreCall, engine_failed
from hark.driver.timings import ResponseTimings
from hark.engines.llm import (
    Finished,
    LlmEngine,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from hark.engines.llm.truncation import ContextOverflow
from hark.engines.registry import Engines
from hark.engines.stage_timeouts import StageTimeouts, limit, within
from hark.engines.tts import TtsEngine
from hark.session import results
from hark.session.actions import AdoptSpeculation, Generate, Speculate
from hark.session.clauses import ClauseSplitter
from hark.session.core import Session

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUTS = StageTimeouts()
# Clauses a reply may have waiting for speech. A reply is read as fast as the LLM writes it and
# spoken in real time, so a long one queues many; past this the LLM's stream waits for the TTS.
MAX_CLAUSES_WAITING = 256


class GenerationSink(Protocol):
    """Where a response's results go: the session core, or held for a speculative reply."""

    def text(self, delta: str) -> None: ...
    def clause(self, text: str) -> None: ...
    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None: ...
    def tool_started(self, call_id: str, name: str) -> None: ...
    def tool_delta(self, call_id: str, delta: str) -> None: ...
    def tool_finished(self, call_id: str, arguments: str) -> None: ...
    def finished(self, finished: Finished) -> None: ...
    def failed(
        self, message: str, code: str = "engine_error", error_type: str = "server_error"
    ) -> None: ...


async def run_generation(
    action: Generate,
    llm: LlmEngine,
    tts: TtsEngine,
    sink: GenerationSink,
    timeouts: StageTimeouts = _DEFAULT_TIMEOUTS,
) -> None:
    """Run the engines for one response. Engine errors, and ``StageTimeoutError`` for a stage
    that took longer than ``timeouts`` allow, propagate to the caller."""
    clauses: asyncio.Queue[str | None] = asyncio.Queue(MAX_CLAUSES_WAITING)
    speaker = (
        asyncio.create_task(_speak(action, tts, clauses, sink, timeouts.tts_clause))
        if action.audio
        else None
    )
    splitter = ClauseSplitter()
    finished = Finished(reason="stop")
    events = within(
        llm.generate(action.request),
        first_s=timeouts.llm_first_token,
        gap_s=timeouts.llm_token_gap,
        stage="LLM first token",
        gap_stage="LLM next token",
    )
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                # Also for audio replies: the core ignores it there, but it times the LLM.
                sink.text(event.text)
                if speaker is not None:
                    for piece in splitter.push(event.text):
                        sink.clause(piece)
                        await _put(clauses, piece, speaker)
            elif isinstance(event, ToolCallStarted):
                if speaker is not None:
                    # Speak what was said before the call, so the message closes before it.
                    for piece in splitter.flush():
                        sink.clause(piece)
                        await _put(clauses, piece, speaker)
                    await _drained(clauses, speaker)
                sink.tool_started(event.call_id, event.name)
            elif isinstance(event, ToolCallArgumentsDelta):
                sink.tool_delta(event.call_id, event.delta)
            elif isinstance(event, ToolCallFinished):
                sink.tool_finished(event.call_id, event.arguments)
            else:
                finished = event
        if speaker is not None:
            for piece in splitter.flush():
                sink.clause(piece)
                await _put(clauses, piece, speaker)
            await _put(clauses, None, speaker)
            await speaker
        sink.finished(finished)
    finally:
        # The LLM's stream stops here, not whenever the collector gets to it.
        await events.aclose()
        if speaker is not None and not speaker.done():
            speaker.cancel()
            await asyncio.gather(speaker, return_exceptions=True)


async def _put(
    clauses: asyncio.Queue[str | None], piece: str | None, speaker: asyncio.Task[None]
) -> None:
    """Queue ``piece`` for the speaker, waiting while the queue is full; a speaker that failed
    meanwhile raises its error here instead of leaving the reply waiting on it."""
    if not clauses.full():
        clauses.put_nowait(piece)
        return
    put = asyncio.create_task(clauses.put(piece))
    await asyncio.wait({put, speaker}, return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
        await speaker


async def _drained(clauses: asyncio.Queue[str | None], speaker: asyncio.Task[None]) -> None:
    join = asyncio.create_task(clauses.join())
    await asyncio.wait({join, speaker}, return_when=asyncio.FIRST_COMPLETED)
    if speaker.done():
        join.cancel()
        speaker.result()


async def _speak(
    action: Generate,
    tts: TtsEngine,
    clauses: asyncio.Queue[str | None],
    sink: GenerationSink,
    clause_s: float,
) -> None:
    resampler = StreamResampler(tts.sample_rate, action.output_rate)
    loop = asyncio.get_running_loop()
    # The listener's clock: playback starts with the first audio, so the audio made so far
    # less the time since then is what is still queued ahead of the next clause.
    first_audio_at: float | None = None
    produced_s = 0.0
    while (clause := await clauses.get()) is not None:
        transcript = clause
        slack = 0.0
        if first_audio_at is not None:
            slack = max(0.0, produced_s - (loop.time() - first_audio_at))
        # A clause may wait its turn behind others for as long as the audio queued ahead lasts.
        async with limit(clause_s + slack, "TTS clause"):
            async for chunk in tts.synthesize(
                clause.strip(), voice=action.voice, speed=action.speed, slack_s=slack
            ):
                if first_audio_at is None:
                    first_audio_at = loop.time()
                produced_s += len(chunk) / tts.sample_rate
                pcm = resampler.process(chunk)
                if len(pcm) or transcript:
                    sink.audio(pcm.astype(np.int16, copy=False), transcript)
                    transcript = ""
        if transcript:
            # Nothing to voice (punctuation only): keep the transcript whole anyway.
            sink.audio(np.zeros(0, np.int16), transcript)
        clauses.task_done()
    tail = resampler.flush()
    if len(tail):
        sink.audio(tail.astype(np.int16, copy=False), "")


class CoreSink:
    """Forwards one response's results into the session core, marking its stages."""

    __slots__ = ("_call", "_id", "_session", "_timings")

    def __init__(
        self, call: CoreCall, session: Session, timings: ResponseTimings, response_id: str
    ) -> None:
        """``call``: the runner's way into ``session``'s inputs."""
        self._call = call
        self._session = session
        self._timings = timings
        self._id = response_id

    def text(self, delta: str) -> None:
        """A piece of the reply's text."""
        self._timings.mark(self._id, "llm_first_token")
        self._call(self._session.handle, results.TextGenerated(self._id, delta))

    def clause(self, text: str) -> None:
        """A clause of the reply went to the TTS."""
        self._timings.mark(self._id, "llm_first_token")
        self._timings.mark(self._id, "first_clause")

    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None:
        """A piece of the reply's audio, with the words that begin in it."""
        if len(pcm):
            self._timings.mark(self._id, "tts_first_audio")
        self._call(self._session.handle, results.AudioGenerated(self._id, pcm, transcript))

    def tool_started(self, call_id: str, name: str) -> None:
        """The reply began a function call."""
        self._timings.mark(self._id, "llm_first_token")
        self._call(self._session.handle, results.ToolCallStarted(self._id, call_id, name))

    def tool_delta(self, call_id: str, delta: str) -> None:
        """A piece of a function call's arguments."""
        self._call(self._session.handle, results.ToolCallDelta(self._id, call_id, delta))

    def tool_finished(self, call_id: str, arguments: str) -> None:
        """A function call's arguments are whole."""
        self._call(self._session.handle, results.ToolCallFinished(self._id, call_id, arguments))

    def finished(self, finished: Finished) -> None:
        """The reply is complete."""
        self._call(self._session.handle, results.GenerationFinished(self._id, finished))

    def failed(
        self, message: str, code: str = "engine_error", error_type: str = "server_error"
    ) -> None:
        """The reply failed; the client is told ``message``."""
        self._call(
            self._session.handle, results.GenerationFailed(self._id, message, code, error_type)
        )


class HeldSink:
    """A speculative reply's results, held unseen until the reply is adopted."""

    def __init__(self, now: Callable[[], float]) -> None:
        """``now``: the monotonic clock the stages are marked on."""
        self._now = now
        self.started = now()
        self.marks: dict[str, float] = {}
        self._held: list[tuple[str, tuple[Any, ...]]] = []
        self._live: GenerationSink | None = None

    def adopt(self, live: GenerationSink) -> None:
        """Hand everything held to the real response, then forward live."""
        self._live = live
        held, self._held = self._held, []
        for name, args in _joined_audio(held):
            getattr(live, name)(*args)

    def _pass(self, name: str, *args: Any) -> None:
        if self._live is not None:
            getattr(self._live, name)(*args)
        else:
            self._held.append((name, args))

    def _mark(self, stage: str) -> None:
        if self._live is None:
            self.marks.setdefault(stage, self._now())

    def text(self, delta: str) -> None:
        """A piece of the reply's text."""
        self._mark("llm_first_token")
        self._pass("text", delta)

    def clause(self, text: str) -> None:
        """A clause of the reply went to the TTS."""
        self._mark("llm_first_token")
        self._mark("first_clause")
        self._pass("clause", text)

    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None:
        """A piece of the reply's audio, with the words that begin in it."""
        if len(pcm):
            self._mark("tts_first_audio")
        self._pass("audio", pcm, transcript)

    def tool_started(self, call_id: str, name: str) -> None:
        """The reply began a function call."""
        self._mark("llm_first_token")
        self._pass("tool_started", call_id, name)

    def tool_delta(self, call_id: str, delta: str) -> None:
        """A piece of a function call's arguments."""
        self._pass("tool_delta", call_id, delta)

    def tool_finished(self, call_id: str, arguments: str) -> None:
        """A function call's arguments are whole."""
        self._pass("tool_finished", call_id, arguments)

    def finished(self, finished: Finished) -> None:
        """The reply is complete."""
        self._pass("finished", finished)

    def failed(
        self, message: str, code: str = "engine_error", error_type: str = "server_error"
    ) -> None:
        """The reply failed; the client is told ``message``."""
        self._pass("failed", message, code, error_type)


def _joined_audio(held: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, tuple[Any, ...]]]:
    """``held`` with each clause's audio as one piece: the chunks after a clause's first carry
    no transcript, so the joined audio speaks the same words from the same sample. A reply
    held until the turn ends is two to three seconds in 100 ms chunks, each of which would
    be an input of the core, an event and a write (a tenth of the event loop's time at 150
    callers)."""
    joined: list[tuple[str, tuple[Any, ...]]] = []
    run: list[npt.NDArray[np.int16]] = []
    for name, args in held:
        if name == "audio" and not args[1] and run:
            run.append(args[0])
            continue
        if len(run) > 1:
            joined[-1] = ("audio", (np.concatenate(run), joined[-1][1][1]))
        run = [args[0]] if name == "audio" else []
        joined.append((name, args))
    if len(run) > 1:
        joined[-1] = ("audio", (np.concatenate(run), joined[-1][1][1]))
    return joined


@dataclasses.dataclass(slots=True)
class _Speculation:
    key: str
    generate: Generate
    sink: HeldSink
    task: asyncio.Task[None]


class Generations:
    """One session's responses being generated, and its one speculative reply."""

    def __init__(
        self,
        engines: Engines,
        session: Session,
        timings: ResponseTimings,
        now: Callable[[], float],
    ) -> None:
        """``now``: the monotonic clock of ``timings``."""
        self._engines = engines
        self._session = session
        self._timings = timings
        self._now = now
        self._running: dict[str, asyncio.Task[None]] = {}
        self._speculation: _Speculation | None = None

    @property
    def running(self) -> int:
        """Responses being generated now."""
        return len(self._running)

    def stop(self) -> list[asyncio.Task[None]]:
        """Cancel every generation, the speculative one too, and forget them: the tasks, for
        the caller to wait for."""
        tasks = list(self._running.values())
        if self._speculation is not None:
            tasks.append(self._speculation.task)
        for task in tasks:
            task.cancel()
        self._running.clear()
        self._speculation = None
        return tasks

    def generate(self, action: Generate, call: CoreCall) -> None:
        """Generate a response, its results going into the core through ``call``."""
        self._timings.mark(action.response_id, "transcript")
        sink = CoreSink(call, self._session, self._timings, action.response_id)
        self._running[action.response_id] = asyncio.create_task(
            self._run(action, sink), name=f"gen {action.response_id}"
        )

    def cancel(self, response_id: str) -> None:
        """Stop a response's generation, if it still runs."""
        running = self._running.pop(response_id, None)
        if running is not None:
            running.cancel()

    def speculate(self, action: Speculate) -> None:
        """Start a speculative reply, held unseen, in place of any other."""
        self._discard()
        # A shared LLM serves the replies people wait for first.
        action.generate.request.urgency.speculative = True
        sink = HeldSink(self._now)
        task = asyncio.create_task(self._run(action.generate, sink), name=f"speculate {action.key}")
        self._speculation = _Speculation(action.key, action.generate, sink, task)

    def discard(self, key: str) -> None:
        """Throw away the speculative reply ``key``, if it is the one running."""
        if self._speculation is not None and self._speculation.key == key:
            self._discard()

    def _discard(self) -> None:
        speculation, self._speculation = self._speculation, None
        if speculation is not None:
            speculation.task.cancel()

    def adopt(self, action: AdoptSpeculation, call: CoreCall) -> None:
        """Make the speculative reply a response: what it holds goes into the core."""
        speculation = self._speculation
        if speculation is None or speculation.key != action.key:
            # The core keeps one speculation and names it: only a bug gets here.
            log.error("session %s: no speculation %s to adopt", self._session.id, action.key)
            call(
                self._session.handle, results.GenerationFailed(action.response_id, "internal error")
            )
            return
        self._speculation = None
        speculation.generate.request.urgency.speculative = False
        self._timings.adopt(action.response_id, speculation.sink.started, speculation.sink.marks)
        if not speculation.task.done():
            self._running[action.response_id] = speculation.task
        # After the events already drained (response.created) have been queued.
        asyncio.get_running_loop().call_soon(
            speculation.sink.adopt,
            CoreSink(call, self._session, self._timings, action.response_id),
        )

    async def _run(self, action: Generate, sink: GenerationSink) -> None:
        engines = self._engines
        try:
            await run_generation(action, engines.llm, engines.tts, sink, engines.timeouts)
        except asyncio.CancelledError:
            raise
        except ContextOverflow as exc:
            # The client's doing (truncation disabled, instructions too long), not a fault.
            log.info("session %s: a response failed: %s", self._session.id, exc)
            sink.failed(str(exc), "context_length_exceeded", "invalid_request_error")
        except Exception as exc:
            sink.failed(engine_failed(self._session.id, f"response {action.response_id}", exc))
        finally:
            # A response's next round (after MCP calls) may run under the same id already.
            running = self._running.get(action.response_id)
            if action.response_id and running is asyncio.current_task():
                del self._running[action.response_id]
