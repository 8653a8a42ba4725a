"""One response's engine work: LLM text → clauses → TTS, overlapped so speech starts early.

Each stage has a time limit (:class:`hark.engines.stage_timeouts.StageTimeouts`): an engine
that stalls fails the response with a ``StageTimeoutError`` naming the stage.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hark.audio.resample import StreamResampler
from hark.engines.llm import (
    Finished,
    LlmEngine,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from hark.engines.stage_timeouts import StageTimeouts, limit, within
from hark.engines.tts import TtsEngine
from hark.session.actions import Generate
from hark.session.clauses import ClauseSplitter

_DEFAULT_TIMEOUTS = StageTimeouts()
# Clauses a reply may have waiting for speech. A reply is read as fast as the LLM writes it and
# spoken in real time, so a long one queues many; past this the LLM's stream waits for the TTS.
MAX_CLAUSES_WAITING = 256


class GenerationSink(Protocol):
    """Where a response's results go (the runner forwards them to the session core)."""

    def text(self, delta: str) -> None: ...
    def clause(self, text: str) -> None: ...
    def audio(self, pcm: npt.NDArray[np.int16], transcript: str) -> None: ...
    def tool_started(self, call_id: str, name: str) -> None: ...
    def tool_delta(self, call_id: str, delta: str) -> None: ...
    def tool_finished(self, call_id: str, arguments: str) -> None: ...
    def finished(self, finished: Finished) -> None: ...


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
